"""Paper B's report tables, curves and sentences (loopscope.render.tables_b) and its
figures (loopscope.render.figures_b), from constructed metrics."""

import dataclasses

import matplotlib
import pandas as pd
import pytest
from report_data import cell, diagnose, iv, per_loop, write

from loopscope.base import paths
from loopscope.base.errors import DataError
from loopscope.judge import paper_b
from loopscope.judge.backbone import recipe_deviation, worst_step
from loopscope.judge.criteria import Criteria
from loopscope.judge.metrics_b import Elasticity
from loopscope.judge.params import ClaimsConfig
from loopscope.render import figures_b, tables_b
from loopscope.render.tables_b import (
    Inputs,
    acceleration_line,
    backbone_table,
    change_curves,
    convergence_line,
    cross_table,
    cycle_table,
    depth_check_line,
    elasticity_curves,
    elasticity_table,
    exit_benchmark,
    exit_regime,
    exit_rules,
    exit_shares,
    frontier,
    ledger_bars,
    ledger_lines,
    ledger_table,
    match_target,
    policy_table,
    profile_table,
    runtime_goal,
    saturation_curves,
    sensitivity_table,
    settling_line,
    settling_table,
    speedup_bars,
    speedup_table,
    token_loops,
    token_table,
    type_order,
    untimed_line,
)

matplotlib.use("Agg")
VALUES = {f.name: getattr(ClaimsConfig(), f.name) for f in dataclasses.fields(ClaimsConfig)}


def conv(r: int = 4, steps: dict | None = None, useful: int = 4) -> dict:
    """metrics/convergence of a backbone at evaluation depth R = r."""
    steps = {f"k{k}": iv(-0.1) for k in range(1, r)} if steps is None else steps
    return {"r": r, "max_depth": 4 * r, "seeds": 1, "units": 40,
            "unit": "document", "sampler_mean": float(r),
            "ce_at_depth": per_loop(4 * r, lambda i: 3.0 + 1.0 / i),
            "kl": per_loop(4 * r, lambda i: 10.0 ** -i),
            "state_change": per_loop(4 * r, lambda i: 2.0 ** -i),
            "elasticity": {"gain": iv(0.5), "half_gain": iv(0.1), "steps": steps,
                           "flat": iv(0.01)},
            "cycle": {"late_from": 3 * r, "late_to": 4 * r, "two_step_ratio": iv(1.4)},
            "saturation": {"useful_depth": useful, "share": 0.02,
                           "useful_depth_iv": iv(useful, useful - 1, useful)},
            "cross": {"mean_exit_loop": 2.5, "best_depth": r, "delta_ce": iv(0.02),
                      "angle_at_exit": 0.1, "angle_at_best_depth": 0.05, "epsilon": 0.001,
                      "exit_share": per_loop(r, lambda i: 1.0 / r)}}


def inputs(convs: dict, configs: dict | None = None, pol: dict | None = None,
           main: str | None = None, second: str | None = None) -> Inputs:
    configs = configs or {c: cell(m["r"], depth="lognormal") for c, m in convs.items()}
    backbones = [c for c, cfg in configs.items() if cfg.train.samples_depth]
    return Inputs(list(convs), configs, convs, pol or {}, backbones, main, second,
                  Criteria(VALUES))


def test_backbones_are_the_sampled_depth_cells_described_as_trained():
    x = inputs({"fixed": conv(4), "bb": conv(8)},
               {"fixed": cell(4), "bb": cell(8, depth="lognormal")})
    assert x.backbones == ["bb"]
    row = backbone_table(x).iloc[0]
    assert row["R (model.loops)"] == 8 and row["depth sampler"] == "lognormal"
    assert row["max depth measured"] == 32
    assert row["resampled"] == "bb: 40 units (document), one seed: conditional on that " \
                               "trained model"


def test_a_backbone_recipe_states_how_it_differs_from_paper_bs():
    ours = cell(8, depth="lognormal", depth_sigma=0.1)
    assert recipe_deviation(ours) == ("sampler sigma 0.1, not 0.5; 0 prelude and 0 coda "
                                      "blocks (paper B has both)")
    paper = dataclasses.replace(cell(8, depth="lognormal", depth_sigma=0.5),
                                model=dataclasses.replace(ours.model, n_prelude=1, n_coda=1))
    assert recipe_deviation(paper) == "paper B's"


