"""The front page's numbers (loopscope.render.summary): README's generated blocks and
docs/results.md are what the committed run's files say, and a hand edit is caught."""

import os
from pathlib import Path

import pytest

from loopscope.base.errors import DataError
from loopscope.judge.verdicts import combined
from loopscope.params import load_params
from loopscope.render import summary

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def committed() -> dict:
    """The summary's inputs, read from the committed run's files."""
    here = Path.cwd()
    os.chdir(ROOT)
    try:
        return summary.inputs(list(load_params().cells))
    finally:
        os.chdir(here)


@pytest.mark.committed
def test_readme_blocks_are_the_committed_run(committed):
    readme = (ROOT / summary.README).read_text()
    assert summary.stale_blocks(readme, committed) == []


@pytest.mark.committed
def test_a_hand_edited_verdict_in_readme_is_caught(committed):
    readme = (ROOT / summary.README).read_text()
    table = summary.block(readme, "verdicts")
    row = next(line for line in table.splitlines() if "| contradicted" in line)
    edited = readme.replace(row, row.replace("| contradicted", "| holds", 1))
    assert edited != readme
    assert summary.stale_blocks(edited, committed) == ["verdicts"]


@pytest.mark.committed
def test_the_committed_results_page_is_the_committed_run(committed):
    assert (ROOT / summary.RESULTS_PAGE).read_text() == summary.page(**committed)


def row(key, direction, magnitude="n/a", group="ours", paper="A", **fields):
    return {"id": f"{paper}.{key}.{group}", "key": key, "claim": key, "kind": "finding",
            "group": group, "direction": direction, "magnitude": magnitude,
            "verdict": combined(direction, magnitude), "paper_says": "~500",
            "value": "3.6", "criterion": "ratio > 1",
            "robustness": {"mark": "robust", "swept": {}, "turns": []}, **fields}


def claims(direction_a="holds", magnitude="contradicted", regimes=()):
    row_a = row("drift", direction_a, magnitude)
    ref = row("drift", "holds", "holds", group="reference")
    row_b = row("tail", "contradicted", paper="B", group="backbone", regimes=list(regimes))
    from report_data import PAPERS
    return {"paper_a": [row_a, ref], "paper_b": [row_b], "papers": PAPERS,
            "counts": {"paper_a": {"holds": 2}, "paper_b": {"contradicted": 1}}}


def test_verdict_rows_put_each_recipe_group_in_its_column_and_mark_the_regime():
    a, b = summary.verdict_rows(claims(regimes=[
        {"backbone": "bb", "state": "outside"}, {"backbone": "bb4", "state": "in"}]))
    assert a == [{"claim": "drift",
                  "our recipe": "contradicted (direction holds, magnitude contradicted)",
                  "reference recipe": "holds (direction holds, magnitude holds)",
                  "extensions": "-"}]
    assert b == [{"claim": "tail", "verdict": "contradicted",
                  "regime": "outside the paper's regime (bb); in the paper's regime (bb4)",
                  "extensions": "-"}]
    assert summary.verdict_rows(claims())[1][0]["regime"] == "-"  # no backbone read


def test_a_fragile_verdict_and_an_extension_say_so():
    found = claims()
    found["paper_a"][0]["robustness"] = {"mark": "fragile", "swept": {}, "turns": [
        {"parameter": "margin_nats", "value": 0.025, "verdict": "holds"}]}
    found["paper_a"].append({**row("clamp_other", "holds"), "kind": "extension"})
    a, _ = summary.verdict_rows(found)
    assert a[0]["our recipe"].endswith(", fragile")
    assert a[1]["claim"] == "clamp_other (extension)"  # an extension of no finding: a row


def test_an_extension_stands_beside_the_finding_it_extends():
    found = claims()
    found["paper_a"] += [
        {**row("final_norm", "holds"), "kind": "extension", "extends": "A.drift.ours"},
        {**row("final_norm", "contradicted", group="reference"), "kind": "extension",
         "extends": "A.drift.reference"}]
    found["paper_b"].append({**row("tail_more", "holds", paper="B", group="backbone"),
                             "kind": "extension", "extends": "B.tail.backbone"})
    a, b = summary.verdict_rows(found)
    assert [r["claim"] for r in a] == ["drift"] and [r["claim"] for r in b] == ["tail"]
    assert a[0]["extensions"] == ("final_norm: holds; final_norm (reference): "
                                  "contradicted")
    assert b[0]["extensions"] == "tail_more: holds"


