"""Every paper A verdict can come out either way: constructed cells (the tables of
diagnose, the depth sweep and the clamp, per token and seed)."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from loopscope.judge.criteria import Criteria
from loopscope.judge.group_a import CellA, GroupA, on_each_seed, seed_groups
from loopscope.judge.paper_a import CLAIMS_A, READS_CONTROLS, init_effect, paper_a_claims
from loopscope.judge.params import ClaimsConfig
from loopscope.judge.verdicts import Claim, all_of, at_least, effect, negligible
from loopscope.stats.intervals import Documents, Interval, bootstrap, bootstrap_mean
from loopscope.stats.units import FEWEST_UNITS

VALUES = {f.name: getattr(ClaimsConfig(), f.name) for f in dataclasses.fields(ClaimsConfig)}


def test_document_bootstrap_is_wider_than_a_token_bootstrap_when_documents_differ():
    rng = np.random.default_rng(0)
    docs = np.repeat(np.arange(20), 200)
    values = rng.normal(size=20)[docs] + 0.1 * rng.normal(size=len(docs))
    by_doc = bootstrap_mean(values, docs, 500)
    by_token = bootstrap_mean(values, np.arange(len(values)), 500)
    assert by_doc.lo < by_doc.value < by_doc.hi
    assert (by_doc.hi - by_doc.lo) > 3 * (by_token.hi - by_token.lo)
    ratio = bootstrap({"a": values, "n": np.ones_like(values)}, docs,
                      lambda s: s["a"] / s["n"], 500)
    assert ratio.value == pytest.approx(values.mean())


DOCS, PER_DOC, LOOPS, SWEEP = 20, 50, 4, 12


def cell_a(group: str = "scale-controlled", readout: str = "raw", loss: str = "per_loop",
           norm=(20.0, 20.0), tail=(0.1, 0.1), ce=(4.3, 3.8), cos=1e-2, slope=0.0,
           clamp=0.001, recipe: str = "ours", seed: int = 0, ce_at=None,
           clamp_modes=("freeze_loop1", "remove_radial"), grow: float = 1.5,
           control: str | None = None, paper: bool = True) -> CellA:
    """A constructed cell: per-token norms at loops 1 and K (lognormal: centre, sigma),
    CE at loops 1 and K (linear between; ce_at: the CE of every loop instead), radial
    fraction at K; a sweep whose angular step goes like s**slope while the scale grows
    `grow`-fold per loop (the 1/s law: slope -1); clamp delta CE at K in each of
    clamp_modes. control: what controls its scale (default: "raw readout" for a raw
    scale-controlled cell); paper: one of paper A's seven conditions."""
    if control is None:
        control = "raw readout" if group == "scale-controlled" and readout == "raw" else ""
    rng = np.random.default_rng(seed)
    n = DOCS * PER_DOC
    doc = np.repeat(np.arange(DOCS), PER_DOC)
    noise = rng.normal(0, 0.05, n)
    tokens = {"doc": doc}
    for k in range(LOOPS + 1):
        f = k / LOOPS
        centre = norm[0] * (norm[1] / norm[0]) ** f
        sigma = tail[0] + (tail[1] - tail[0]) * f
        tokens[f"norm_{k}"] = centre * rng.lognormal(0, sigma, n)
    for k in range(1, LOOPS + 1):
        mean = ce[0] + (ce[1] - ce[0]) * (k - 1) / (LOOPS - 1) if ce_at is None else ce_at[k - 1]
        tokens[f"ce_{k}"] = mean + noise
        tokens[f"cos_{k}"] = cos * rng.lognormal(0, 0.3, n)
        tokens[f"floor_{k}"] = np.full(n, 1e-9)
    sweep = {"doc": np.arange(DOCS), "tokens": np.full(DOCS, float(PER_DOC))}
    level = 10.0 * rng.lognormal(0, 0.02, DOCS)  # each document's s_0
    before = level
    for k in range(1, SWEEP + 1):
        scale = level * grow ** k
        step = 0.3 * (1.5 ** (k - 1)) ** slope * rng.lognormal(0, 0.02, DOCS)
        sweep[f"scale_{k}"] = scale * PER_DOC
        sweep[f"step_{k}"] = step * PER_DOC
        sweep[f"step_x_scale_{k}"] = step * before * PER_DOC
        sweep[f"radial_{k}"] = (scale - before) * PER_DOC
        before = scale
    offset = rng.normal(0, 0.005, DOCS)[doc]  # each document's own change
    clamped = pd.DataFrame({"doc": doc, **{m: clamp + offset for m in clamp_modes}})
    return CellA(group, loss, readout, recipe, LOOPS, pd.DataFrame(tokens), pd.DataFrame(sweep),
                 clamped, {f"k{k}": 4000.0 / k for k in range(1, 5)},
                 {f"k{k}": 1e6 for k in range(1, 5)}, control=control, d_model=128,
                 paper=paper)