def test_the_sensitivity_table_says_when_the_tolerance_turns_the_verdict(monkeypatch):
    def with_table(r, found):
        c = conv(r, useful=found[0.01])
        c["nominal_mean"] = float(r)
        c["saturation"]["sensitivity"] = [
            {"kind": "nats", "tolerance": t, "useful_depth_iv": iv(u, u, u)}
            for t, u in found.items()]
        return c

    def judged(x):
        """The claims stage's saturation row on these metrics, as claims.json holds it:
        the report draws its table from that record and judges nothing itself."""
        j = paper_b._Judging(x.conv, x.pol, [x.main, x.second], x.criteria)
        record = paper_b._saturation_row(j).record()
        monkeypatch.setattr(tables_b, "claims",
                            lambda: {"paper_b": [{**record, "id": "B.saturation"}]})
        return x

    x = judged(inputs({"bb4": with_table(4, {0.003: 4, 0.01: 3}),
                       "bb": with_table(8, {0.003: 8, 0.01: 5})}, main="bb", second="bb4"))
    table, line = sensitivity_table(x)
    assert table["tolerance"].tolist() == ["0.003 nats", "0.01 nats"]
    assert table["verdict"].tolist() == ["holds", "contradicted"]
    assert table["bb regime"].tolist() == ["in the paper's regime",
                                           "outside the paper's regime"]
    assert line == "**The saturation verdict changes with the tolerance** (contradicted, holds)."
    steady = judged(inputs({"bb4": with_table(4, {0.003: 4, 0.01: 4}),
                            "bb": with_table(8, {0.003: 8, 0.01: 8})}, main="bb",
                           second="bb4"))
    assert sensitivity_table(steady)[1].endswith("every tolerance: holds.")
    assert sensitivity_table(inputs({"bb": conv(8)}, main="bb"))[1].startswith(
        "The saturation test needs two backbones")


def test_worst_step_is_the_step_that_helps_least():
    steps = {"k1": iv(-0.3), "k2": iv(0.02, -0.01, 0.05), "k3": iv(-0.05)}
    k, found = worst_step(Elasticity.of({"steps": steps}))
    assert k == 2 and found.value == 0.02
    assert worst_step(Elasticity.of({"steps": {}})) is None
    row = elasticity_table(inputs({"bb": conv(4, steps)})).iloc[0]
    assert row["worst step CE(k+1) - CE(k)"] == "k = 2: 0.02 [-0.01, 0.05]"
    assert row["CE(1)"] == 4.0 and row["CE(R)"] == 3.25
    assert row["useful depth"] == "4 [3, 4]"
    one = elasticity_table(inputs({"one": conv(1)})).iloc[0]
    assert one["worst step CE(k+1) - CE(k)"] == "-"


def test_curves_are_in_loop_order_a_row_per_point():
    x = inputs({"bb": conv(4)})
    curves = elasticity_curves(x)
    assert list(curves["depth"]) == list(range(1, 17)) and set(curves["r"]) == {4}
    changes = change_curves(x)
    assert list(changes["loop"]) == list(range(1, 17)) and changes["backbone"].all()
    assert changes["kl"].iloc[2] == pytest.approx(1e-3)
    shares = exit_shares(x)
    assert list(shares["loop"]) == [1, 2, 3, 4]
    cyc = cycle_table(x).iloc[0]
    assert cyc["late_from"] == 12 and cyc["two_step_ratio"] == "1.4 [1.4, 1.4]"


def test_saturation_curves_are_zero_at_the_best_depth_with_each_margin():
    c = conv(4)
    c["ce_at_depth"] = {"k1": 3.5, "k10": 3.15, "k2": 3.2, "k3": 3.1}
    found = saturation_curves(inputs({"bb": c}))
    assert list(found["depth"]) == [1, 2, 3, 10]
    assert list(found["gap"]) == pytest.approx([0.4, 0.1, 0.0, 0.05])
    assert found["margin"].iloc[0] == pytest.approx(0.02 * 0.4)
    assert found["label"].iloc[0] == "bb (R = 4, useful depth 4 [3, 4])"