def test_a_paper_a_claim_not_shown_still_renders():
    """Params with no paper A cells (the paper B presets) give rows not shown."""
    rows = {"paper_a": [row("drift", "not shown")], "paper_b": []}
    a, _ = summary.verdict_rows(rows)
    assert a[0]["reference recipe"] == "-" and a[0]["our recipe"].startswith("not shown")


def test_the_scale_line_sets_the_run_beside_the_papers():
    found = {"scale": {"cells": {
        "a": {"parameters": 670_000, "training_tokens": 800_000, "seeds": 2},
        "b": {"parameters": 800_000, "training_tokens": 820_000, "seeds": 1}},
        "corpus": {"train_tokens": 1_000_000},
        "papers": {"paper_a": {"parameters": "44M", "corpus": "WikiText-103"},
                   "paper_b": {"parameters": "~135M"}}}}
    line = summary.scale_line(found)
    assert line.startswith("Scale: every verdict is measured on models of 0.67-0.80M "
                           "parameters trained on 0.80-0.82M tokens of a 1.00M-token corpus, "
                           "1 or 2 seeds per cell; paper A: 44M parameters, WikiText-103")
    for cell in found["scale"]["cells"].values():
        cell["seeds"] = 1
    assert ", 1 seed per cell;" in summary.scale_line(found)


def test_the_timings_block_sums_the_stage_timings():
    found = {"train@a": {"seconds": 600.0, "cpu": "CPU X", "cores": 2},
             "diagnose@a": {"seconds": 120.0, "cpu": "CPU X", "cores": 2}}
    assert summary.timings_block(found) == (
        "The 2 stages of this run, each as it last ran, took 12 min on CPU X (2 cores), "
        "training included; the stages after training took 2.0 min of it "
        "(metrics/stage_timings; `python -m loopscope.base.timings` itemizes them).")


def test_readme_gives_the_training_time_once():
    """The cost block gives the training runs' minutes; the timings block only the
    whole and what came after training."""
    found = {"train@a": {"seconds": 600.0, "cpu": "CPU X", "cores": 2},
             "diagnose@a": {"seconds": 120.0, "cpu": "CPU X", "cores": 2}}
    assert "10.0" not in summary.timings_block(found)
    assert "training (" not in summary.timings_block(found)


def test_the_counts_block_gives_each_papers_counts_and_names_the_papers():
    from report_data import claim_row, claims_json
    found = claims_json([claim_row("a"), claim_row("b", "contradicted"),
                         claim_row("c", "not shown"), claim_row("d", kind="extension")],
                        [claim_row("e", paper="B")])
    block = summary.counts_block(found)
    assert ("- **Paper A** (the readout blind spot): 1 of 3 findings hold (1 contradicted, "
            "1 not shown).") in block
    assert "- **Paper B** (per-token fixed-point convergence): 1 of 1 finding holds." in block


def test_the_verdicts_block_draws_each_forest_plot_with_what_it_shows():
    from report_data import claim_row, claims_json, estimate
    found = claims_json([claim_row("a"), claim_row("b", estimate=estimate(unit="ratio"))])
    block = summary.verdicts_block(found)
    assert ("![Forest plot, paper A's claims, each claim on its statistic's own scale, a panel "
            "per unit (nats: 1 row; ratio: 1 row, log axis)") in block
    assert "](docs/results/forest_a.png)" in block and "](docs/results/forest_b.png)" in block
    page = summary.claims_sections(found)
    assert "](results/forest_a.png)" in page and "*Paper A's title*" in page
    assert "| claim | group | paper | where | ours | verdict | criterion |" in page


def test_readme_holds_no_measured_number_outside_its_generated_blocks():
    """A time typed by hand goes stale: README's timings come from generated blocks."""
    import re
    text = (ROOT / summary.README).read_text()
    for name in ("counts", "verdicts", "cost", "timings"):
        text = text.replace(summary.block(text, name), "")
    typed = re.findall(r"\b\d+(?:\.\d+)? ?(?:min|minutes|h|hours)\b(?! \(a standing)"
                       r"|\bpassed \d+ tests|\b\d+ min \d+ s\b", text)
    assert [t for t in typed if t not in ("3 minutes", "75 minutes")] == [], typed


