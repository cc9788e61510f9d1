"""Every table and number the report notebooks show, computed on constructed outputs
small enough to check by hand; and the notebooks themselves read no file and compute
nothing (loopscope.render.report_tables does)."""

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import TINY, tiny_cell

from loopscope.base import paths
from loopscope.base.errors import DataError
from loopscope.base.outputs import loop_order, read_metrics
from loopscope.judge.experiments import EXPERIMENTS
from loopscope.judge.group_a import CellA
from loopscope.judge.paper_b import worst_step
from loopscope.render.report_tables import (
    backbone_cells,
    backbone_table,
    cell_table,
    claims_table,
    clamp_modes,
    computed_from,
    convergence_line,
    cross_table,
    depths,
    elasticity_table,
    exit_benchmark,
    exit_regime,
    exit_rules,
    experiment_verdicts,
    final_loop_norms,
    frontier,
    headline_table,
    init_effect,
    lemma2_table,
    match_target,
    norm_ccdf,
    paper_norms,
    per_loop_table,
    perplexity_table,
    policy_table,
    profile_table,
    provenance_table,
    recipe_deviation,
    runtime_goal,
    saturation_gap,
    sensitivity_table,
    slope_table,
    speedup_table,
    sweep_table,
    table_display,
    token_loops,
    token_table,
    units_statement,
    verdict_counts,
)
from loopscope.weights.config import CellConfig

REPORTS = Path(__file__).resolve().parents[1] / "reports"


def write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def iv(value: float, lo: float | None = None, hi: float | None = None) -> dict:
    return {"value": value, "lo": value if lo is None else lo,
            "hi": value if hi is None else hi, "units": 40}


def per_loop(k: int, f) -> dict[str, float]:
    """{"k1": f(1), ..., "kK": f(K)}, written in sorted-key order as the stages do."""
    return {f"k{i}": f(i) for i in sorted(range(1, k + 1), key=str)}


def cell(loops: int, **train) -> CellConfig:
    """A cell config at training depth `loops` (depth="lognormal": a paper B backbone)."""
    return tiny_cell(dataclasses.replace(TINY, loops=loops), **train)


def write_config(name: str, config: CellConfig) -> None:
    paths.config_file(name).parent.mkdir(parents=True, exist_ok=True)
    paths.config_file(name).write_text(config.to_json())


def diagnose(k: int, scale: float) -> dict:
    """metrics/diagnose of a cell trained at depth k: norms grow with the loop."""
    out = {"seeds": 1, "units": 40, "unit": "document", "val_tokens": 1000,
           "ppl_at_depth": per_loop(k, lambda i: 100.0 / i),
           "lemma2": {"slope": -1.0 * scale, "scale_ratio": 2.0}}
    for name in ("mean", "median", "p99", "p99_over_median", "share_above_10x_median"):
        out[f"norm_{name}"] = per_loop(k, lambda i: scale * i)
    for name in ("radial_fraction", "radial_fraction_token", "radial_floor", "angular_step",
                 "angular_vs_scale_slope"):
        out[name] = per_loop(k, lambda i: 0.1 * i)
    return out


@pytest.fixture
def paper_a(tmp_path, monkeypatch):
    """Two paper A cells, `short` trained at K = 2 and `long` at K = 3 (10x its norms)."""
    monkeypatch.chdir(tmp_path)
    for name, k, scale in (("short", 2, 1.0), ("long", 3, 10.0)):
        write_config(name, cell(k))
        write(paths.metrics_file("diagnose", name), diagnose(k, scale))
        write(paths.metrics_file("throughput", name),
              {"tokens_per_s": per_loop(k, lambda i: 1000.0 / i)})
        write(paths.metrics_file("clamp", name),
              {"freeze_loop1": {"delta_ce": per_loop(k, lambda i: 0.01 * i)}})
        write(paths.metrics_file("train", name), {"params": 1234})
        write(paths.metrics_file(paths.TRAIN_TIMINGS, name), {"train_seconds": 5.0})
    return tmp_path


# --- reading the run's outputs --------------------------------------------------------


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


# --- every report ----------------------------------------------------------------------


