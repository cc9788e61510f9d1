"""The claims stage's library: both papers' claims judged on this run's outputs, as data.

Reads configs/, the diagnose, sweep and clamp tables and the metrics of the measuring
stages, hands them to paper A's claims (loopscope.judge.paper_a) and paper B's
(loopscope.judge.paper_b), and returns tables/claims.json (paths.CLAIMS). The document
describes itself: `$schema` names its JSON Schema, tables/claims.schema.json beside it
(SCHEMA, every property described), and `schema_version` its version (SCHEMA_VERSION);
`papers` names the two papers; `provenance` says what it was computed from (the stage
records it: loopscope.base.provenance). Then each row, a record with a stable id; the
verdict counts of each paper's findings; the criteria's parameters with their sources
and ranges; the family-wise and seed rules; the cells' taxonomy and the scale of the
run against the papers'. `metrics` gives metrics/claims.json: the counts and one number
per claim, so `dvc exp show` and `dvc metrics diff` name the claim that turned. Only the
claims stage and the reports import the judges; rewording a claim reruns no measurement.
"""

from __future__ import annotations

from typing import Any

from loopscope.base import paths
from loopscope.base.outputs import read_json, read_metrics, read_table
from loopscope.judge import criteria, settling
from loopscope.judge.backbone import mark_sigma, recipe_deviation
from loopscope.judge.cells import (
    cell_group,
    control,
    facts,
    mark_recipes,
    paper_b_backbones,
    paper_condition,
    recipe,
    training_precision,
)
from loopscope.judge.criteria import Criteria
from loopscope.judge.experiments import cells_digest, criteria_digest
from loopscope.judge.group_a import CellA
from loopscope.judge.outside import outside_records
from loopscope.judge.paper_a import init_effect, paper_a_claims
from loopscope.judge.paper_b import paper_b_claims
from loopscope.judge.verdicts import FAMILY_RULE, SEED_RULE, Claim
from loopscope.weights.config import CellConfig, load_cell

VERDICTS = ("holds", "contradicted", "inconclusive", "not shown")
# The JSON Schema of tables/claims.json, beside it, and the version of the shape it
# describes: a reader's program checks the version before it reads a field.
SCHEMA = "claims.schema.json"
SCHEMA_VERSION = 3
# The two papers, by title; `topic` is how the reports and the front page call each.
PAPERS = {
    "paper_a": {"title": "Dense supervision is not enough: the readout blind spot in "
                         "looped language models", "topic": "the readout blind spot"},
    "paper_b": {"title": "Per-Token Fixed-Point Convergence in Depth-Recurrent Transformers",
                "topic": "per-token fixed-point convergence"},
}
# A claim's verdict as a number for metrics/claims.json (a row not shown is left out)
VERDICT_NUMBERS = {"holds": 1, "inconclusive": 0, "contradicted": -1}
# What the papers measured on, against this run (their summaries: docs/results.md shows
# both side by side)
PAPER_SCALE = {
    "paper_a": {"parameters": "44M and 129M", "corpus": "WikiText-103 (~103M tokens)",
                "training": "4 epochs (~400M tokens per run)", "seeds": "3 (42, 101, 202)"},
    "paper_b": {"parameters": "~135M", "corpus": "TinyStories and FineWeb-Edu",
                "training": "~100 GPU-hours on one RTX 4090", "seeds": "1"},
}


def paper_a_cells(cells: list[str], configs: dict[str, CellConfig]) -> dict[str, CellA]:
    """CellA of each cell, read from configs/, tables/diagnose, tables/sweep,
    tables/clamp, metrics/throughput and metrics/diagnose (its resampling unit); a
    missing file names the stage to run."""
    out = {}
    for c in cells:
        cfg = configs[c]
        speed = read_metrics("throughput", c)
        out[c] = CellA(cell_group(cfg), cfg.train.loss, cfg.model.readout, recipe(cfg),
                       cfg.model.loops, read_table("diagnose", c), read_table("sweep", c),
                       read_table("clamp", c), speed["tokens_per_s"], speed["flops_per_token"],
                       read_metrics("diagnose", c).get("unit", "document"), control(cfg),
                       cfg.model.d_model, paper_condition(cfg),
                       speed.get("tokens_per_s_rounds", {}))
    return out