def types_metrics() -> dict:
    return {"judged": ["whitespace", "content_word"], "rare": ["number"], "excluded": 7,
            "whitespace": {"mean_loop": 3.0, "share": 0.25},
            "content_word": {"mean_loop": 5.0, "share": 0.7},
            "number": {"mean_loop": 4.0, "share": 0.05},
            "whitespace_minus": {"content_word": iv(-2.0, -2.5, -1.5)},
            "content_minus": {"whitespace": iv(2.0, 1.5, 2.5)}}


def test_token_table_and_the_convergence_line():
    m = {"r": 8, "types": types_metrics(),
         "convergence": {"median_loop": iv(6.0, 5.0, 7.0), "median_exit_loop": iv(4.0),
                         "share_after_r": iv(0.1, 0.08, 0.125), "epsilon": 0.001}}
    by = token_table(m)
    assert list(by.index) == ["whitespace", "content_word", "number"]
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
    tokens = token_loops("bb")
    assert list(tokens["type"]) == ["whitespace", "number"]
    assert type_order(tokens) == ["whitespace", "number"]
    assert list(frontier("bb")["ce"]) == [3.1]


def test_the_settling_table_shows_each_cells_label_shares_by_type(tmp_path, monkeypatch):
    """One table across cells: per cell measured, all tokens then each type present, the
    share of each label with its interval; a cell whose metrics predate it is left out."""
    monkeypatch.chdir(tmp_path)
    n = 40
    late = {}
    for w in ("1", "1.5", "2"):
        late.update({f"floor_{w}R": [0.0] * 20 + [1e-3] * 20, f"floor_se_{w}R": [0.0] * n,
                     f"backward_{w}R": [0.0] * 30 + [1.0] * 10,
                     f"kl_alternation_{w}R": [0.0] * n})
    table = pd.DataFrame({"seed": 0, "doc": [i // 2 for i in range(n)],
                          "type": ["whitespace", "content_word"] * 20,
                          "change_last": [1e-3] * n, **late})
    paths.table_file("convergence", "bb").parent.mkdir(parents=True)
    table.to_parquet(paths.table_file("convergence", "bb"))
    windows = {"1R": {"from": 12, "to": 16}}
    x = inputs({"bb": {**conv(), "settling": {"windows": windows}}, "old": conv()})
    shown = settling_table(x, resamples=100)
    assert list(shown.columns) == ["cell", "type", "tokens", "settling", "cycling",
                                   "drifting"]
    assert list(shown["type"]) == ["all", "whitespace", "content_word"]
    assert set(shown["cell"]) == {"bb"} and list(shown["tokens"]) == [40, 20, 20]
    assert shown["settling"][0].startswith("50.0% [") and shown["cycling"][0].startswith(
        "25.0% [")
    line = settling_line(x)  # the thresholds the claims judged at, in words
    assert "last 1R loops" in line and "below 0.1 x its change" in line and "75%" in line


def policies_metrics() -> dict:
    matched = {"matched": True, "threshold": 0.01, "mean_loops_iv": iv(5.0, 4.5, 5.5),
               "delta_ce": iv(0.001), "flops_ratio": 0.6, "flops_ratio_baseline": 0.8,
               "at_grid_edge": False}
    return {"r": 8, "baseline_depth": 6, "match_nats": 0.01,
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
    write(paths.metrics_file("diagnose", "short"), diagnose(2, 1.0))
    write(paths.metrics_file("diagnose", "long"), diagnose(3, 10.0))
    x = inputs({"short": conv(2), "long": conv(3)}, {"short": cell(2), "long": cell(3)})
    table = cross_table(x)
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
    bars = speedup_bars(b)
    assert len(bars) == 6 and set(bars["against"]) == {"realized vs depth 6",
                                                       "realized vs depth R"}
    assert profile_table(b) is None
    b["profile"] = {"policy": "kl", "top_ops": [{"op": "mm", "ms": 1.23456}]}
    assert profile_table(b).to_dict("records") == [{"op": "mm", "ms": 1.235}]
    assert exit_regime(b, inputs({})) is None  # no convergence metrics of the timed cell
    inside = exit_regime(b, inputs({"bb": conv(8, useful=8)}))
    assert inside.endswith("read in the paper's regime (bb: useful depth 8 [7, 8] vs "
                           "0.75 m = 6).")
    outside = exit_regime(b, inputs({"bb": conv(8, useful=3)}))
    assert "read outside the paper's regime (bb: useful depth 3 [2, 3] vs 0.75 m = 6): a " \
           "backbone that does not need its depth" in outside


def test_every_figure_draws_with_an_alt_text_that_names_what_it_shows():
    x = inputs({"bb": conv(4), "bb8": conv(8)})
    palette = {"bb": (0.1, 0.2, 0.3), "bb8": (0.3, 0.2, 0.1)}
    tokens = pd.DataFrame({"type": ["whitespace", "content_word"] * 3,
                           "convergence_loop": [1, 3, 2, 4, 1, 5],
                           "first_below_loop": [1, 2, 2, 3, 1, 4]})
    settings = pd.DataFrame({"rule": ["uniform"] * 2 + ["kl"] * 2, "mean_loops": [4, 8, 3, 5],
                             "flops": [4.0, 8.0, 3.5, 5.5], "ce": [3.3, 3.1, 3.35, 3.12],
                             "default": [False, False, True, False]})
    drawn = [figures_b.elasticity(elasticity_curves(x), palette),
             figures_b.changes(change_curves(x), palette),
             figures_b.token_loops("bb", tokens, x.conv["bb"], ["whitespace", "content_word"],
                                   palette["bb"]),
             figures_b.frontier("bb", settings, 3.11, ["kl"]),
             figures_b.saturation(saturation_curves(x), palette),
             figures_b.exit_shares(exit_shares(x), palette),
             figures_b.speedup(speedup_bars(bench()), 6)]
    for d in drawn:
        assert len(d.alt) > 60 and "nan" not in d.alt, d.alt
    assert "bb, bb8" in drawn[0].alt and "1.80x" in drawn[-1].alt
    for d in drawn:
        matplotlib.pyplot.close(d.fig)


def with_ledger(b: dict, policy_wall: float = 1.0, measured: float = 1.05) -> dict:
    parts = {"loop": 0.5, "kv": 0.1, "gather": 0.1, "check": 0.2, "once": 0.05}
    uniform = {"loop": 0.8, "kv": 0.05, "gather": 0.02, "check": 0.0, "once": 0.05}
    def total(p, wall):
        return {**p, "rest": wall - sum(p.values()), "wall": wall}
    mode = {"parts": {"uniform_6": total(uniform, 1.0), "kl": total(parts, policy_wall)},
            "measured": {"uniform_6": 1.0, "kl": measured}}
    labels = {"loop": "loops", "kv": "key/value handling", "gather": "gathering",
              "check": "exit checks", "once": "once per token"}
    return {**b, "ledger": {"policy": "kl", "uniform_depth": 6, "labels": labels,
                            "modes": {m: mode for m in ("scoring", "generation_batch1",
                                                        "generation_batched")}}}


def test_the_ledger_table_and_lines_say_where_the_time_goes():
    assert ledger_table(bench()) is None and ledger_lines(bench()) == []
    b = with_ledger(bench())
    table = ledger_table(b)
    scoring = table[table["mode"] == "scoring"].set_index("part")
    assert list(scoring.index[:6]) == ["loops", "once per token", "exit checks",
                                       "key/value handling", "gathering",
                                       "rest: Python, operator launch"]
    assert scoring.loc["exit checks", "policy - uniform (s)"] == pytest.approx(0.2)
    assert scoring.loc["sum of the parts (timed wall)", "kl (s)"] == 1.0
    assert scoring.loc["measured without the marks (median)", "kl (s)"] == 1.05
    line = ledger_lines(b)[0]
    assert line.startswith("**scoring**: `kl` 1.000 s against 1.000 s for uniform 6")
    assert "add up to 95% of its time without the marks, 1.050 s, within 10%" in line
    assert "FLOP ratio of 1.30x" in line and "fall by 0.231 s, to 0.769 s" in line
    assert "+0.300 s on key/value handling" in line and "-0.300 s on the loops" in line
    assert "within reach only if those overheads shrink" in line  # loops + once: 0.55 s
    far = with_ledger(bench(), measured=1.5)
    assert "outside 10%" in ledger_lines(far)[0]
    fast = ledger_lines(with_ledger(bench(), policy_wall=0.6, measured=0.6))[0]
    assert "realized 1.67x" in fast and "fall by" not in fast
    assert "at or beyond the FLOP ratio (0.769 s matches it)" in fast
    assert fast.endswith("1.4x needs 0.714 s: reached.")
    bars = ledger_bars(b)
    assert set(bars["run"]) == {"uniform 6", "kl"} and len(bars) == 3 * 2 * 6


def test_the_acceleration_row_says_whether_it_beats_a1_in_flops():
    p = policies_metrics()
    assert acceleration_line(p) == "latent-acceleration or A1 was not swept on this backbone."
    p["latent-acceleration"] = {**p["kl"], "mean_loops": 5.5, "flops_ratio": 0.55,
                                "flops_ratio_iv": iv(0.55, 0.5, 0.6)}
    p["kl"]["mean_loops"] = 5.0
    line = acceleration_line(p)
    assert "FLOPs 0.55 [0.5, 0.6] of depth R and 0.800 of uniform depth 6 (the baseline A1 " \
           "is held to)" in line and line.endswith("in fewer FLOPs than A1.")
    p["latent-acceleration"]["flops_ratio"] = 0.7
    assert acceleration_line(p).endswith("in no fewer FLOPs than A1.")
    p["latent-acceleration"]["flops_ratio_baseline"] = 1.2  # beats A1, not uniform depth 6
    assert acceleration_line(p).endswith("in no fewer FLOPs than A1, and in no fewer than "
                                         "uniform depth 6.")
    p["latent-acceleration"] = {"matched": False}
    assert acceleration_line(p).startswith("latent-acceleration matched depth R's quality at no")


def checked(ratio: float, holds: bool, retimed: int = 0) -> dict:
    return {"uniform": [8, 6], "ratio": ratio, "bound": 8 / 6 * 1.1, "holds": holds,
            "rounds": 3, "retimed": retimed, "failed_rounds": 0 if holds else 3,
            "spread": 0.05, "extended": False}


def test_the_page_flags_a_mode_whose_timings_do_not_add_up():
    b = {**bench(), "r": 8}
    assert "taken before the check" in depth_check_line(b)  # older timings: said so
    assert set(speedup_table(b)["depth check"]) == {"not checked"}
    for mode in ("scoring", "generation_batch1", "generation_batched"):
        b[mode] = {**b[mode], "depth_check": checked(1.3, True)}
    b["generation_batch1"]["depth_check"] = checked(2.1, False, retimed=3)
    line = depth_check_line(b)
    assert "at most 8/6 = 1.33x the time of uniform depth 6; the bound, with slack for " \
           "jitter, is 1.47x" in line
    assert "generation_batch1 2.10x, **fails** (3 rounds kept, 3 retimed, 3 still over)" \
           in line and "scoring 1.30x, holds" in line
    assert "**Flagged: generation_batch1**" in line
    table = speedup_table(b).set_index("mode")
    assert table.loc["generation_batch1", "depth check"] == "fails"
    assert table.loc["scoring", "depth check"] == "holds"
    assert list(table.columns[-4:]) == ["realized vs depth R", "FLOP speedup vs depth R",
                                        "measured speedup vs depth R", "depth check"]
    for mode in ("scoring", "generation_batched"):  # the best realized is batch 1's, flagged
        b[mode]["realized"] = {"kl": 1.0}
    assert "(kl, generation_batch1) (that mode fails the depth check)" in runtime_goal(b)
    b["generation_batch1"]["depth_check"] = checked(1.3, True)
    assert depth_check_line(b).endswith("Every mode's timings add up.")
    assert depth_check_line({**b, "baseline_depth": 8}).startswith(
        "**Depth check**: the baseline is depth R = 8")


def test_the_page_names_the_timed_rules_left_out():
    assert untimed_line(bench()) is None
    line = untimed_line({**bench(), "not_timed": {"cosine": "no setting matched"}})
    assert line == "Not timed: `cosine` (no setting matched)."