# The drifting cell: its norm grows 250-fold with a heavy tail (log-normal sigma 1.2 at K:
# 2.7% of the tokens beyond 10x the median), K-invariant CE, no radial gradient.
NORMED = dict(group="normed baseline", readout="normed", norm=(40.0, 10000.0),
              tail=(0.1, 1.2), ce=(4.4, 4.4), cos=1e-9, slope=-1.0)
FINAL_NORM = dict(group="final-norm only", readout="final_norm", norm=(15.0, 15.0), seed=4)


# The inter-loop norm: scale-controlled, not one of paper A's seven conditions
INTERLOOP = dict(readout="normed", ce=(4.25, 3.9), cos=1e-9, seed=10, norm=(15.0, 15.0),
                 control="inter-loop norm", paper=False)


def paper_a_cells(**normed) -> dict[str, CellA]:
    return {
        "perloop_normed": cell_a(**{**NORMED, **normed}),
        "perloop_raw": cell_a(seed=1),
        "perloop_penalty": cell_a(readout="normed", ce=(4.2, 3.85), cos=1e-9, seed=2,
                                  control="norm penalty"),
        "perloop_final_norm": cell_a(**FINAL_NORM),
        "perloop_interloop_norm": cell_a(**INTERLOOP),
    }


def rows(cells: dict[str, CellA], resamples: int = 200, **values: float) -> dict[str, Claim]:
    """The first recipe group's rows by key, judged at VALUES (changed by `values`)."""
    out: dict[str, Claim] = {}
    for c in paper_a_claims(cells, {**VALUES, **values}, resamples):
        out.setdefault(c.key, c)
    return out


def verdicts_a(cells: dict[str, CellA]) -> dict[str, str]:
    return {k: c.direction for k, c in rows(cells).items()}


def test_paper_a_claims_hold_on_paper_like_metrics():
    found = rows(paper_a_cells())
    every = {k: found.pop(k) for k in list(found) if k.endswith("_every")}
    assert list(found) == list(CLAIMS_A)
    assert sorted(every) == sorted(f"{k}_every" for k in READS_CONTROLS)
    # an _every row extends the finding its row is, or the one its extension extends
    assert {(c.kind, c.extends) for c in every.values()} == {
        ("extension", found[k].extends or k) for k in READS_CONTROLS}
    assert found.pop("stable_injection").direction == "not shown"  # no such cell here
    assert {c.direction for c in found.values()} == {"holds"}, \
        [(c.claim, c.value) for c in found.values() if c.direction != "holds"]
    assert {c.magnitude for c in found.values()} <= {"holds", "n/a"}
    assert {k: (c.kind, c.extends) for k, c in found.items() if c.kind == "extension"} == {
        "final_norm": ("extension", "drift"), "interloop_norm": ("extension", "drift"),
        "inverse_scale_controls": ("extension", "inverse_scale"),
        "depth_gain_over_baseline": ("extension", "depth_gain"),
        "frontier_throughput": ("extension", "frontier"),
        "clamp_other": ("extension", "clamp")}
    # a counted finding reads one statistic, the paper's
    for c in found.values():
        if c.kind == "finding":
            assert len({t.reads for t in c.tests + c.magnitude_tests}) == 1, c.key
    assert {found[k].kind for k in ("lemma1", "radial_fractions")} == {"check"}