def _records(found: list[Claim], paper: str, configs: dict[str, CellConfig]
             ) -> list[dict[str, Any]]:
    """The rows as records, each with its id (paper, the claim's key, its recipe group
    or the backbones it reads) and its group."""
    groups = {recipe(c): facts(c)["recipe_group"] for c in configs.values()}
    out = []
    for c in found:
        record = c.record()
        record["paper"] = paper
        if paper == "A":
            record["group"] = groups.get(c.recipe, "ours")
            suffix = f".{record['group']}"
        else:
            read = c.facts.get("backbones", [])
            record["group"] = "+".join(read)
            suffix = f".{read[0]}" if len(read) == 1 else ""
        record["id"] = f"{paper}.{c.key or 'absent'}{suffix}"
        if c.extends:
            record["extends"] = f"{paper}.{c.extends}{suffix}"
        if c.key:
            record["declared"] = criteria.declared(c.key, c.extends)
        out.append(record)
    return out


def audit(found: dict[str, Any]) -> list[str]:
    """What breaks the rule of the counted rows in a claims document (tables/claims.json):
    a finding that reads more than one statistic (`reads`; one with nothing measured,
    inconclusive or not shown, reads none), and
    an extension whose `extends` names no finding of its paper. The claims stage refuses
    to write a document with any (judge)."""
    problems = []
    for paper in ("paper_a", "paper_b"):
        rows = found.get(paper, [])
        findings = {r["id"] for r in rows if r["kind"] == "finding"}
        for r in rows:
            if r["kind"] == "finding" and len(r["reads"]) > 1:
                problems.append(f"{r['id']}: a finding reads {len(r['reads'])} statistics "
                                f"({'; '.join(r['reads'])}); move all but the paper's to an "
                                "extension")
            if r["kind"] == "extension" and r.get("extends") not in findings:
                problems.append(f"{r['id']}: an extension of no finding (extends "
                                f"{r.get('extends')!r})")
    return problems


def metrics(found: dict[str, Any]) -> dict[str, Any]:
    """metrics/claims.json: each paper's counts (keys without spaces: `not_shown`), and
    under `verdict` each claim's id with its verdict as a number (VERDICT_NUMBERS), so
    that `dvc metrics diff` and `dvc exp show` name the claim that turned."""
    out: dict[str, Any] = {p: {v.replace(" ", "_"): n for v, n in c.items()}
                           for p, c in found["counts"].items()}
    out["verdict"] = {r["id"]: VERDICT_NUMBERS[r["verdict"]]
                      for p in ("paper_a", "paper_b") for r in found[p]
                      if r["verdict"] in VERDICT_NUMBERS}
    return out


def counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """The verdicts of a paper's findings, counted (extensions and checks apart)."""
    findings = [r for r in rows if r["kind"] == "finding"]
    return {v: sum(r["verdict"] == v for r in findings) for v in VERDICTS}


def scale(configs: dict[str, CellConfig], train: dict[str, dict[str, Any]],
          corpus: dict[str, Any]) -> dict[str, Any]:
    """What each cell was trained at: parameters, training tokens per run (steps x batch
    x context), seeds; the corpus; beside the papers' (PAPER_SCALE)."""
    cells = {}
    for name, cfg in configs.items():
        steps = next(iter(train[name]["runs"].values()))["steps"]
        cells[name] = {"parameters": train[name]["params"], "seeds": len(cfg.seeds),
                       "training_tokens": steps * cfg.train.batch_size * cfg.model.context,
                       "recipe_group": facts(cfg)["recipe_group"],
                       "paper_b_backbone": cell_group(cfg) == "paper B backbone"}
    return {"cells": cells, "corpus": corpus, "papers": PAPER_SCALE,
            "reference_recipe": "paper A's architecture and init (PyTorch's default init, "
                                "SwiGLU, decay on every parameter) with our schedule"}


