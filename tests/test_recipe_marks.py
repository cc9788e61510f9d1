"""Where the recipe, not the paper's mechanism, decides a row: paper A's findings whose
verdict differs between the two recipe groups, what of paper A's recipe a group lacks,
and the paper B rows its sampler's sigma moves (loopscope.judge.cells.mark_recipes,
loopscope.judge.backbone.mark_sigma)."""

from __future__ import annotations

import dataclasses

from conftest import TINY, tiny_cell
from report_data import claim_row

from loopscope.judge.backbone import mark_sigma
from loopscope.judge.cells import mark_recipes, recipe_gaps

OURS = tiny_cell(TINY, loss="per_loop")
REFERENCE = tiny_cell(dataclasses.replace(TINY, init="paper_a", ffn="swiglu"), loss="per_loop",
                      decay_on="all", schedule="constant", lr=3e-4, warmup_steps=0,
                      betas=(0.9, 0.999), batch_size=64)
CONFIGS = {"perloop_normed": OURS, "ref_perloop_normed": dataclasses.replace(
    REFERENCE, cell="ref_perloop_normed")}


def test_the_reference_recipe_with_paper_as_schedule_lacks_nothing_ours_lacks_it_all():
    assert recipe_gaps(CONFIGS["ref_perloop_normed"]) == []
    gaps = recipe_gaps(OURS)
    assert [g.split()[0] for g in gaps] == ["cosine", "warm-up", "betas", "batch"]
    short = dataclasses.replace(CONFIGS["ref_perloop_normed"], train=dataclasses.replace(
        REFERENCE.train, warmup_steps=100))
    assert recipe_gaps(short) == ["warm-up 100 steps, not none"]


def test_a_finding_that_turns_with_the_recipe_says_so_on_both_groups():
    rows = [claim_row("drift", "contradicted"), claim_row("drift", "holds", group="reference"),
            claim_row("clamp", "holds"), claim_row("clamp", "holds", group="reference"),
            claim_row("activity", "holds"), claim_row("activity", "not shown",
                                                      group="reference")]
    mark_recipes(rows, CONFIGS)
    drift = [r for r in rows if r["key"] == "drift"]
    assert [r["recipe_turns"] for r in drift] == [{"ours": "contradicted",
                                                   "reference": "holds"}] * 2
    assert all("the recipe turns this row" in r["value"] for r in drift)
    # the same verdict in both groups, or a group that shows nothing: not turned
    assert not any("recipe_turns" in r for r in rows if r["key"] != "drift")
    assert rows[0]["recipe_lacks"] == recipe_gaps(OURS) and rows[1]["recipe_lacks"] == []


def test_the_rows_the_sigma_moves_name_it_where_it_is_not_paper_bs():
    backbone = tiny_cell(TINY, depth="lognormal", depth_sigma=0.1)
    paper = tiny_cell(TINY, depth="lognormal", depth_sigma=0.5)
    rows = [claim_row(k, paper="B", group="backbone", backbones=["backbone"])
            for k in ("tail", "median_convergence", "kl_decay")]
    mark_sigma(rows, {"backbone": backbone})
    assert [r.get("sampler_sigma") for r in rows] == [{"backbone": 0.1}, {"backbone": 0.1}, None]
    assert "sampler sigma 0.1 (backbone), not paper B's 0.5" in rows[0]["value"]
    same = [claim_row("tail", paper="B", group="backbone", backbones=["backbone"])]
    mark_sigma(same, {"backbone": paper})
    assert "sampler_sigma" not in same[0]