@pytest.mark.parametrize("claim, normed, verdict", [
    ("drift", dict(norm=(40.0, 8.0)), "contradicted"),  # mean 16 under the controls
    ("heavy_tail", dict(tail=(0.6, 0.1)), "contradicted"),
    ("heavy_tail", dict(tail=(0.1, 0.5)), "contradicted"),  # wider, yet no token beyond 10x
    ("lemma1", dict(cos=1e-1), "contradicted"),
    ("radial_fractions", dict(cos=1e-1), "contradicted"),
    ("activity", dict(grow=1.0), "contradicted"),  # the update keeps the scale
    ("inverse_scale", dict(slope=0.5), "contradicted"),
    ("k_invariance", dict(ce=(4.5, 4.0)), "contradicted"),
    ("k_invariance", dict(ce=(4.01, 4.0)), "inconclusive"),
    ("depth_gain_over_baseline", dict(ce=(5.0, 4.0)), "contradicted"),
    # the baseline gains 0.3 nats, the controls 0.5 and 0.35: more, but not twice as much
    ("depth_gain_over_baseline", dict(ce=(4.3, 4.0)), "contradicted"),
    ("depth_gain", dict(ce=(4.3, 4.0)), "holds"),  # the controls' own gains: the finding
    ("frontier", dict(ce=(3.0, 3.0)), "contradicted"),
    ("clamp", dict(clamp=0.05), "contradicted"),
    ("clamp", dict(clamp=0.009), "inconclusive"),
    ("clamp", dict(clamp_modes=()), "not shown"),
    ("clamp_other", dict(clamp=0.05), "contradicted"),
    ("clamp_other", dict(clamp_modes=("freeze_loop1",)), "not shown"),
])
def test_each_paper_a_claim_can_fail(claim, normed, verdict):
    assert verdicts_a(paper_a_cells(**normed))[claim] == verdict


def test_lemma2_magnitude_fails_when_the_step_does_not_shrink_like_one_over_s():
    found = rows(paper_a_cells(slope=-0.2))["inverse_scale"]
    assert found.claim.startswith("The angular 1/s law")
    assert (found.direction, found.magnitude) == ("holds", "contradicted")


def test_a_mean_shift_is_not_a_heavy_tail():
    # every token grows alike: p99/median stays put
    found = verdicts_a(paper_a_cells(tail=(0.3, 0.3)))
    assert found["heavy_tail"] in ("inconclusive", "contradicted")


def test_the_drift_magnitude_is_judged_against_the_papers_smallest_ratio():
    # a ratio of about 200: the old bar (100) passed it, the paper's smallest (470) does not
    found = rows(paper_a_cells(norm=(40.0, 2000.0)))["drift"]
    assert (found.direction, found.magnitude) == ("holds", "contradicted"), found.value
    assert "470" in found.criterion and "39,000" in found.paper_says


def test_the_drift_row_names_the_controls_the_group_has_and_lacks():
    cells = paper_a_cells()
    cells["perloop_raw"] = dataclasses.replace(cells["perloop_raw"], control="raw readout")
    cells["perloop_penalty"] = dataclasses.replace(cells["perloop_penalty"],
                                                   control="norm penalty")
    found = rows(cells)
    text = found["drift"].claim
    assert "perloop_raw (raw readout)" in text and "perloop_penalty (norm penalty)" in text
    assert "inter-loop" not in text and "no " not in text.split(":")[-1]  # the paper's two
    wide = found["drift_every"].claim
    assert "perloop_interloop_norm (inter-loop norm)" in wide
    assert "no stable injection cell" in wide
    del cells["perloop_penalty"]
    assert "this group has no norm penalty cell" in rows(cells)["drift"].claim


def test_a_final_norm_cell_that_drifts_contradicts_the_design_rule():
    cells = paper_a_cells()
    cells["perloop_final_norm"] = cell_a(**{**NORMED, **FINAL_NORM, "norm": (40.0, 20000.0)})
    found = rows(cells)["final_norm"]
    assert (found.direction, found.magnitude) == ("contradicted", "contradicted"), found.value
    del cells["perloop_final_norm"]
    assert rows(cells)["final_norm"].direction == "not shown"