def test_table_display_writes_a_dash_for_what_does_not_apply():
    with pd.option_context("display.precision", 6, "styler.format.precision", 6,
                           "styler.format.na_rep", None, "display.float_format", None):
        table_display()
        fmt = pd.get_option("display.float_format")
        assert fmt(1.234567) == "1.235" and fmt(math.nan) == "-"
        styled = pd.DataFrame({"x": [1.234567, math.nan]}).style.to_html()
        assert ">1.2346</td>" in styled and ">-</td>" in styled and "nan" not in styled
    assert pd.get_option("display.float_format") is None  # restored for other tests


def test_provenance_reads_as_one_line_and_as_a_table():
    prov = {"commit": "abc123", "seeds": "42, 43"}
    assert computed_from(prov) == "Computed from: commit abc123, seeds 42, 43"
    table = provenance_table(prov)
    assert list(table.index) == ["commit", "seeds"] and list(table[""]) == ["abc123", "42, 43"]


def test_claims_are_read_as_judged_and_counted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match="dvc repro claims"):
        claims_table("paper_a")
    rows = [{"claim": c, "verdict": v} for c, v in
            (("a", "holds"), ("b", "contradicted"), ("c", "holds"), ("d", "inconclusive"))]
    write(paths.CLAIMS, {"paper_a": rows, "paper_b": rows[:1], "init_effect": None})
    verdicts = claims_table("paper_a")
    assert list(verdicts["claim"]) == ["a", "b", "c", "d"]
    counts = verdict_counts(verdicts)
    assert counts["holds"] == 2 and list(counts)[0] == "holds" and sum(counts.values()) == 4
    assert verdict_counts(claims_table("paper_b")) == {"holds": 1}
    assert init_effect() == ""  # one recipe group: no sentence


def test_units_statement_names_documents_and_warns_about_blocks(paper_a):
    line = units_statement("diagnose", ["short", "long"])
    assert line == "Intervals resample 40 documents for short, long."
    m = read_metrics("diagnose", "long")
    write(paths.metrics_file("diagnose", "long"),
          {**m, "unit": "block of 4 windows within 2 documents", "units": 32})
    line = units_statement("diagnose", ["short", "long"])
    assert "40 documents for short; 32 units (block of 4 windows within 2 documents)" in line
    assert "span fewer than 10 documents, so the units are blocks" in line


def test_experiment_verdicts_sit_beside_the_default(paper_a):
    assert experiment_verdicts("paper_a") is None  # no committed experiment
    rows = [{"claim": c, "recipe": "ours", "verdict": v}
            for c, v in (("a", "holds"), ("b", "inconclusive"))]
    write(paths.CLAIMS, {"paper_a": rows, "paper_b": []})
    turned = [{**rows[0], "verdict": "contradicted"}, rows[1]]
    write(EXPERIMENTS / "seeds_plus_one.json",
          {"experiment": "seeds_plus_one", "base_commit": "0123456789abcdef",
           "params": {"cells.x.seeds": [43]}, "claims": {"paper_a": turned, "paper_b": []}})
    table, counts, lines = experiment_verdicts("paper_a")
    assert list(table["seeds_plus_one"]) == ["contradicted", "inconclusive"]
    assert counts.loc["inconclusive"].tolist() == [1, 1]
    assert lines == ["`seeds_plus_one` (cells.x.seeds=[43]; run on 0123456): **1 verdict(s) "
                     "turned between holds and contradicted**: a [ours]"]


def test_headline_rows_lead_with_their_cell_group(paper_a):
    write_config("bb", cell(4, depth="lognormal"))
    write(paths.HEADLINE, {"short": {"norm_final": 2.0}, "bb": {"norm_final": 3.0}})
    table = headline_table()
    assert table.loc["bb", "group"] == "paper B backbone"
    assert table.loc["short", "group"] != "paper B backbone"
    assert list(table.columns) == ["group", "norm_final"]


# --- blind_spot -------------------------------------------------------------------------


def test_cell_table_describes_each_cell(paper_a):
    table = cell_table(["short", "long"])
    assert list(table.index) == ["short", "long"]
    assert list(table["loops"]) == [2, 3] and list(table["params"]) == [1234, 1234]
    assert table.loc["long", "units"] == "40 (document)"
    assert table.loc["long", "train s"] == 5.0


