"""tables/claims.json describes itself: its JSON Schema ships beside it
(tables/claims.schema.json), every property described; the document names the schema,
its version, the papers and its provenance; old field names fail; metrics/claims.json
gives DVC one number per claim."""

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from report_data import claim_row, claims_json, estimate

from loopscope.base import paths
from loopscope.judge import claims
from loopscope.judge.verdicts import Comparison, claim, effect
from loopscope.stats.intervals import Interval

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_FILE = ROOT / paths.CLAIMS.parent / claims.SCHEMA
SCHEMA = json.loads(SCHEMA_FILE.read_text())


def record(**fields) -> dict:
    """A row as the library records it (Claim.record), with the fields the stage adds."""
    found = claim("text", "paper", "criterion", "value",
                  [Comparison("a", Interval(1.0, 0.5, 1.5, 40), effect, (1,), unit="nats")],
                  key="drift", source="Table 1").record()
    return {**found, "id": "A.drift.ours", "paper": "A", "group": "ours",
            "robustness": {"mark": "robust", "swept": {}, "turns": []}, **fields}


def document(rows: list[dict]) -> dict:
    """A whole tables/claims.json around paper A's rows, as they are (counts of none)."""
    return {**claims_json([]), "paper_a": rows}


def test_the_schema_ships_beside_the_data_and_names_the_version_the_stage_writes():
    assert SCHEMA_FILE.parent == ROOT / "tables"
    assert SCHEMA["properties"]["$schema"]["const"] == claims.SCHEMA
    assert SCHEMA["properties"]["schema_version"]["const"] == claims.SCHEMA_VERSION
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_the_schema_is_a_plain_git_file_no_stage_writes():
    """DVC must not clobber it: no stage lists it (or a folder above it) as an output, and
    no .gitignore in tables/ hides it."""
    import yaml
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    outs = {str(next(iter(o)) if isinstance(o, dict) else o)
            for s in stages.values() for key in ("outs", "metrics", "plots")
            for o in s.get("do", s).get(key, [])}
    rel = str(paths.CLAIMS.parent / claims.SCHEMA)
    assert not {o for o in outs if rel == o or rel.startswith(o.rstrip("/") + "/")}
    ignored = subprocess.run(["git", "check-ignore", "-q", rel], cwd=ROOT)
    assert ignored.returncode == 1, f"{rel} is git-ignored"


def test_a_constructed_document_and_a_library_record_validate():
    jsonschema.validate(claims_json([claim_row("drift"), record()]), SCHEMA)
    with_magnitude = claim_row("drift", magnitude="holds",
                               magnitude_estimate=estimate(500.0, 400.0, 600.0, (469.9, None),
                                                           unit="ratio", paper=539.0))
    jsonschema.validate(claims_json([with_magnitude]), SCHEMA)


@pytest.mark.parametrize("bad", [
    {"verdict": "maybe"}, {"direction": "maybe"}, {"id": "drift"}, {"kind": "finding?"},
    {"estimate": {**estimate(), "level": 1.5}}, {"estimate": {**estimate(), "band": [0.0]}},
])
def test_the_schema_rejects_a_malformed_row(bad):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document([record(**bad)]), SCHEMA)
    without = {k: v for k, v in record().items() if k != "verdict"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document([without]), SCHEMA)


def test_old_names_fail():
    """Schema version 1's names: a row's `headline` (the counted verdict, now `verdict`),
    an estimate's `units` (now `resampling_units`, apart from the statistic's `unit`),
    a seed's `headline`; and a document without its version or provenance."""
    old = [record(headline="holds"),
           record(estimate={**estimate(), "units": 40}),
           record(seeds={"rule": "r", "cells": ["a"], "each": [{"headline": "holds"}]})]
    for row in old:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(document([row]), SCHEMA)
    for key in ("schema_version", "provenance", "$schema"):
        found = claims_json([record()])
        del found[key]
        with pytest.raises(jsonschema.ValidationError, match=re.escape(key)):
            jsonschema.validate(found, SCHEMA)


def undescribed(schema: dict, where: str = "") -> list[str]:
    """Every property (and definition) of a schema without a description, by path."""
    found = []
    if isinstance(schema, dict):
        for key in ("properties", "$defs"):
            for name, sub in schema.get(key, {}).items():
                if isinstance(sub, dict) and not sub.get("description"):
                    found.append(f"{where}/{key}/{name}")
        for key, sub in schema.items():
            found += undescribed(sub, f"{where}/{key}")
    elif isinstance(schema, list):
        for i, sub in enumerate(schema):
            found += undescribed(sub, f"{where}/{i}")
    return found


def test_every_property_of_the_schema_is_described():
    assert undescribed(SCHEMA) == []


def test_the_description_check_fails_on_a_bare_property():
    bare = json.loads(json.dumps(SCHEMA))
    del bare["$defs"]["row"]["properties"]["source"]["description"]
    assert undescribed(bare) == ["/$defs/row/properties/source"]