def paper_b_metrics(cells: list[str], backbones: list[str], resamples: int
                    ) -> dict[str, dict[str, Any]]:
    """metrics/convergence of every cell, and beside each backbone's its per-token table
    (tables/convergence: the late window's floors, which the claims label at the
    criteria's thresholds; loopscope.judge.settling)."""
    conv = {c: read_metrics("convergence", c) for c in cells}
    for c in backbones:
        conv[c] = settling.attach(conv[c], read_table("convergence", c), resamples, c)
    return conv


def judge(cells: list[str], policy_cells: list[str], values: dict[str, float],
          resamples: int, provenance: dict[str, Any], outside: tuple[str, ...] = ()
          ) -> dict[str, Any]:
    """Both papers' claims on this run's outputs (tables/claims.json; module doc).
    values: the criteria's (params.yaml's claims section); resamples: diagnose.bootstrap;
    provenance: what the stage recorded before it ran (loopscope.base.provenance.record),
    to which the cells' training precision is added. outside: the outside models, whose
    rows are extensions beside the cells (loopscope.judge.outside), under `outside`."""
    configs = {c: load_cell(paths.config_file(c)) for c in cells}
    groups = {c: cell_group(configs[c]) for c in cells}
    data = paper_a_cells([c for c in cells if groups[c] != "paper B backbone"], configs)
    main, second = paper_b_backbones({c: configs[c] for c in cells
                                      if groups[c] == "paper B backbone"})
    base = Criteria(values)  # once per judging run; each judge reads a fresh copy
    judged_a = _records(paper_a_claims(data, base, resamples), "A", configs)
    conv = paper_b_metrics(cells, [c for c in (main, second) if c is not None], resamples)
    pol = {c: read_metrics("policies", c) for c in policy_cells}
    rows_b = paper_b_claims(conv, pol, main, second, base)
    settling.mark_settling(rows_b, conv, [c for c in (main, second) if c is not None], base)
    judged_b = _records(rows_b, "B", configs)
    mark_recipes(judged_a, configs)
    mark_sigma(judged_b, configs)
    found = {"paper_a": [r for r in judged_a if r["kind"] != "check"], "paper_b": judged_b}
    if problems := audit(found):
        raise ValueError("tables/claims.json would break the rule of the counted rows:\n"
                         + "\n".join(problems))
    meta = read_json(paths.PREPARED / "meta.json", "prepare")
    released = {"outside": outside_records(list(outside), base, main)} if outside else {}
    return {
        "$schema": SCHEMA, "schema_version": SCHEMA_VERSION, "papers": PAPERS,
        "provenance": {**provenance, "precision": {"training": training_precision(configs),
                                                   "measuring": "fp32"}},
        **found,
        "judged_with": {"criteria": criteria_digest(values),
                        "cells": cells_digest({c: cfg.to_json() for c, cfg in configs.items()})},
        "mechanism_checks": [r for r in judged_a if r["kind"] == "check"],
        "counts": {k: counts(v) for k, v in found.items()},
        "parameters": criteria.table(values),
        "rules": {"family": FAMILY_RULE,
                  "seeds": SEED_RULE,
                  "verdict": "the direction and the magnitude together: holds where both "
                              "hold, contradicted where either is"},
        "cells": {c: facts(cfg) for c, cfg in configs.items()},
        "scale": scale(configs, {c: read_metrics("train", c) for c in cells},
                       {"documents": meta.get("documents"),
                        "train_tokens": meta["splits"]["train"]["tokens"],
                        "val_tokens": meta["splits"]["val"]["tokens"]}),
        "init_effect": init_effect(data, resamples),
        "paper_b_recipe": {c: f"R = {configs[c].model.loops}: {recipe_deviation(configs[c])}"
                           for c in (main, second) if c is not None},
        **released,
    }