def test_a_readme_without_its_markers_is_refused():
    with pytest.raises(DataError, match="begin verdicts"):
        summary.replace_block("# no blocks here\n", "verdicts", "x")
    text = "a\n<!-- begin cost: generated -->\nold\n<!-- end cost -->\nb\n"
    new = summary.replace_block(text, "cost", "new line")
    assert new == "a\n<!-- begin cost: generated -->\nnew line\n<!-- end cost -->\nb\n"
    assert summary.block(new, "cost") == "new line"


def test_markdown_table_escapes_pipes():
    table = summary.markdown_table([{"claim": "KL(p || q)", "v": 1}])
    assert "KL(p \\|\\| q)" in table and table.count("\n") == 2


def test_training_cost_sums_every_run_of_every_cell():
    timings = {"a": {"runs": {"seed42": {"train_seconds": 60.0},
                              "seed43": {"train_seconds": 120.0}}, "train_seconds": 60.0},
               "b": {"runs": {"seed42": {"train_seconds": 60.0}}, "train_seconds": 60.0}}
    assert summary.train_seconds(timings) == {"a": 180.0, "b": 60.0}
    assert "2 cells (3 runs) took 4 min on m" in summary.cost_block(timings, "m")


def test_the_norm_figure_draws_one_line_per_paper_a_cell(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    csv = tmp_path / "norm.csv"
    csv.write_text("series,loop,norm\n" + "".join(
        f"{s},{k},{10.0 * k}\n" for s in ("perloop_normed", "ref_perloop_normed", "backbone")
        for k in (1, 2)))
    fact = {"loss": "per_loop", "readout": "normed", "control": "",
            "group": "normed baseline", "recipe_group": "ours"}
    cells = {"perloop_normed": fact, "ref_perloop_normed": {**fact, "recipe_group": "reference"},
             "backbone": {**fact, "group": "paper B backbone"}}
    drawn = []
    monkeypatch.setattr(plt, "close", lambda fig: drawn.append(fig))
    summary.norm_figure(csv, tmp_path / "norm.png", cells)
    assert (tmp_path / "norm.png").read_bytes()[:4] == b"\x89PNG"
    labels = [line.get_label() for ax in drawn[0].axes for line in ax.get_lines()]
    assert labels == ["perloop_normed", "ref_perloop_normed"]  # backbones are not paper A's


def test_results_name_each_backbones_recipe_against_paper_bs():
    found = {"paper_b_recipe": {"backbone": "R = 8: sampler sigma 0.1, not 0.5"}}
    assert summary.backbone_recipes(found) == (
        "Backbones, against paper B's recipe: `backbone` (R = 8: sampler sigma 0.1, not 0.5).")
    assert summary.backbone_recipes({}) == "No paper B backbone in this run."


@pytest.mark.committed
def test_the_benchmarks_ledger_block_is_the_committed_run(committed):
    text = (ROOT / summary.paths.BENCHMARKS_PAGE).read_text()
    assert summary.block(text, "ledger") == summary.ledger_block(committed["bench"])


def test_the_ledger_block_names_the_machine_and_the_policy():
    bench = {"machine": {"cpu": "CPU X", "device": "cpu", "threads": 2}}
    assert summary.ledger_block(bench) == ("This run timed no policy at matched quality: "
                                           "no ledger.")
    from test_tables_b import bench as timed
    from test_tables_b import with_ledger
    found = summary.ledger_block({**with_ledger(timed()), "machine": bench["machine"]})
    assert found.startswith("On CPU X cpu, 2 threads, `kl` at its matched threshold against "
                            "uniform depth 6")
    assert "| scoring | exit checks | 0.0000 | 0.2000 | 0.2000 |" in found
    assert found.count("**generation_batch") == 2


def test_the_runtime_rows_read_each_rule_against_both_depths_and_flag_its_timings():
    from test_tables_b import bench as timed
    from test_tables_b import checked
    b = timed()
    b["generation_batch1"] = {**b["generation_batch1"], "depth_check": checked(2.1, False)}
    b["scoring"] = {**b["scoring"], "depth_check": checked(1.3, True)}
    rows = {r["mode"]: r for r in summary.runtime_rows(b)}
    assert rows["scoring"] == {
        "mode": "scoring", "policy": "kl", "mean loops": "5.00",
        "realized vs depth 6": "1.50x", "FLOP speedup vs depth 6": "1.30x",
        "realized vs depth R": "1.80x", "FLOP speedup vs depth R": "1.60x",
        "depth check": "holds"}
    assert rows["generation_batch1"]["depth check"] == "fails (2.10x > 1.47x)"
    assert rows["generation_batched"]["depth check"] == "not checked"