def test_a_control_whose_last_loop_gets_worse_gains_but_not_with_every_loop():
    cells = paper_a_cells()
    cells["perloop_raw"] = cell_a(ce_at=(4.3, 3.9, 3.7, 3.8), seed=1)
    found = rows(cells)
    assert found["depth_gain"].direction == "holds", found["depth_gain"].value  # the endpoint
    assert found["depth_monotone"].direction == "contradicted", found["depth_monotone"].value
    assert "last loop worse than loop 3" in found["depth_monotone"].value


def test_a_control_with_a_negative_own_gain_contradicts_the_depth_rows():
    """The baseline gains nothing and the control loses from depth: "0.5 x its gain -
    the baseline's" is negative too (the extension), but the finding fails on the
    control's own gain, and the loop-by-loop row on its steps."""
    cells = paper_a_cells()
    cells["perloop_raw"] = cell_a(ce=(3.8, 4.3), seed=1)
    found = rows(cells)
    for key in ("depth_gain", "depth_monotone", "depth_gain_over_baseline"):
        assert found[key].direction == "contradicted", found[key].value
    assert any(t.statistic == "perloop_raw: CE(1) - CE(K)" and t.verdict() ==
               "contradicted" for t in found["depth_gain"].tests)
    assert any(t.statistic.startswith("perloop_raw: CE(") and t.verdict(len(
        found["depth_monotone"].tests)) == "contradicted" for t in found["depth_monotone"].tests)


def test_a_timing_that_rises_with_depth_is_flagged_not_read():
    cells = paper_a_cells()
    cells["perloop_raw"].tokens_per_s.update(k2=5000.0)  # the best control: its timing is read
    found = rows(cells)["frontier"]
    assert "not falling with depth" in found.value and found.direction == "holds"


def test_the_throughput_frontier_reads_the_timings_and_can_fail():
    # the normed cell improves with depth; a control that runs slower than its depth
    # says sits against the normed cell's deeper, better CE at that speed
    cells = paper_a_cells(ce=(4.4, 4.0))
    assert rows(cells)["frontier_throughput"].direction == "holds"
    cells["perloop_raw"].tokens_per_s.update({f"k{k}": 1000.0 for k in range(1, 5)})
    found = rows(cells)["frontier_throughput"]
    assert (found.kind, found.extends, found.direction) == ("extension", "frontier",
                                                            "contradicted")


def test_the_throughput_frontier_takes_the_rounds_worst_pairing():
    # medians alike, but in one round the control ran at half the speed: at that speed
    # the normed cell reaches its deeper, better CE, and the row no longer holds
    cells = paper_a_cells(ce=(4.4, 4.0))
    for c in cells.values():
        c.speed_rounds = {k: [v, v, v] for k, v in c.tokens_per_s.items()}
    assert rows(cells)["frontier_throughput"].direction == "holds"
    cells["perloop_raw"].speed_rounds["k1"] = [4000.0, 4000.0, 1100.0]
    assert rows(cells)["frontier_throughput"].direction != "holds"


def test_a_claim_about_every_cell_of_none_is_not_shown():
    assert all_of([]) == "not shown"
    assert all_of(["holds", "inconclusive"]) == "inconclusive"


def test_every_recipe_group_is_judged_on_its_own():
    cells = paper_a_cells()
    cells["perloop_normed_ref"] = cell_a(**{**NORMED, "norm": (40.0, 50.0)}, recipe="ref")
    cells["perloop_raw_ref"] = cell_a(recipe="ref", seed=3)
    found = paper_a_claims(cells, VALUES, 200)
    n, extra = len(CLAIMS_A), len(READS_CONTROLS)  # ours has an inter-loop norm cell
    assert [c.recipe for c in found] == ["ours"] * (n + extra) + ["ref"] * n
    assert found[0].value == rows(paper_a_cells())["drift"].value
    ref_drift = found[n + extra]
    assert ref_drift.direction == "holds" and ref_drift.magnitude == "contradicted"
    assert ref_drift.verdict == "contradicted"  # "far above": the magnitude is the claim
    sentence = init_effect(cells, 200)
    assert "[ref]" in sentence and "[ours]" in sentence and " moves" in sentence
    assert "init, FFN and weight decay together" in sentence and "]-fold" in sentence


