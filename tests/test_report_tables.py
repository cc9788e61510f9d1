"""What every report shows (loopscope.render.report_tables), computed from constructed
outputs, and the notebooks held to drawing only."""

import ast
import json
import math
from pathlib import Path

import pandas as pd
import pytest
from report_data import PROVENANCE, cell, claim_row, claims_json, estimate, write, write_config

from loopscope.base import paths
from loopscope.base.errors import DataError
from loopscope.base.outputs import loop_order, read_metrics
from loopscope.judge.experiments import EXPERIMENTS
from loopscope.render.report_tables import (
    PART_ESTIMATE,
    claims_intro,
    claims_summary,
    claims_view,
    computed_from,
    decisive_part,
    experiment_verdicts,
    forest_rows,
    headline_table,
    init_effect,
    inputs_html,
    paper_line,
    parameters_table,
    plural,
    provenance_table,
    robustness,
    rules_list,
    scale_line,
    scale_table,
    specification_rows,
    table_display,
    units_statement,
)

REPORTS = Path(__file__).resolve().parents[1] / "reports"


def test_loop_order_is_numeric_not_lexicographic():
    loops, values = loop_order({"k1": 1.0, "k10": 10.0, "k11": 11.0, "k2": 2.0, "k9": 9.0})
    assert loops == [1, 2, 9, 10, 11] and values == [1.0, 2.0, 9.0, 10.0, 11.0]


@pytest.mark.parametrize("kind, stage", [("diagnose", "diagnose@a"), ("throughput", "throughput"),
                                         (paths.TRAIN_TIMINGS, "train@a"),
                                         ("clamp", "diagnose@a")])
def test_a_missing_metrics_file_names_the_stage_that_writes_it(tmp_path, monkeypatch, kind,
                                                                stage):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=f"run `dvc repro {stage}` first"):
        read_metrics(kind, "a")


def test_table_display_writes_a_dash_for_what_does_not_apply():
    with pd.option_context("display.precision", 6, "styler.format.precision", 6,
                           "styler.format.na_rep", None, "display.float_format", None):
        table_display()
        fmt = pd.get_option("display.float_format")
        assert fmt(1.234567) == "1.235" and fmt(math.nan) == "-"
        styled = pd.DataFrame({"x": [1.234567, math.nan]}).style.to_html()
        assert ">1.2346</td>" in styled and ">-</td>" in styled and "nan" not in styled
    assert pd.get_option("display.float_format") is None  # restored for other tests


def test_provenance_reads_as_one_line_a_table_and_the_inputs_by_digest():
    """What the stage recorded before the run (loopscope.base.provenance), as the reports
    show it: the commit the run started from, never a mark of uncommitted changes."""
    found = {**PROVENANCE, "stage": "report_index", "seeds": [42, 43]}
    line = computed_from(found)
    assert line.startswith("Computed from: commit 0123456789 (checked out when the run "
                           "started")
    assert "seeds 42, 43" in line and "torch 2.13.0" in line and "uncommitted" not in line
    assert "training precision fp32 (measured in fp32)" in line
    assert "2 inputs by their DVC digests, as dvc.lock records the deps of `report_index`" in line
    table = provenance_table(found)
    assert list(table.index) == ["commit", "inputs", "params", "packages", "cpu",
                                 "training precision", "seeds", "date"]
    assert table.loc["params", ""] == "cells: sha256 2222222222222222"
    html = inputs_html(found)
    assert html.startswith("<details>") and "(3 rows)" in html
    assert "<td>configs</td>\n      <td>" + "0" * 32 + ".dir</td>" in html
    assert "<td>params.yaml (cells)</td>\n      <td>sha256:" + "2" * 16 + "</td>" in html
    assert "commit none (not a git checkout)" in computed_from({**found, "commit": None})


def test_counts_say_their_noun_in_the_right_number():
    assert plural(1, "row") == "1 row" and plural(2, "row") == "2 rows"
    assert plural(0, "verdict") == "0 verdicts"


# --- the claims ---------------------------------------------------------------------------