def test_per_loop_table_is_in_loop_order_with_every_measurement(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(paths.metrics_file("diagnose", "deep"), diagnose(11, 1.0))  # k10 sorts before k2
    write(paths.metrics_file("throughput", "deep"), {"tokens_per_s": per_loop(11, float)})
    write(paths.metrics_file("clamp", "deep"),
          {"freeze_loop1": {"delta_ce": per_loop(11, float)},
           "remove_radial": {"delta_ce": per_loop(11, lambda i: -i)}})
    table = per_loop_table(["deep"])
    assert list(table["loop"]) == list(range(1, 12))
    assert list(table["ppl"]) == [100.0 / i for i in range(1, 12)]
    assert list(table["mean"]) == [float(i) for i in range(1, 12)]
    assert clamp_modes(table) == ["clamp freeze_loop1", "clamp remove_radial"]
    assert table.loc[table["loop"] == 10, "clamp remove_radial"].item() == -10


def test_final_loop_norms_take_each_cell_at_its_own_depth(paper_a):
    """The norm table once filtered every cell at the deepest cell's K: a cell trained
    shallower had no row. Each cell now reports its own last loop."""
    table = final_loop_norms(per_loop_table(["short", "long"]), {"short": 2, "long": 3})
    assert list(table.index) == ["short", "long"]
    assert list(table["mean"]) == [2.0, 30.0]  # short at k2, long at k3
    assert list(table.columns) == ["mean", "median", "p99", "p99_over_median",
                                   "share_above_10x_median"]
    info = pd.DataFrame({"loss placement": ["per_loop", "final", "per_loop"],
                         "group": ["normed baseline", "normed baseline", "scale-controlled"]},
                        index=["drifts", "terminal", "control"])
    assert list(paper_norms(info)) == ["~39,000 (44M), 56,051 (129M)", "-", "17 to 83"]


def test_perplexity_table_has_a_column_per_depth(paper_a):
    table = perplexity_table(per_loop_table(["short", "long"]))
    assert list(table.columns) == ["K=1", "K=2", "K=3", "PPL(K=1)/PPL(K)"]
    assert table.loc["long", "PPL(K=1)/PPL(K)"] == pytest.approx(3.0)
    assert math.isnan(table.loc["short", "K=3"])
    # each cell at its own K: the short cell's K is 2
    short = table.loc["short"]
    assert short["PPL(K=1)/PPL(K)"] == pytest.approx(short["K=1"] / short["K=2"])


def test_slope_and_lemma2_tables_have_a_row_per_cell(paper_a):
    slopes = slope_table(per_loop_table(["short", "long"]))
    assert list(slopes.columns) == [f"across tokens, loop {k}" for k in (1, 2, 3)]
    assert slopes.loc["long", "across tokens, loop 3"] == pytest.approx(0.3)
    lemma2 = lemma2_table(["short", "long"])
    assert list(lemma2.index) == ["short", "long"] and list(lemma2["slope"]) == [-1.0, -10.0]


def sweep(scales: list[float]) -> pd.DataFrame:
    """tables/sweep of one run: two documents (weights 1 and 3 tokens), per-loop sums."""
    cols = {"seed": [0, 0], "doc": [0, 1], "tokens": [1, 3]}
    for k, s in enumerate(scales, start=1):
        cols[f"ce_{k}"] = [1.0, 3.0]  # sums over the document's tokens: mean 1.0
        cols[f"scale_{k}"] = [s, 3 * s]
        cols[f"step_{k}"] = [0.1, 0.3]
    return pd.DataFrame(cols)


def cell_a(loops: int, table: pd.DataFrame) -> CellA:
    return CellA("normed baseline", "perloop", "normed", "ours", loops, pd.DataFrame(),
                 table, {}, {}, {})


def test_sweep_table_pools_tokens_and_starts_each_cell_afresh():
    data = {"a": cell_a(2, sweep([1.0, 2.0, 4.0])), "b": cell_a(4, sweep([5.0, 6.0]))}
    table = sweep_table(data)
    a, b = table[table["cell"] == "a"], table[table["cell"] == "b"]
    assert list(a["loop"]) == [1, 2, 3] and list(a["scale"]) == [1.0, 2.0, 4.0]
    assert list(a["ppl"]) == pytest.approx([math.e] * 3)
    assert math.isnan(a["scale_prev"].iloc[0]) and list(a["scale_prev"].iloc[1:]) == [1.0, 2.0]
    assert math.isnan(b["scale_prev"].iloc[0])  # not a's last scale
    assert list(b["K"]) == [4, 4]
    trained, swept = depths(pd.DataFrame({"loops": [4, 2, 4]}), table)
    assert trained == [2, 4] and swept == 3


def test_norm_ccdf_is_the_share_at_least_as_large():
    ccdf = norm_ccdf(np.array([4.0, 1.0, 3.0, 2.0]))
    assert list(ccdf["norm"]) == [1.0, 2.0, 3.0, 4.0]
    assert list(ccdf["share"]) == [1.0, 0.75, 0.5, 0.25]
    assert list(ccdf["over_median"]) == pytest.approx([0.4, 0.8, 1.2, 1.6])  # median 2.5


# --- convergence ------------------------------------------------------------------------


def conv(r: int = 4, steps: dict | None = None, useful: int = 4) -> dict:
    """metrics/convergence of a backbone at evaluation depth R = r."""
    steps = {f"k{k}": iv(-0.1) for k in range(1, r)} if steps is None else steps
    return {"reference_depth": r, "max_depth": 4 * r, "seeds": 1, "units": 40,
            "unit": "document", "sampler_mean": float(r),
            "ce_at_depth": per_loop(4 * r, lambda i: 3.0 + 1.0 / i),
            "elasticity": {"gain": iv(0.5), "half_gain": iv(0.1), "steps": steps,
                           "flat": iv(0.01)},
            "saturation": {"useful_depth": useful, "useful_depth_iv": iv(useful, useful - 1,
                                                                         useful)},
            "cross": {"mean_exit_loop": 2.5, "best_depth": r, "delta_ce": iv(0.02),
                      "angle_at_exit": 0.1, "angle_at_best_depth": 0.05}}


def test_backbones_are_the_sampled_depth_cells_described_as_trained():
    configs = {"fixed": cell(4), "bb": cell(8, depth="lognormal")}
    assert backbone_cells(configs) == ["bb"]
    table = backbone_table(["bb"], configs, {"bb": conv(8)})
    row = table.iloc[0]
    assert row["R (model.loops)"] == 8 and row["depth sampler"] == "lognormal"
    assert row["max depth measured"] == 32 and row["resampled"] == "40 units (document)"


def test_a_backbone_recipe_states_how_it_differs_from_paper_bs():
    ours = cell(8, depth="lognormal", depth_sigma=0.1)
    assert recipe_deviation(ours) == ("sampler sigma 0.1, not 0.5; 0 prelude and 0 coda "
                                      "blocks (paper B has both)")
    paper = dataclasses.replace(cell(8, depth="lognormal", depth_sigma=0.5),
                                model=dataclasses.replace(ours.model, n_prelude=1, n_coda=1))
    assert recipe_deviation(paper) == "paper B's"


def test_the_sensitivity_table_marks_a_verdict_that_hinges_on_the_tolerance():
    def with_table(r, found):
        c = conv(r, useful=found[0.01])
        c["nominal_mean"] = float(r)
        c["saturation"]["sensitivity"] = [
            {"kind": "nats", "tolerance": t, "useful_depth_iv": iv(u, u, u)}
            for t, u in found.items()]
        return c

    both = {"bb4": with_table(4, {0.003: 4, 0.01: 3}), "bb": with_table(8, {0.003: 8, 0.01: 5})}
    table, line = sensitivity_table(["bb4", "bb"], both)
    assert table["tolerance"].tolist() == ["0.003 nats", "0.01 nats"]
    assert table["verdict"].tolist() == ["holds", "contradicted"]
    assert table["bb regime"].tolist() == ["in the paper's regime",
                                           "outside the paper's regime"]
    assert "fragile: contradicted at 0.01 nats; holds at 0.003 nats" in line
    steady = {"bb4": with_table(4, {0.003: 4, 0.01: 4}), "bb": with_table(8, {0.003: 8, 0.01: 8})}
    assert sensitivity_table(["bb4", "bb"], steady)[1].endswith("every tolerance: holds.")


def test_worst_step_is_the_step_that_helps_least():
    steps = {"k1": iv(-0.3), "k2": iv(0.02, -0.01, 0.05), "k3": iv(-0.05)}
    k, found = worst_step({"steps": steps})
    assert k == 2 and found.value == 0.02
    assert worst_step({"steps": {}}) is None
    row = elasticity_table(["bb"], {"bb": conv(4, steps)}).iloc[0]
    assert row["worst step CE(k+1) - CE(k)"] == "k = 2: 0.02 [-0.01, 0.05]"
    assert row["CE(1)"] == 4.0 and row["CE(R)"] == 3.25
    assert row["useful depth"] == "4 [3, 4]"
    assert elasticity_table(["one"], {"one": conv(1)}).iloc[0]["worst step CE(k+1) - CE(k)"] \
        == "-"


def test_saturation_gap_is_zero_at_the_best_depth():
    depth, gap = saturation_gap({"k1": 3.5, "k10": 3.15, "k2": 3.2, "k3": 3.1})
    assert depth == [1, 2, 3, 10]
    assert list(gap) == pytest.approx([0.4, 0.1, 0.0, 0.05])


def types_metrics() -> dict:
    return {"judged": ["whitespace", "content word"], "rare": ["number"], "excluded": 7,
            "whitespace": {"mean_loop": 3.0, "share": 0.25},
            "content word": {"mean_loop": 5.0, "share": 0.7},
            "number": {"mean_loop": 4.0, "share": 0.05},
            "whitespace_minus": {"content word": iv(-2.0, -2.5, -1.5)},
            "content_minus": {"whitespace": iv(2.0, 1.5, 2.5)}}


def test_token_table_and_the_convergence_line():
    m = {"reference_depth": 8, "types": types_metrics(),
         "convergence": {"median_loop": iv(6.0, 5.0, 7.0), "median_exit_loop": iv(4.0),
                         "share_after_reference": iv(0.1, 0.08, 0.125), "epsilon": 0.001}}
    by = token_table(m)
    assert list(by.index) == ["whitespace", "content word", "number"]
    assert list(by["judged"]) == ["yes", "yes", "too rare"]
    assert list(by["share"]) == ["25.0%", "70.0%", "5.0%"]
    assert list(by["whitespace - this"]) == ["", "-2 [-2.5, -1.5]", ""]
    assert list(by["content words - this"]) == ["2 [1.5, 2.5]", "", ""]
    assert convergence_line("bb", m) == (
        "`bb`: median convergence loop **6 [5, 7]**, median A1 exit loop 4 [4, 4]; "
        "**10.0%** [8.0%, 12.5%] of tokens still change after R = 8 (epsilon 0.001); "
        "7 special tokens left out.")


def test_token_loops_and_frontier_drop_what_the_reports_do_not_show(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"dvc repro policies@bb"):
        frontier("bb")
    for kind, table in (
            ("convergence", pd.DataFrame({"type": ["whitespace", "special", "number"],
                                          "convergence_loop": [1, 2, 3]})),
            ("policies", pd.DataFrame({"set": ["choose", "report"], "rule": ["kl", "kl"],
                                       "ce": [3.0, 3.1]}))):
        paths.table_file(kind, "bb").parent.mkdir(parents=True)
        table.to_parquet(paths.table_file(kind, "bb"))
    assert list(token_loops("bb")["type"]) == ["whitespace", "number"]
    assert list(frontier("bb")["ce"]) == [3.1]


def policies_metrics() -> dict:
    matched = {"matched": True, "threshold": 0.01, "mean_loops_iv": iv(5.0, 4.5, 5.5),
               "delta_ce": iv(0.001), "flops_ratio": 0.6, "flops_ratio_baseline": 0.8,
               "at_grid_edge": False}
    return {"reference_depth": 8, "baseline_depth": 6, "match_nats": 0.01,
            "uniform": {"ce": {"k6": 3.2, "k8": 3.1}, "delta_ce": iv(0.005),
                        "matched_depth": 6, "flops": {"k6": 60.0, "k8": 80.0}},
            "kl": {**matched, "default": {"threshold": 0.001, "mean_loops": 6.0,
                                          "delta_ce": iv(0.0)}},
            "probe": {"matched": False}, "seeds": 1, "unit": "document", "units": 40}


def test_policy_table_at_matched_quality():
    p = policies_metrics()
    assert exit_rules(p) == ["kl", "probe"]  # uniform depth is A0, kept apart
    assert match_target(p) == pytest.approx(3.11)
    table = policy_table(p).set_index("policy")
    assert table.loc["uniform (A0)", "FLOPs / depth R"] == pytest.approx(0.75)  # 60 / 80
    assert table.loc["kl", "mean loops"] == "5 [4.5, 5.5]"
    assert table.loc["kl", "FLOPs / uniform depth 6"] == 0.8
    assert table.loc["kl", "CE - CE(R) at default"] == "0 [0, 0]"
    assert table.loc["probe", "threshold"] == "no setting matched"


def test_cross_table_reads_each_cells_final_loop_norm(paper_a):
    configs = {"short": cell(2), "long": cell(3)}
    table = cross_table(["short", "long"], configs, {"short": conv(2), "long": conv(3)})
    assert list(table["final-loop norm"]) == [2.0, 30.0]  # at k2 and k3
    assert table.loc["long", "best uniform depth"] == 3
    assert table.loc["long", "CE at exit - CE at best depth"] == "0.02 [0.02, 0.02]"


def bench() -> dict:
    mode = {"realized": {"kl": 1.5}, "mean_loops": {"kl": 5.0}, "flop_speedup": {"kl": 1.3},
            "realized_vs_r": {"kl": 1.8}, "flop_speedup_vs_r": {"kl": 1.6}}
    return {"cell": "bb", "baseline_depth": 6, "scoring": {**mode, "measured_speedup":
                                                              {"kl": 1.4}},
            "generation_batch1": mode, "generation_batched": mode}


def test_the_runtime_goal_line_says_when_flops_leave_no_room():
    b = bench()  # realized 1.5x but a FLOP speedup of 1.3x in every mode
    line = runtime_goal(b)
    assert line.startswith("**Goal 1.4x** realized against depth 6: best 1.50x (kl, ")
    assert "met." in line and "out of reach by FLOPs" in line
    for mode in ("scoring", "generation_batch1", "generation_batched"):
        b[mode] = {**b[mode], "realized": {"kl": 1.1}, "flop_speedup": {"kl": 1.6}}
    line = runtime_goal(b)
    assert "not met" in line and "leaves room for it" in line


def test_exit_benchmark_tables_and_regime(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert exit_benchmark() is None  # this run did not time its exits
    write(paths.bench_file("exits"), bench())
    b = exit_benchmark()
    table = speedup_table(b)
    assert list(table["mode"]) == ["scoring", "generation_batch1", "generation_batched"]
    assert list(table["measured speedup vs depth 6"].isna()) == [False, True, True]
    assert profile_table(b) is None
    b["profile"] = {"policy": "kl", "top_ops": [{"op": "mm", "ms": 1.23456}]}
    assert profile_table(b).to_dict("records") == [{"op": "mm", "ms": 1.235}]
    assert exit_regime(b, {}) is None  # no convergence metrics of the timed cell
    inside = exit_regime(b, {"bb": conv(8, useful=8)})
    assert inside.endswith("read in the paper's regime (bb: useful depth 8 [7, 8] vs "
                           "0.75 m = 6).")
    outside = exit_regime(b, {"bb": conv(8, useful=3)})
    assert "read outside the paper's regime (bb: useful depth 3 [2, 3] vs 0.75 m = 6): a " \
           "backbone that does not need its depth" in outside


# --- the notebooks ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["blind_spot", "convergence", "index"])
def test_the_notebooks_read_no_file_and_compute_nothing(name):
    """A report's tables and numbers come from loopscope.render.report_tables (tested above):
    a notebook that reads files itself, defines helpers or does arithmetic with numpy
    holds logic no test sees."""
    nb = json.loads((REPORTS / f"{name}.ipynb").read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    for pattern in (r"^\s*def ", r"^import (json|numpy)", r"\bnp\.", r"read_text\(",
                    r"read_parquet\(", r"\.mean\(", r"\bsum\("):
        assert not re.search(pattern, code, re.M), f"{name}: {pattern}"