def two_seeds(a: CellA, b: CellA) -> CellA:
    """A cell trained twice: a's tables as seed 42, b's as seed 43."""
    tokens = pd.concat([a.tokens.assign(seed=42), b.tokens.assign(seed=43)], ignore_index=True)
    sweep = pd.concat([a.sweep.assign(seed=42), b.sweep.assign(seed=43)], ignore_index=True)
    clamp = pd.concat([a.clamp.assign(seed=42), b.clamp.assign(seed=43)], ignore_index=True)
    return dataclasses.replace(a, tokens=tokens, sweep=sweep, clamp=clamp)


def test_seeds_widen_the_interval_when_they_disagree():
    agree = two_seeds(cell_a(ce=(4.3, 3.8), seed=1), cell_a(ce=(4.3, 3.8), seed=2))
    disagree = two_seeds(cell_a(ce=(4.3, 3.8), seed=1), cell_a(ce=(4.6, 4.1), seed=2))
    docs = Documents(agree.tokens["doc"].to_numpy(), 400)

    def width(c: CellA, runs: bool) -> float:
        d, v, r = c.col("ce")
        iv = docs.interval(docs.mean(d, v, r if runs else None, "c"))
        return iv.hi - iv.lo

    assert width(disagree, True) > 3 * width(disagree, False)  # training noise counted
    assert width(agree, True) < 1.5 * width(agree, False)  # nothing to add


def test_a_claim_true_on_one_seed_and_false_on_the_other_does_not_hold():
    good = cell_a(**NORMED, seed=5)  # drifts: 40 -> 4000
    bad = cell_a(**{**NORMED, "norm": (40.0, 8.0)}, seed=6)  # stays below the controls
    cells = paper_a_cells()
    cells["perloop_normed"] = good
    assert rows(cells)["drift"].direction == "holds"
    cells["perloop_normed"] = bad
    assert rows(cells)["drift"].direction == "contradicted"
    cells["perloop_normed"] = two_seeds(good, bad)
    found = rows(cells, 400)["drift"]
    assert found.direction == "inconclusive", found.value
    assert "seeds (2 per cell)" in found.resampled
    assert "conditional on that trained model" in found.resampled  # perloop_raw: one seed
    # pooled as one run (the seed column dropped), the same tokens decide for the claim
    cells["perloop_normed"] = dataclasses.replace(
        cells["perloop_normed"], tokens=cells["perloop_normed"].tokens.drop(columns="seed"),
        sweep=cells["perloop_normed"].sweep.drop(columns="seed"),
        clamp=cells["perloop_normed"].clamp.drop(columns="seed"))
    assert rows(cells, 400)["drift"].direction == "holds"


def test_seeds_that_disagree_on_the_clamp_leave_it_undecided():
    """The clamp is stored per token and seed (tables/clamp), so each seed is judged on
    its own clamp: one seed's change is negligible, the other's, 0.02 nats, is not."""
    calm = cell_a(**{**NORMED, "clamp": -0.002}, seed=5)
    moved = cell_a(**{**NORMED, "clamp": 0.02}, seed=7)
    cells = paper_a_cells()
    cells["perloop_normed"] = calm
    assert rows(cells)["clamp"].direction == "holds"
    cells["perloop_normed"] = two_seeds(calm, moved)
    found = rows(cells, 400)["clamp"]
    assert found.direction == "inconclusive", found.value
    assert [s["verdict"] for s in found.facts["seeds"]["each"]] == ["holds", "contradicted"]
    assert "each seed judged alone (holds/contradicted)" in found.resampled


def test_no_verdict_rests_on_fewer_than_ten_units():
    few = Interval(1.0, 0.9, 1.1, units=2)
    assert effect(few, +1) == "inconclusive" and negligible(few, 5.0) == "inconclusive"
    assert at_least(few, 0.5) == "inconclusive" and effect(dataclasses.replace(
        few, units=FEWEST_UNITS), +1) == "holds"
    # the same constructed cells, their 20 documents merged into 2: nothing is decided
    cells = paper_a_cells()
    for c in cells.values():
        c.tokens["doc"] = c.tokens["doc"] % 2
        c.sweep["doc"] = c.sweep["doc"] % 2
        c.clamp["doc"] = c.clamp["doc"] % 2
    found = paper_a_claims({k: dataclasses.replace(
        v, sweep=v.sweep.groupby("doc", as_index=False).sum()) for k, v in cells.items()},
        VALUES, 200)
    judged = [c for c in found if c.key != "stable_injection"]  # no such cell here
    assert {c.direction for c in judged} == {"inconclusive"}, [c.value for c in judged]


