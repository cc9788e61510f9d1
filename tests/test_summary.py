"""The front page's numbers (loopscope.render.summary): README's generated blocks and
docs/results.md are what the committed run's files say, and a hand edit is caught."""

import os
from pathlib import Path

import pytest

from loopscope.base.errors import DataError
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


def test_readme_blocks_are_the_committed_run(committed):
    readme = (ROOT / summary.README).read_text()
    assert summary.stale_blocks(readme, committed) == []


def test_a_hand_edited_verdict_in_readme_is_caught(committed):
    readme = (ROOT / summary.README).read_text()
    table = summary.block(readme, "verdicts")
    row = next(line for line in table.splitlines() if "| contradicted" in line)
    edited = readme.replace(row, row.replace("| contradicted", "| holds", 1))
    assert edited != readme
    assert summary.stale_blocks(edited, committed) == ["verdicts"]


def test_the_committed_results_page_is_the_committed_run(committed):
    assert (ROOT / summary.RESULTS_PAGE).read_text() == summary.page(**committed)


def claims(verdict_a="holds", magnitude="contradicted", regime=""):
    row_a = {"claim": "drift", "verdict": verdict_a, "magnitude": magnitude,
             "recipe": "ours (init gpt2)", "paper": "~500", "value": "3.6",
             "criterion": "ratio > 1"}
    ref = {**row_a, "verdict": "holds", "magnitude": "holds",
           "recipe": "paper A's reference architecture and init"}
    row_b = {"claim": "tail", "verdict": "contradicted", "magnitude": "n/a",
             "regime": regime, "depth_use": "backbone: useful depth 3 [3, 3] of R = 8",
             "paper": "~10%", "value": "1%", "criterion": "share > 5%"}
    return {"paper_a": [row_a, ref], "paper_b": [row_b],
            "counts": {"paper_a": {"holds": 2}, "paper_b": {"contradicted": 1}}}


def test_verdict_rows_put_each_recipe_group_in_its_column_and_mark_the_regime():
    a, b = summary.verdict_rows(claims(
        regime="outside the paper's regime (bb: useful depth 3 [3, 4] vs 0.75 m = 6); "
               "in the paper's regime (bb4: useful depth 4 [3, 4] vs 0.75 m = 3)"))
    assert a == [{"claim": "drift", "our recipe": "holds (magnitude: contradicted)",
                  "reference recipe": "holds (magnitude: holds)"}]
    assert b == [{"claim": "tail", "verdict": "contradicted",
                  "regime": "outside the paper's regime (bb); in the paper's regime (bb4)"}]
    assert summary.verdict_rows(claims())[1][0]["regime"] == "-"  # no backbone read


def test_a_paper_a_claim_not_shown_has_no_recipe_and_still_renders():
    """Params with no paper A cells (the paper B presets) give rows without a recipe."""
    rows = {"paper_a": [{"claim": "drift", "verdict": "not shown"}], "paper_b": []}
    a, _ = summary.verdict_rows(rows)
    assert a[0]["reference recipe"] == "-" and a[0]["our recipe"].startswith("not shown")


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
    drawn = []
    monkeypatch.setattr(plt, "close", lambda fig: drawn.append(fig))
    summary.norm_figure(csv, tmp_path / "norm.png")
    assert (tmp_path / "norm.png").read_bytes()[:4] == b"\x89PNG"
    labels = [line.get_label() for ax in drawn[0].axes for line in ax.get_lines()]
    assert labels == ["perloop_normed", "ref_perloop_normed"]  # backbones are not paper A's


def test_results_name_each_backbones_recipe_against_paper_bs():
    found = {"paper_b_recipe": {"backbone": "R = 8: sampler sigma 0.1, not 0.5"}}
    assert summary.backbone_recipes(found) == (
        "Backbones, against paper B's recipe: `backbone` (R = 8: sampler sigma 0.1, not 0.5).")
    assert summary.backbone_recipes({}) == "No paper B backbone in this run."