def test_metrics_give_each_claim_a_number_and_keys_no_spaces():
    rows = [claim_row("drift"), claim_row("tail", "contradicted"),
            claim_row("clamp", "inconclusive"), claim_row("absent", "not shown", estimate=None),
            claim_row("other", "holds", kind="extension")]
    found = claims_json(rows, [claim_row("flat", "holds", paper="B", group="backbone")])
    metrics = claims.metrics(found)
    assert metrics["paper_a"] == {"holds": 1, "contradicted": 1, "inconclusive": 1,
                                  "not_shown": 1}
    assert metrics["verdict"] == {"A.drift.ours": 1, "A.tail.ours": -1, "A.clamp.ours": 0,
                                  "A.other.ours": 1, "B.flat.backbone": 1}

    def keys(node):
        return [k for k, v in node.items() for k in [k, *keys(v)]] if isinstance(node, dict) else []
    assert not [k for k in keys(metrics) if " " in k]


def readme_validation() -> str:
    """README's one-line program that validates tables/claims.json with the schema alone."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"`(python -c '[^`]*jsonschema[^`]*')`", readme)
    assert found, "README shows no `python -c '... jsonschema ...'` command"
    return found.group(1)


def test_readmes_program_validates_with_the_schema_alone(tmp_path):
    """The command README gives, run where only the data and its schema are."""
    (tmp_path / "tables").mkdir()
    shutil.copy(SCHEMA_FILE, tmp_path / "tables")
    good = tmp_path / "tables" / "claims.json"
    good.write_text(json.dumps(claims_json([record()])))
    argv = [sys.executable, *shlex.split(readme_validation())[1:]]
    assert subprocess.run(argv, cwd=tmp_path, capture_output=True).returncode == 0
    good.write_text(json.dumps(document([record(headline="holds")])))
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode != 0 and "ValidationError" in out.stderr


@pytest.mark.committed
def test_the_committed_claims_table_validates_against_its_schema():
    """tables/claims.json of the committed run, validated as README's program does: with
    the schema its `$schema` names, beside it."""
    found = json.loads((ROOT / paths.CLAIMS).read_text())
    jsonschema.validate(found, json.loads((ROOT / "tables" / found["$schema"]).read_text()))
    ids = [r["id"] for p in ("paper_a", "paper_b", "mechanism_checks") for r in found[p]]
    assert len(ids) == len(set(ids)), "row ids must be unique"


@pytest.mark.committed
def test_the_committed_metrics_are_the_committed_claims():
    found = json.loads((ROOT / paths.CLAIMS).read_text())
    assert json.loads((ROOT / paths.CLAIM_COUNTS).read_text()) == claims.metrics(found)


def test_a_field_the_schema_does_not_describe_fails():
    """Every field a row or the document carries is declared, so it has a description:
    a new one fails until the schema describes it."""
    with pytest.raises(jsonschema.ValidationError, match="'undescribed' was unexpected"):
        jsonschema.validate(document([record(undescribed=1)]), SCHEMA)
    with pytest.raises(jsonschema.ValidationError, match="'undescribed' was unexpected"):
        jsonschema.validate({**claims_json([record()]), "undescribed": 1}, SCHEMA)


@pytest.mark.committed
def test_every_counted_row_of_the_committed_table_reads_one_statistic():
    """The rule of the counted rows on the committed run: each judged finding reads one
    statistic, the paper's, and each extension names the finding it refines."""
    found = json.loads((ROOT / paths.CLAIMS).read_text())
    assert claims.audit(found) == []
    extends = {r["extends"] for p in ("paper_a", "paper_b") for r in found[p]
               if r["kind"] == "extension"}
    assert {"A.drift.ours", "A.clamp.ours", "B.state_decay.backbone",
            "B.a1_fewer_loops.backbone"} <= extends


def test_the_audit_fails_on_a_planted_two_statistic_row_and_an_orphan_extension():
    finding = claim_row("drift", reads=["drift ratio"])
    two = claim_row("heavy_tail", reads=["share above 10x median", "drift ratio"])
    doc = claims_json([finding, two])
    assert [p.split(":")[0] for p in claims.audit(doc)] == ["A.heavy_tail.ours"]
    assert "reads 2 statistics" in claims.audit(doc)[0]
    # one statistic over several cells is one; a row not shown reads none and passes
    ok = claims_json([finding, claim_row("k_invariance", "not shown", reads=[])])
    assert claims.audit(ok) == []
    # nor does one inconclusive with nothing measured (no A1 setting at low depth, say)
    empty = claims_json([finding, claim_row("k_invariance", "inconclusive", reads=[])])
    assert claims.audit(empty) == []
    orphan = claim_row("clamp_other", kind="extension", reads=["a", "b"])
    assert claims.audit(claims_json([finding, orphan])) == [
        "A.clamp_other.ours: an extension of no finding (extends None)"]
    aimed = claim_row("clamp_other", kind="extension", reads=["a", "b"],
                      extends="A.drift.ours")
    assert claims.audit(claims_json([finding, aimed])) == []  # an extension may read two