def test_claims_are_shown_as_judged_with_their_marks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match="dvc repro claims"):
        claims_view("paper_a")
    fragile = claim_row("clamp", "contradicted", robustness={
        "mark": "fragile", "swept": {"margin_nats": [0.005, 0.025]},
        "turns": [{"parameter": "margin_nats", "value": 0.025, "verdict": "holds"}]},
        note="the seed-to-seed spread exceeds the margin",
        seeds={"rule": "r", "cells": ["x"], "each": [{"verdict": "holds"},
                                                     {"verdict": "contradicted"}]})
    rows = [claim_row("drift"), fragile, claim_row("clamp_other", "holds", kind="extension"),
            claim_row("k_invariance", "inconclusive", magnitude="holds")]
    write(paths.CLAIMS, claims_json(rows))
    view = claims_view("paper_a")
    assert list(view["claim"]) == [r["claim"] for r in rows]
    assert list(view["verdict"]) == ["holds", "contradicted", "holds", "inconclusive"]
    assert view.loc[1, "robustness"] == "fragile: margin_nats = 0.025 -> holds"
    assert view.loc[0, "robustness"] == "robust"
    assert view.loc[1, "note"] == ("the seed-to-seed spread exceeds the margin; each seed "
                                   "alone: holds; contradicted")
    assert "regime" not in view and list(claims_view("paper_a", "extension")["id"]) == [
        "A.clamp_other.ours"]
    intro = claims_intro("paper_a")
    assert intro.startswith("**1 of 3 findings hold** on this run (1 holds, 1 contradicted, "
                            "1 inconclusive); 1 of them fragile")
    assert "1 row beyond the paper (extensions: 1 holds) are not counted" in intro
    assert robustness({}) == "-"
    assert rules_list().startswith("- **family**: Bonferroni\n- **seeds**")
    assert init_effect() == ("**What the recipe does to the magnitude.** This run has one "
                             "recipe group.")


def test_parameters_table_names_the_rows_each_parameter_turns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fragile = claim_row("clamp", robustness={
        "mark": "fragile", "swept": {"margin_nats": [0.005, 0.025]},
        "turns": [{"parameter": "margin_nats", "value": 0.005, "verdict": "inconclusive"}]})
    write(paths.CLAIMS, claims_json([claim_row("drift"), fragile]))
    table = parameters_table().set_index("parameter")
    assert table.loc["margin_nats", "rows reading it"] == 2
    assert table.loc["margin_nats", "rows it turns"] == "A.clamp.ours"
    assert table.loc["regime", "rows it turns"] == "-"
    assert table.loc["margin_nats", "range"] == "0.005, 0.01, 0.025"


def test_the_decisive_part_is_the_one_the_verdict_turned_on():
    row = claim_row("drift", magnitude_estimate=estimate())
    assert decisive_part(row) == "direction"  # no magnitude
    both = {**row, "magnitude": "contradicted", "verdict": "contradicted"}
    assert decisive_part(both) == "magnitude"  # the direction holds: the magnitude decided
    assert decisive_part({**both, "direction": "contradicted"}) == "direction"
    assert decisive_part({**row, "magnitude": "inconclusive", "verdict": "inconclusive"}) == \
        "magnitude"
    assert decisive_part({**row, "verdict": "not shown"}) is None
    assert decisive_part({**row, "estimate": None}) is None  # judged on nothing