def test_paper_a_claims_are_not_shown_without_their_cells():
    found = paper_a_claims({"perloop_raw": cell_a()}, VALUES, 200)
    assert {c.direction for c in found} == {"not shown"}


def test_weighted_quantile_matches_numpy_on_the_sample():
    rng = np.random.default_rng(0)
    values, docs = rng.normal(size=999), np.repeat(np.arange(9), 111)
    draws = Documents(docs, 50).quantile(docs, values, 0.5)
    assert draws[0] == pytest.approx(np.quantile(values, 0.5, method="inverted_cdf"))
    assert draws[1:].std() > 0



@pytest.mark.parametrize("parents", [False, True])
def test_the_grouped_quantile_of_few_values_equals_the_token_by_token_one(parents):
    """A loop index takes the grouped path; its draws are those of the token-by-token
    path (the same values, with the documents' and the seeds' resamples), exactly."""
    import loopscope.stats.intervals as intervals
    rng = np.random.default_rng(1)
    docs = rng.integers(0, 40, size=3000)
    loops = rng.integers(1, 9, size=3000).astype(float)
    runs = rng.choice([42, 43], size=3000)
    boot = Documents(docs, 300, parents=docs // 8 if parents else None)
    grouped = boot.quantile(docs, loops, 0.9, runs, "cell")
    old, intervals.FEW_VALUES = intervals.FEW_VALUES, 0
    try:
        by_token = boot.quantile(docs, loops, 0.9, runs, "cell")
    finally:
        intervals.FEW_VALUES = old
    np.testing.assert_array_equal(grouped, by_token)
    assert len(np.unique(grouped[1:])) > 1

def test_the_one_over_s_law_must_single_out_the_drifting_cell():
    """A control whose step also follows 1/s while its scale grows as fast does not let
    the law explain the normed cell's K-invariance: the extension beside the law does
    not hold, and the law itself, the paper's statistic, is unchanged by it."""
    cells = paper_a_cells()
    assert verdicts_a(cells)["inverse_scale_controls"] == "holds"
    cells["perloop_penalty"] = cell_a(readout="normed", ce=(4.2, 3.85), cos=1e-9, seed=2,
                                      slope=-1.0)
    found = verdicts_a(cells)
    assert found["inverse_scale_controls"] != "holds"
    assert found["inverse_scale"] == "holds"


def test_the_activity_lemma_reads_the_radial_share_of_every_update():
    p = Criteria(VALUES)
    share = GroupA.of(paper_a_cells(), Documents(np.arange(DOCS), 50), p).activity(
        "perloop_normed")
    assert share.shape == (LOOPS, 51) and (share[:, 0] > 0.9).all()  # growth 1.5x a loop
    flat = GroupA.of(paper_a_cells(grow=1.0), Documents(np.arange(DOCS), 50), p)
    assert np.allclose(flat.activity("perloop_normed"), 0.0)
    unknown = dataclasses.replace(cell_a(**NORMED), d_model=0)
    cells = {**paper_a_cells(), "perloop_normed": unknown}
    assert verdicts_a(cells)["activity"] == "not shown"


def test_two_seeds_decide_only_where_each_seed_alone_agrees():
    good, other = cell_a(**NORMED, seed=5), cell_a(**NORMED, seed=7)
    cells = paper_a_cells()
    cells["perloop_normed"] = two_seeds(good, other)
    found = rows(cells)["drift"]
    assert found.direction == "holds" and "each seed judged alone (holds/holds)" in found.resampled
    # a judgement that one seed's run passes and the other's fails: pooled, it held
    weak = cell_a(**{**NORMED, "norm": (40.0, 8.0)}, seed=6)
    cells["perloop_normed"] = two_seeds(good, weak)

    def judge(g: GroupA) -> Claim:
        ok = g.mean("perloop_normed", "norm")[0] > 100
        return Claim("drifts", "", "", "", "holds" if ok else "contradicted")

    p = Criteria(VALUES)
    group = GroupA.of(cells, Documents(np.repeat(np.arange(DOCS), PER_DOC), 50), p)
    group.used.add("perloop_normed")
    found = Claim("drifts", "", "", "pooled", "holds")
    on_each_seed(found, judge, group, seed_groups(group), p)
    assert found.direction == "inconclusive"
    assert "not on each seed alone (holds/contradicted)" in found.value


def test_stable_injection_is_judged_on_growth_across_loops():
    """Parcae's claim is that the contraction bounds the state's growth across loops: a
    stable-injection cell that grows less than the baseline over K and over the sweep
    holds; one that grows faster contradicts the row."""
    cells = paper_a_cells()
    cells["perloop_stable"] = cell_a(readout="normed", ce=(4.25, 3.9), cos=1e-9, seed=8,
                                     control="stable injection", paper=False, grow=1.05)
    found = rows(cells)
    row = found["stable_injection"]
    assert row.kind == "extension" and row.verdict == "holds", row.value
    assert "over K" in row.value and "final-loop mean norm" in row.value  # level beside
    cells["perloop_stable"] = dataclasses.replace(cells["perloop_stable"],
                                                  sweep=cell_a(seed=8, grow=1.7).sweep)
    assert rows(cells)["stable_injection"].direction == "contradicted"


def test_a_cell_beyond_the_paper_never_turns_a_finding():
    """A stable-injection cell that drifts as far as the baseline would contradict the
    drift finding if it counted among the controls: the finding reads the paper's own
    conditions and holds; the extension over every scale-controlled cell beside it
    says what the extra cell does."""
    cells = paper_a_cells()
    before = rows(cells)["drift"]
    cells["perloop_stable"] = dataclasses.replace(
        cell_a(**{**NORMED, "seed": 9}), group="scale-controlled", control="stable injection",
        paper=False)
    found = rows(cells)
    assert found["drift"].verdict == before.verdict == "holds"
    assert found["drift"].value == before.value
    assert "perloop_stable" not in found["drift"].claim
    assert found["drift_every"].direction != "holds"
    assert found["drift_every"].extends == "drift"


def test_every_row_is_declared_and_a_finding_reads_only_its_conditions():
    """rows.yaml declares what each row reads; a finding of the paper's conditions read
    no cell beyond them, even with an inter-loop norm and a stable-injection cell in the
    group, while the extensions beside them did."""
    from loopscope.judge.criteria import declared
    cells = paper_a_cells()
    cells["perloop_stable"] = cell_a(readout="normed", ce=(4.25, 3.9), cos=1e-9, seed=8,
                                     control="stable injection", paper=False, grow=1.05)
    beyond = {"perloop_interloop_norm", "perloop_stable"}
    wide = set()
    for row in paper_a_claims(cells, VALUES, 200):
        spec = declared(row.key, row.extends)
        assert spec["statistic"] and spec["yardstick"], row.key
        read = set(row.facts.get("cells_read", []))
        if spec["conditions"] == "paper":
            assert not read & beyond, (row.key, read)
        if spec["conditions"] == "every":
            wide |= read & beyond
    assert wide == beyond
    with pytest.raises(KeyError, match="no declaration for the row 'nonsense'"):
        declared("nonsense")


@pytest.mark.parametrize("norm, direction, magnitude", [
    ((20.0, 20.0), "holds", "holds"),            # inside the paper's 17-83
    ((10.0, 8.0), "holds", "contradicted"),      # small, as at our width: not the level
    ((200.0, 300.0), "contradicted", "contradicted"),  # a control that drifts
])
def test_the_controls_absolute_norms_are_judged_against_the_papers_range(
        norm, direction, magnitude):
    cells = paper_a_cells()
    cells["perloop_raw"] = cell_a(norm=norm, seed=1)
    row = rows(cells)["control_norms"]
    assert (row.direction, row.magnitude) == (direction, magnitude), row.value
    assert "per coordinate" in row.value and "at d 512" in row.value
    assert len({t.reads for t in row.tests + row.magnitude_tests}) == 1