def test_forest_rows_are_each_claims_interval_on_its_own_scale(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fragile = claim_row("clamp", "contradicted", magnitude="contradicted", robustness={
        "mark": "fragile", "swept": {"margin_nats": [0.005, 0.025]},
        "turns": [{"parameter": "margin_nats", "value": 0.025, "verdict": "holds"}]},
        magnitude_estimate=estimate(2.0, 1.0, 3.0, (None, 1.0), unit="ratio", level=0.9875,
                                    paper=0.5))
    fragile["direction"] = "holds"
    write(paths.CLAIMS, claims_json([claim_row("drift"), fragile,
                                     claim_row("absent", "not shown", estimate=None),
                                     claim_row("bare", estimate=estimate(unit=""))]))
    rows = forest_rows("paper_a")
    assert list(rows["row"]) == ["drift [ours]", "clamp [ours] (magnitude)", "bare [ours]"]
    assert list(rows["unit"]) == ["nats", "ratio", "unitless"]
    assert list(rows["robust"]) == [True, False, True]
    clamp = rows.iloc[1]
    assert (clamp["lo"], clamp["value"], clamp["hi"], clamp["level"]) == (1.0, 2.0, 3.0, 0.9875)
    assert clamp["band_lo"] == -math.inf and clamp["band_hi"] == 1.0 and clamp["paper"] == 0.5
    assert math.isnan(rows.iloc[0]["paper"]) and rows.iloc[0]["band_hi"] == math.inf


def test_specification_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fragile = claim_row("clamp", "contradicted", robustness={
        "mark": "fragile", "swept": {"margin_nats": [0.005, 0.025]},
        "turns": [{"parameter": "margin_nats", "value": 0.025, "verdict": "holds"}]})
    write(paths.CLAIMS, claims_json([claim_row("drift"), fragile]))
    spec = specification_rows("paper_a")
    assert list(spec["value"]) == ["0.01", "0.005", "0.025"]
    assert list(spec["verdict"]) == ["contradicted", "contradicted", "holds"]
    assert list(spec["judged"]) == [True, False, False]


def test_the_papers_are_named_with_where_each_number_comes_from(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(paths.CLAIMS, claims_json([claim_row("drift", source="Table 2")]))
    assert paper_line("paper_a").startswith("Paper A: *Paper A's title*.")
    summary = claims_summary("paper_a")
    assert summary.loc[0, "paper says"] == "the paper" and summary.loc[0, "where"] == "Table 2"


def test_scale_is_on_every_claims_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(paths.CLAIMS, claims_json([claim_row("drift")]))
    a = scale_table("paper_a")
    assert list(a.index) == ["short", "paper A"]
    assert a.loc["short", "training tokens"] == "800,000"
    assert a.loc["paper A", "parameters"] == "44M"
    assert list(scale_table("paper_b").index) == ["bb", "paper B"]
    line = scale_line("paper_a")
    assert "13 documents, 1,000,000 training tokens" in line and "WikiText-103" in line
    assert "paper A's architecture and init with our schedule" in line
    assert "architecture and init" not in scale_line("paper_b")


def test_units_statement_names_each_papers_unit_rule(paper_a):
    line = units_statement("diagnose", ["short", "long"])
    assert line == "Intervals resample 40 documents for short, long."
    m = read_metrics("diagnose", "long")
    write(paths.metrics_file("diagnose", "long"),
          {**m, "unit": "block of 4 windows within 2 documents", "units": 32})
    line = units_statement("diagnose", ["short", "long"])
    assert "40 documents for short; 32 units (block of 4 windows within 2 documents)" in line
    assert "span fewer than 10 documents, so the units are blocks" in line
    # paper B's sets want 30 documents (units.MIN_UNITS): 13 are too few there
    write(paths.metrics_file("convergence", "bb"),
          {"unit": "block of 2 windows within 13 documents", "units": 52, "documents": 13,
           "design_effect": {"value": 1.84}})
    line = units_statement("convergence", ["bb"])
    assert "span fewer than 30 documents" in line and "fewer than 10" not in line
    assert "Documents are resampled first" in line and "bb 1.84" in line


def test_experiment_verdicts_sit_beside_their_baselines(paper_a):
    assert experiment_verdicts("paper_a") is None  # no committed experiment
    rows = [claim_row("a"), claim_row("b", "inconclusive")]
    judged = {"criteria": "0123456789abcdef", "cells": "fedcba9876543210"}
    write(paths.CLAIMS, claims_json(rows, judged_with=judged))
    turned = [{**rows[0], "verdict": "contradicted"}, rows[1]]
    experiment = {"experiment": "seeds_plus_one", "base_commit": "0123456789abcdef",
                  "params": {"cells.short.seeds": [43]},
                  "judged_with": {**judged, "cells": "0000000000000000"},
                  "claims": {"paper_a": turned, "paper_b": []},
                  "baseline": {"paper_a": rows, "paper_b": []}}
    write(EXPERIMENTS / "seeds_plus_one.json", experiment)
    table, counts, lines = experiment_verdicts("paper_a", ["short", "bb"], exclude=["bb"])
    assert list(table["seeds_plus_one"]) == ["contradicted", "inconclusive"]
    assert list(table["seeds_plus_one base"]) == ["holds", "inconclusive"]
    assert counts.loc["inconclusive"].tolist() == [1, 1, 1]
    assert lines == ("- `seeds_plus_one` (cells.short.seeds=[43]; run on 0123456): **1 "
                     "verdict turned between holds and contradicted**: a claim [ours]")
    assert experiment_verdicts("paper_a", ["bb"]) is None  # it changed no such cell


def test_an_experiment_judged_under_other_criteria_says_so(paper_a):
    """An experiment recorded under another criteria digest (or before digests were
    kept) is flagged in place of "no verdict turned": its columns compare it with its
    own baseline, which says nothing of today's criteria."""
    rows = [claim_row("a"), claim_row("b", "inconclusive")]
    write(paths.CLAIMS, claims_json(rows, judged_with={"criteria": "aaaa", "cells": "c"}))
    for judged in ({"criteria": "bbbb", "cells": "c"}, None):
        write(EXPERIMENTS / "seeds_plus_one.json",
              {"experiment": "seeds_plus_one", "base_commit": "0123456789abcdef",
               "params": {"cells.short.seeds": [43]}, "judged_with": judged,
               "claims": {"paper_a": rows, "paper_b": []},
               "baseline": {"paper_a": rows, "paper_b": []}})
        lines = experiment_verdicts("paper_a", ["short"])[2]
        assert "judged under other criteria than this report's" in lines
        assert "no verdict turned" not in lines


def test_headline_rows_lead_with_their_cell_group(paper_a):
    write_config("bb", cell(4, depth="lognormal"))
    write(paths.HEADLINE, {"short": {"norm_final": 2.0}, "bb": {"norm_final": 3.0}})
    table = headline_table()
    assert table.loc["bb", "group"] == "paper B backbone"
    assert table.loc["short", "group"] != "paper B backbone"
    assert list(table.columns) == ["group", "norm_final"]


# --- the notebooks ----------------------------------------------------------------------

ALLOWED_IMPORTS = {"IPython.display", "matplotlib.pyplot", "seaborn", "loopscope.render"}
ALLOWED_MODULES = {"loopscope.render." + m for m in ("report_tables", "tables_a", "tables_b",
                                                     "tables_field", "figures", "figures_a",
                                                     "figures_b")}
DISPLAY_METHODS = {"format", "hide", "to_html", "set_caption"}  # a table's presentation
BUILTINS = {"display", "Markdown", "HTML", "len"}


def drawing_faults(source: str) -> list[str]:
    """What in a notebook's code is more than drawing: an import outside the allowlist
    (the render modules and plotting libraries), a function or class of its own,
    arithmetic, or a call that is not a render module's function, a display builtin or
    a table's presentation (DISPLAY_METHODS)."""
    tree = ast.parse(source)
    modules: set[str] = set()
    faults = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names = [f"{node.module}.{a.name}" if node.module == "loopscope.render" else
                     node.module for a in node.names]
            for name in names:
                if name not in ALLOWED_MODULES and name not in ALLOWED_IMPORTS - {
                        "loopscope.render"}:
                    faults.append(f"import from {name}")
            if node.module == "loopscope.render":
                modules |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name not in ALLOWED_IMPORTS:
                    faults.append(f"import {a.name}")
                modules.add(a.asname or a.name)
        elif isinstance(node, (ast.FunctionDef, ast.Lambda, ast.ClassDef)):
            faults.append("a definition of its own")
        elif isinstance(node, (ast.BinOp, ast.AugAssign, ast.UnaryOp)):
            faults.append(f"arithmetic at line {node.lineno}")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id not in BUILTINS:
                faults.append(f"call {func.id}()")
            elif isinstance(func, ast.Attribute) and func.attr not in DISPLAY_METHODS:
                root = func.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                if not (isinstance(root, ast.Name) and root.id in modules):
                    faults.append(f"call .{func.attr}() at line {node.lineno}")
    return faults


def notebook_code(name: str) -> str:
    nb = json.loads((REPORTS / f"{name}.ipynb").read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


@pytest.mark.parametrize("name", ["blind_spot", "convergence", "index"])
def test_the_notebooks_draw_only(name):
    """Every table and figure comes ready from the render modules, which are tested: a
    notebook imports them and the plotting libraries only and computes nothing."""
    assert drawing_faults(notebook_code(name)) == []


@pytest.mark.parametrize("code, fault", [
    ("import numpy as np", "import numpy"),
    ("from loopscope.judge.claims import paper_a_cells", "import from loopscope.judge.claims"),
    ("from loopscope.render import report_tables\nx = report_tables.f()['a'] * 2",
     "arithmetic at line 2"),
    ("from loopscope.render import tables_a\nt = tables_a.f()\nt.groupby('cell')",
     "call .groupby() at line 3"),
    ("d = sorted([2, 1])", "call sorted()"),
    ("def helper(): pass", "a definition of its own"),
])
def test_the_drawing_check_catches_computation(code, fault):
    assert fault in drawing_faults(code)


@pytest.mark.committed
def test_every_committed_row_shows_the_interval_its_verdict_turned_on():
    """The committed tables/claims.json: a held row's decisive interval (the part its
    verdict turned on, as the pages draw it) lies wholly inside its band, a contradicted
    row's wholly outside it."""
    found = json.loads((Path(__file__).parents[1] / paths.CLAIMS).read_text())
    checked = 0
    for row in (r for p in ("paper_a", "paper_b") for r in found[p]):
        part = decisive_part(row)
        if row["verdict"] not in ("holds", "contradicted") or part is None:
            continue
        shown = row[PART_ESTIMATE[part]]
        low, high = shown["band"]
        inside = (low is None or shown["lo"] >= low) and (high is None or shown["hi"] <= high)
        outside = ((low is not None and shown["hi"] < low)
                   or (high is not None and shown["lo"] > high))
        assert inside if row["verdict"] == "holds" else outside, (row["id"], shown)
        checked += 1
    assert checked >= 10
