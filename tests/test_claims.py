"""Every verdict in the claims tables can come out either way: constructed metrics."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from loopscope.judge.group_a import CellA, GroupA, on_each_seed
from loopscope.judge.paper_a import init_effect, paper_a_claims
from loopscope.judge.paper_b import paper_b_claims
from loopscope.judge.verdicts import Claim, all_of, at_least, effect, negligible, table, widened
from loopscope.measure.intervals import Documents, Interval, bootstrap, bootstrap_mean
from loopscope.measure.units import FEWEST_UNITS


def iv(value, lo=None, hi=None):
    return {"value": value, "lo": value - 0.01 if lo is None else lo,
            "hi": value + 0.01 if hi is None else hi}


def narrow(value, half=0.004):
    return iv(value, value - half, value + half)


def conv(r=8, useful=None, gain=0.2, steps=None, half_gain=0.05, flat=0.004, kl_ratio=-4.0,
         change_ratio=-1.0, median=6.0, share=0.1, ws_minus=None, content_minus=None,
         rare=(), sampler_mean=None, nominal_mean=None, median_half=1.0, sensitivity=None):
    """Paper-B-like convergence metrics (the schema of convergence.summarize)."""
    d = 4 * r
    useful = r if useful is None else useful
    steps = {f"k{k}": narrow(-0.02) for k in range(1, r)} if steps is None else steps
    ws_minus = {"punctuation": iv(-1.0), "content word": iv(-3.0)} \
        if ws_minus is None else ws_minus
    content_minus = {"whitespace": iv(3.0), "punctuation": iv(2.0)} \
        if content_minus is None else content_minus
    return {
        "reference_depth": r, "max_depth": d, "sampler_mean": sampler_mean,
        "nominal_mean": nominal_mean,
        "elasticity": {"gain": iv(gain), "half_depth": r // 2, "half_gain": narrow(half_gain),
                       "steps": steps, "tail": narrow(0.0), "flat": narrow(flat, 0.003),
                       "flat_depth": d, "margin": 0.01},
        "kl": {"k2": 0.4, f"k{2 * r}": 1e-5},
        "kl_decay": {"from": 2, "to": 2 * r, "log10_ratio": iv(kl_ratio, kl_ratio - 0.5,
                                                                kl_ratio + 0.5)},
        "state_change": {f"k{r}": 1e-2, f"k{d}": 1e-3},
        "state_decay": {"from": r, "to": d, "log10_ratio": iv(change_ratio, change_ratio - 0.2,
                                                               change_ratio + 0.2)},
        "convergence": {"epsilon": 1e-3,
                        "median_loop": iv(median, median - median_half, median + median_half),
                        "median_loop_shares": {f"k{int(median)}": 1.0},
                        "median_exit_loop": iv(3.0, 2.0, 4.0),
                        "share_after_reference": iv(share)},
        "types": {"whitespace": {"mean_loop": 2.0, "share": 0.2},
                  "punctuation": {"mean_loop": 3.0, "share": 0.1},
                  "content word": {"mean_loop": 5.0, "share": 0.3},
                  "judged": ["whitespace", "punctuation", "content word"],
                  "rare": list(rare), "whitespace_minus": ws_minus,
                  "content_minus": content_minus},
        "saturation": {"useful_depth": int(round(useful)), "share": 0.02,
                       "useful_depth_iv": iv(useful, useful - 1, useful),
                       "useful_depth_shares": {f"k{int(useful)}": 0.6,
                                               f"k{int(useful) - 1}": 0.4},
                       "sensitivity": [{"kind": "nats", "tolerance": t,
                                        "useful_depth_iv": iv(u, u - 1, u)}
                                       for t, u in (sensitivity or {0.01: useful}).items()]},
    }


def policy(loops, delta=0.0, flops_baseline=0.7, matched=True, threshold=1e-3, r=8,
           flops=0.6):
    """A rule's metrics at its chosen setting; mean loops cannot pass the cap R."""
    if not matched:
        return {"matched": False}
    spread = min(0.2, r - loops)
    return {"matched": True, "threshold": threshold, "mean_loops": loops,
            "mean_loops_iv": iv(loops, loops - spread, loops + spread),
            "delta_ce": narrow(delta), "flops_ratio": flops,
            "flops_ratio_baseline": flops_baseline, "flops_ratio_iv": narrow(flops, 0.03),
            "flops_ratio_baseline_iv": narrow(flops_baseline, 0.03)}


def pol(r=8, kl=None, probe=None, baseline=7):
    return {"reference_depth": r, "match_nats": 0.01, "choose_nats": 0.005,
            "baseline_depth": baseline, "uniform": {"matched_depth": baseline},
            "kl": policy(5.0) if kl is None else kl,
            "probe": policy(7.95, threshold=0.0) if probe is None else probe}


def verdicts(c, p, second=True):
    convs = {"main": c, "second": conv(r=4)} if second else {"main": c}
    found = paper_b_claims(convs, {"main": p}, "main", "second" if second else None)
    out = {}
    for claim in found:
        key = claim.claim.split(":")[0].split(" (")[0].split(" [")[0]
        if key in out:  # token order: one row per backbone, the main one first
            continue
        out[key] = claim
    return out


ORDER = "Convergence depth is ordered by token type"
A1 = "A1"
A2 = "A2"


def claim_of(found, prefix):
    return next(c for k, c in found.items() if k.startswith(prefix))


def test_paper_b_claims_hold_on_paper_like_metrics():
    found = verdicts(conv(), pol())
    assert {c.verdict for c in found.values()} == {"holds"}, \
        {k: (c.verdict, c.value) for k, c in found.items()}
    assert {c.magnitude for c in found.values()} <= {"holds", "n/a"}


def worse_step(k, lo, hi):
    steps = {f"k{j}": narrow(-0.02) for j in range(1, 8)}
    steps[f"k{k}"] = iv((lo + hi) / 2, lo, hi)
    return steps


@pytest.mark.parametrize("change, claim, verdict", [
    # one gain from 1 to R is not monotone improvement: a step that worsens CE
    (dict(steps=worse_step(5, 0.02, 0.04)), "Elasticity", "contradicted"),
    (dict(steps=worse_step(5, -0.01, 0.03)), "Elasticity", "inconclusive"),
    # the second half of the depth does not help
    (dict(half_gain=0.0), "Elasticity", "contradicted"),
    (dict(flat=0.05), "Past R the loss is flat", "contradicted"),
    (dict(flat=0.009), "Past R the loss is flat", "inconclusive"),
    (dict(kl_ratio=1.0), "Successive outputs converge", "contradicted"),
    (dict(kl_ratio=0.0), "Successive outputs converge", "inconclusive"),
    (dict(change_ratio=0.5), "The state change per loop decays", "contradicted"),
    (dict(change_ratio=0.1), "The state change per loop decays", "inconclusive"),
    (dict(median=10.0), "The median token converges before R", "contradicted"),
    (dict(median=7.5), "The median token converges before R", "inconclusive"),
    # a tail of 0% is no tail; one that may be under the 2% floor is not shown to be one
    (dict(share=0.0), "A tail of tokens is still updating at R", "contradicted"),
    (dict(share=0.02), "A tail of tokens is still updating at R", "inconclusive"),
    (dict(ws_minus={"punctuation": iv(1.0), "content word": iv(-3.0)}), ORDER,
     "contradicted"),
    (dict(ws_minus={"punctuation": iv(0.0, -0.5, 0.5), "content word": iv(-3.0)}), ORDER,
     "inconclusive"),
    (dict(useful=12), "Useful depth saturates at the training-mean depth", "contradicted"),
    (dict(useful=3), "Useful depth saturates at the training-mean depth", "contradicted"),
    (dict(useful=6.5), "Useful depth saturates at the training-mean depth", "inconclusive"),
])
def test_each_paper_b_claim_can_fail(change, claim, verdict):
    assert verdicts(conv(**change), pol())[claim].verdict == verdict


def test_token_order_needs_both_ends_not_a_content_whitespace_gap():
    # content - whitespace is clearly positive, but punctuation converges deeper than
    # content words: "content deepest" is false
    found = verdicts(conv(content_minus={"whitespace": iv(3.0), "punctuation": iv(-1.0)}),
                     pol())
    assert found[ORDER].verdict == "contradicted"


def test_token_order_is_not_judged_on_rare_types():
    c = conv(rare=["whitespace"])
    del c["types"]["whitespace_minus"]
    found = verdicts(c, pol())[ORDER]
    assert found.verdict == "not shown" and "whitespace" in found.value


def test_token_order_is_judged_on_both_backbones():
    found = paper_b_claims({"main": conv(), "second": conv(r=4)}, {"main": pol()},
                           "main", "second")
    assert [c.claim for c in found if c.claim.startswith(ORDER)] == [
        f"{ORDER} [main]: whitespace shallowest, content words deepest",
        f"{ORDER} [second]: whitespace shallowest, content words deepest"]


@pytest.mark.parametrize("change, claim, magnitude", [
    # the KL decay within 1.5x of the paper's 4.66 decades: too shallow or too steep fails
    (dict(kl_ratio=-2.0), "Successive outputs converge", "contradicted"),
    (dict(kl_ratio=-8.0), "Successive outputs converge", "contradicted"),
    (dict(kl_ratio=-3.2), "Successive outputs converge", "inconclusive"),
    # the median loop: 0.75 R one loop either side, on both sides
    (dict(median=3.0), "The median token converges before R", "contradicted"),
    (dict(median=7.5, median_half=0.1), "The median token converges before R",
     "contradicted"),
    (dict(median=7.0, median_half=0.0), "The median token converges before R", "holds"),
    (dict(median=5.0, median_half=0.0), "The median token converges before R", "holds"),
    (dict(median=6.5), "The median token converges before R", "inconclusive"),
])
def test_paper_b_magnitude_bands_fail_on_both_sides(change, claim, magnitude):
    assert verdicts(conv(**change), pol())[claim].magnitude == magnitude


def test_magnitudes_have_their_own_verdicts():
    found = verdicts(conv(share=0.5, kl_ratio=-1.0, median=2.0), pol())
    assert found["A tail of tokens is still updating at R"].magnitude == "contradicted"
    assert found["Successive outputs converge"].magnitude == "contradicted"
    assert found["The median token converges before R"].magnitude == "contradicted"
    assert {found[k].verdict for k in ("A tail of tokens is still updating at R",
                                       "Successive outputs converge",
                                       "The median token converges before R")} == {"holds"}


@pytest.mark.parametrize("kl, verdict", [
    (policy(8.0), "contradicted"),                 # saves nothing
    (policy(5.0, delta=0.05), "contradicted"),     # worse than R beyond the margin
    (policy(5.0, delta=0.008), "inconclusive"),    # non-inferiority not shown
    (policy(7.85), "inconclusive"),                # the loops interval reaches R
    (policy(0, matched=False), "inconclusive"),    # unmatched: never holds or contradicted
])
def test_a1_claim_can_fail(kl, verdict):
    assert claim_of(verdicts(conv(), pol(kl=kl)), A1).verdict == verdict


def test_a1_is_non_inferiority_with_the_upper_bound_at_the_margin():
    assert claim_of(verdicts(conv(), pol(kl=policy(5.0, delta=0.006))), A1).verdict == "holds"


A1_COMPUTE = "A1 (KL exit) saves compute"


def test_a1_magnitude_reads_loops_against_the_matching_uniform_depth():
    found = claim_of(verdicts(conv(), pol(kl=policy(6.5), baseline=6)), A1)
    assert (found.verdict, found.magnitude) == ("holds", "contradicted")
    assert "uniform depth 6" in found.value


@pytest.mark.parametrize("kl, verdict, magnitude", [
    (policy(5.0, flops=0.6, flops_baseline=0.8), "holds", "holds"),
    # fewer loops, but the checks cost more than they save: as many FLOPs as depth R
    (policy(5.0, flops=1.0, flops_baseline=1.5), "inconclusive", "contradicted"),
    (policy(5.0, flops=1.1, flops_baseline=1.5), "contradicted", "contradicted"),
    (policy(5.0, flops=0.8, flops_baseline=1.0), "holds", "inconclusive"),
    (policy(0, matched=False), "inconclusive", "n/a"),
])
def test_a1_compute_is_its_own_row_with_flop_intervals(kl, verdict, magnitude):
    rows = paper_b_claims({"main": conv(), "second": conv(r=4)},
                          {"main": pol(kl=kl, baseline=6)}, "main", "second")
    found = next(c for c in rows if c.claim.startswith(A1_COMPUTE))
    assert (found.verdict, found.magnitude) == (verdict, magnitude)
    assert [c.claim.split(" [")[0] for c in rows if c.claim.startswith(A1)] == [
        "A1 (KL exit) matches uniform depth-R quality in fewer loops",
        "A1 (KL exit) saves compute at matched quality"]


@pytest.mark.parametrize("probe, verdict", [
    (policy(4.0, threshold=0.1), "contradicted"),     # a good probe saves loops
    (policy(4.0, delta=0.05), "inconclusive"),        # cheaper but not at matched quality
    (policy(7.6), "inconclusive"),                    # interval straddles 0.95 R
    (policy(8.0, delta=0.05), "holds"),               # no saving whatever the quality
    (policy(0, matched=False), "inconclusive"),       # unmatched: no measurement
])
def test_a2_saves_nothing_can_fail(probe, verdict):
    assert claim_of(verdicts(conv(), pol(probe=probe)), A2).verdict == verdict


def test_saturation_is_not_shown_with_one_backbone():
    found = verdicts(conv(), pol(), second=False)
    assert found["Useful depth saturates at the training-mean depth"].verdict == "not shown"


def test_claims_name_the_depth_they_compare_against():
    found = verdicts(conv(sampler_mean=9.0, nominal_mean=8.0), pol())
    assert "R = 8 (model.loops, m = 8, E[r] = 9)" in found["Elasticity"].claim
    assert "R = 8" in claim_of(found, A1).criterion


SATURATION = "Useful depth saturates at the training-mean depth"


def test_every_row_carries_its_backbones_measured_regime_mark():
    found = paper_b_claims({"main": conv(useful=3), "second": conv(r=4)}, {"main": pol()},
                           "main", "second")
    assert all(c.regime for c in found)  # every row is read on a backbone
    main_rows = [c for c in found if c.depth_use.startswith("main")]
    assert main_rows and all(c.regime.startswith("outside the paper's regime (main")
                             for c in main_rows)
    inside = paper_b_claims({"main": conv(), "second": conv(r=4)}, {"main": pol()},
                            "main", "second")
    assert all("in the paper's regime" in c.regime for c in inside)
    edge = paper_b_claims({"main": conv(useful=6.5), "second": conv(r=4)}, {"main": pol()},
                          "main", "second")  # interval [5.5, 6.5] around 0.75 x 8 = 6
    assert edge[0].regime.startswith("at the edge of the paper's regime")


def test_saturation_failing_low_is_contradicted_not_excused_by_the_regime():
    found = verdicts(conv(useful=3), pol())[SATURATION]
    assert found.verdict == "contradicted"
    assert "outside the paper's regime (main" in found.regime


def test_regime_is_read_against_the_nominal_mean():
    # R = 8 evaluated, trained at nominal mean m = 7 (depth_mean: loops): 0.75 m = 5.25
    found = paper_b_claims({"main": conv(useful=6, nominal_mean=7.0, sampler_mean=8.0),
                            "second": conv(r=4)}, {"main": pol()}, "main", "second")
    assert "0.75 m = 5.25" in found[0].regime and "at the edge" in found[0].regime


def test_a_verdict_that_changes_across_tolerances_is_fragile():
    # saturation holds at 0.003 nats (useful depth 8 of 8) but not at 0.01 (5 of 8)
    second = conv(r=4, sensitivity={0.003: 4, 0.01: 4})

    def saturation_row(main):
        found = paper_b_claims({"main": main, "second": second}, {"main": pol()}, "main",
                               "second")
        return next(c for c in found if c.claim == SATURATION)

    found = saturation_row(conv(useful=5, sensitivity={0.003: 8, 0.01: 5}))
    assert found.verdict == "contradicted"
    assert "fragile: contradicted at 0.01 nats; holds at 0.003 nats" in found.value
    steady = saturation_row(conv(useful=8, sensitivity={0.003: 8, 0.01: 8}))
    assert steady.verdict == "holds" and "fragile" not in steady.value


def test_every_paper_b_claim_shows_its_backbones_useful_depth_against_r():
    found = paper_b_claims({"main": conv(useful=3), "second": conv(r=4)}, {"main": pol()},
                           "main", "second")
    assert all(c.depth_use for c in found)
    assert found[0].depth_use == "main: useful depth 3 [2, 3] of R = 8"
    order_second = [c for c in found if c.claim.startswith(ORDER)][1]
    assert order_second.depth_use == "second: useful depth 4 [3, 4] of R = 4"
    assert found[-1].depth_use == ("second: useful depth 4 [3, 4] of R = 4; "
                                   "main: useful depth 3 [2, 3] of R = 8")


def test_paper_b_rows_say_what_they_resample_and_that_one_seed_conditions_them():
    main = dict(conv(), units=52, unit="block of 2 windows", seeds=1)
    found = paper_b_claims({"main": main, "second": dict(conv(r=4), units=52, seeds=2)},
                           {"main": pol()}, "main", "second")
    assert found[0].resampled == ("main: 52 units (block of 2 windows), one seed: "
                                  "conditional on that trained model")
    assert found[-1].resampled.startswith("second: 52 units (document) x 2 seeds; main:")


def test_paper_b_claims_are_not_shown_without_a_backbone():
    found = paper_b_claims({}, {}, None, None)
    assert found and {c.verdict for c in found} == {"not shown"}


def test_interval_verdicts():
    assert effect(Interval(1, 0.5, 1.5), +1) == "holds"
    assert effect(Interval(-1, -1.5, -0.5), +1) == "contradicted"
    assert effect(Interval(0.1, -0.5, 0.7), +1) == "inconclusive"
    assert effect(Interval(-1, -1.5, -0.5), -1) == "holds"
    assert negligible(Interval(0, -0.005, 0.005), 0.01) == "holds"
    assert negligible(Interval(0.1, 0.05, 0.15), 0.01) == "contradicted"
    assert negligible(Interval(0.0, -0.02, 0.02), 0.01) == "inconclusive"
    assert at_least(Interval(0.2, 0.15, 0.25), 0.1) == "holds"
    assert at_least(Interval(0.05, 0.0, 0.08), 0.1) == "contradicted"


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
           clamp_modes=("freeze_loop1", "remove_radial"), grow: float = 1.5) -> CellA:
    """A constructed cell: per-token norms at loops 1 and K (lognormal: centre, sigma),
    CE at loops 1 and K (linear between; ce_at: the CE of every loop instead), radial
    fraction at K; a sweep whose angular step goes like s**slope while the scale grows
    `grow`-fold per loop (the 1/s law: slope -1); clamp delta CE at K in each of
    clamp_modes."""
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
    iv = {"value": clamp, "lo": clamp - 0.003, "hi": clamp + 0.003}
    return CellA(group, loss, readout, recipe, LOOPS, pd.DataFrame(tokens), pd.DataFrame(sweep),
                 {mode: {"delta_ce_last": iv} for mode in clamp_modes},
                 {f"k{k}": 1000.0 for k in range(1, 5)}, {f"k{k}": 1e6 for k in range(1, 5)},
                 d_model=128)


# The drifting cell: its norm grows 250-fold with a heavy tail (log-normal sigma 1.2 at K:
# 2.7% of the tokens beyond 10x the median), K-invariant CE, no radial gradient.
NORMED = dict(group="normed baseline", readout="normed", norm=(40.0, 10000.0),
              tail=(0.1, 1.2), ce=(4.0, 4.0), cos=1e-9, slope=-1.0)
FINAL_NORM = dict(group="final-norm only", readout="final_norm", norm=(15.0, 15.0), seed=4)


def paper_a_cells(**normed) -> dict[str, CellA]:
    return {
        "perloop_normed": cell_a(**{**NORMED, **normed}),
        "perloop_raw": cell_a(seed=1),
        "perloop_penalty": cell_a(readout="normed", ce=(4.2, 3.85), cos=1e-9, seed=2),
        "perloop_final_norm": cell_a(**FINAL_NORM),
    }


CLAIMS_A = ["drift", "tail", "final norm", "activity", "inverse scale", "k-invariance",
            "depth gain", "frontier", "clamp", "clamp other", "lemma1", "radial fractions"]


def verdicts_a(cells: dict[str, CellA]) -> dict[str, str]:
    found = paper_a_claims(cells, 0.01, 200)
    return dict(zip(CLAIMS_A, [c.verdict for c in found], strict=True))


def test_paper_a_claims_hold_on_paper_like_metrics():
    found = paper_a_claims(paper_a_cells(), 0.01, 200)
    assert [c.verdict for c in found] == ["holds"] * 12, [(c.claim, c.value) for c in found]
    assert {c.magnitude for c in found} <= {"holds", "n/a"}, [c.value for c in found]


@pytest.mark.parametrize("claim, normed, verdict", [
    ("drift", dict(norm=(40.0, 8.0)), "contradicted"),  # mean 16 under the controls
    ("tail", dict(tail=(0.6, 0.1)), "contradicted"),
    ("tail", dict(tail=(0.1, 0.5)), "contradicted"),  # wider, yet no token beyond 10x
    ("lemma1", dict(cos=1e-1), "contradicted"),
    ("radial fractions", dict(cos=1e-1), "contradicted"),
    ("activity", dict(grow=1.0), "contradicted"),  # the update keeps the scale
    ("inverse scale", dict(slope=0.5), "contradicted"),
    ("k-invariance", dict(ce=(4.5, 4.0)), "contradicted"),
    ("k-invariance", dict(ce=(4.01, 4.0)), "inconclusive"),
    ("depth gain", dict(ce=(5.0, 4.0)), "contradicted"),
    # the baseline gains 0.3 nats, the controls 0.5 and 0.35: more, but not twice as much
    ("depth gain", dict(ce=(4.3, 4.0)), "contradicted"),
    ("frontier", dict(ce=(3.0, 3.0)), "contradicted"),
    ("clamp", dict(clamp=0.05), "contradicted"),
    ("clamp", dict(clamp=0.009), "inconclusive"),
    ("clamp", dict(clamp_modes=()), "not shown"),
    ("clamp other", dict(clamp=0.05), "contradicted"),
    ("clamp other", dict(clamp_modes=("freeze_loop1",)), "not shown"),
])
def test_each_paper_a_claim_can_fail(claim, normed, verdict):
    assert verdicts_a(paper_a_cells(**normed))[claim] == verdict


def test_lemma2_magnitude_fails_when_the_step_does_not_shrink_like_one_over_s():
    found = paper_a_claims(paper_a_cells(slope=-0.2), 0.01, 200)[4]
    assert found.claim.startswith("The angular 1/s law")
    assert (found.verdict, found.magnitude) == ("holds", "contradicted")


def test_a_mean_shift_is_not_a_heavy_tail():
    # every token grows alike: p99/median stays put
    found = verdicts_a(paper_a_cells(tail=(0.3, 0.3)))
    assert found["tail"] in ("inconclusive", "contradicted")


def test_the_drift_magnitude_is_judged_against_the_papers_smallest_ratio():
    # a ratio of about 200: the old bar (100) passed it, the paper's smallest (470) does not
    found = paper_a_claims(paper_a_cells(norm=(40.0, 2000.0)), 0.01, 200)[0]
    assert (found.verdict, found.magnitude) == ("holds", "contradicted"), found.value
    assert "470" in found.criterion and "39,000" in found.paper


def test_the_drift_row_names_the_controls_the_group_has_and_lacks():
    cells = paper_a_cells()
    cells["perloop_raw"] = dataclasses.replace(cells["perloop_raw"], control="raw readout")
    cells["perloop_penalty"] = dataclasses.replace(cells["perloop_penalty"],
                                                   control="norm penalty")
    text = paper_a_claims(cells, 0.01, 200)[0].claim
    assert "perloop_raw (raw readout)" in text and "perloop_penalty (norm penalty)" in text
    assert "no inter-loop norm cell" in text


def test_a_final_norm_cell_that_drifts_contradicts_the_design_rule():
    cells = paper_a_cells()
    cells["perloop_final_norm"] = cell_a(**{**NORMED, **FINAL_NORM, "norm": (40.0, 20000.0)})
    found = paper_a_claims(cells, 0.01, 200)[2]
    assert (found.verdict, found.magnitude) == ("contradicted", "contradicted"), found.value
    del cells["perloop_final_norm"]
    assert paper_a_claims(cells, 0.01, 200)[2].verdict == "not shown"


def test_a_control_whose_last_loop_gets_worse_does_not_gain_over_every_step():
    cells = paper_a_cells()
    cells["perloop_raw"] = cell_a(ce_at=(4.3, 3.9, 3.7, 3.8), seed=1)
    found = paper_a_claims(cells, 0.01, 200)[6]
    assert found.verdict == "contradicted", found.value
    assert "last loop worse than loop 3" in found.value


def test_a_timing_that_rises_with_depth_is_flagged_not_read():
    cells = paper_a_cells()
    cells["perloop_raw"].tokens_per_s.update(k2=3000.0)  # the best control: its timing is read
    found = paper_a_claims(cells, 0.01, 200)[7]
    assert "not falling with depth" in found.value and found.verdict == "holds"


def test_a_claim_about_every_cell_of_none_is_not_shown():
    assert all_of([]) == "not shown"
    assert all_of(["holds", "inconclusive"]) == "inconclusive"


def test_every_recipe_group_is_judged_on_its_own():
    cells = paper_a_cells()
    cells["perloop_normed_ref"] = cell_a(**{**NORMED, "norm": (40.0, 50.0)}, recipe="ref")
    cells["perloop_raw_ref"] = cell_a(recipe="ref", seed=3)
    found = paper_a_claims(cells, 0.01, 200)
    n = len(CLAIMS_A)
    assert len(found) == 2 * n and [c.recipe for c in found] == ["ours"] * n + ["ref"] * n
    assert found[0].value == paper_a_claims(paper_a_cells(), 0.01, 200)[0].value
    ref_drift = found[n]
    assert ref_drift.verdict == "holds" and ref_drift.magnitude == "contradicted"
    assert "recipe" in table(found)[0] and "recipe" in table(found[:n])[0]
    sentence = init_effect(cells, 200)
    assert "[ref]" in sentence and "[ours]" in sentence and " moves" in sentence
    assert "init, FFN and weight decay together" in sentence and "]-fold" in sentence


def two_seeds(a: CellA, b: CellA) -> CellA:
    """A cell trained twice: a's tables as seed 42, b's as seed 43."""
    tokens = pd.concat([a.tokens.assign(seed=42), b.tokens.assign(seed=43)], ignore_index=True)
    sweep = pd.concat([a.sweep.assign(seed=42), b.sweep.assign(seed=43)], ignore_index=True)
    return dataclasses.replace(a, tokens=tokens, sweep=sweep)


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
    assert paper_a_claims(cells, 0.01, 200)[0].verdict == "holds"
    cells["perloop_normed"] = bad
    assert paper_a_claims(cells, 0.01, 200)[0].verdict == "contradicted"
    cells["perloop_normed"] = two_seeds(good, bad)
    found = paper_a_claims(cells, 0.01, 400)[0]
    assert found.verdict == "inconclusive", found.value
    assert "seeds (2 per cell)" in found.resampled
    assert "conditional on that trained model" in found.resampled  # perloop_raw: one seed
    # pooled as one run (the seed column dropped), the same tokens decide for the claim
    cells["perloop_normed"] = dataclasses.replace(
        cells["perloop_normed"], tokens=cells["perloop_normed"].tokens.drop(columns="seed"),
        sweep=cells["perloop_normed"].sweep.drop(columns="seed"))
    assert paper_a_claims(cells, 0.01, 400)[0].verdict == "holds"


def test_no_verdict_rests_on_fewer_than_ten_units():
    few = Interval(1.0, 0.9, 1.1, units=2)
    assert effect(few, +1) == "inconclusive" and negligible(few, 5.0) == "inconclusive"
    assert at_least(few, 0.5) == "inconclusive" and effect(dataclasses.replace(
        few, units=FEWEST_UNITS), +1) == "holds"
    # paper B's elasticity too, though it combines several intervals itself
    c = conv()
    assert paper_b_claims({"b": c}, {}, "b", None)[0].verdict == "holds"
    c["elasticity"]["half_gain"]["units"] = 2
    assert paper_b_claims({"b": c}, {}, "b", None)[0].verdict == "inconclusive"
    # the same constructed cells, their 20 documents merged into 2: nothing is decided
    cells = paper_a_cells()
    for c in cells.values():
        c.tokens["doc"] = c.tokens["doc"] % 2
        c.sweep["doc"] = c.sweep["doc"] % 2
    found = paper_a_claims({k: dataclasses.replace(
        v, sweep=v.sweep.groupby("doc", as_index=False).sum()) for k, v in cells.items()},
        0.01, 200)
    # the clamps read metrics, where the stage counted the units
    judged = [c for c in found if "clamp" not in c.claim.lower()]
    assert {c.verdict for c in judged} == {"inconclusive"}, [c.value for c in judged]


def test_paper_a_claims_are_not_shown_without_their_cells():
    found = paper_a_claims({"perloop_raw": cell_a()}, 0.01, 200)
    assert {c.verdict for c in found} == {"not shown"}


def test_weighted_quantile_matches_numpy_on_the_sample():
    rng = np.random.default_rng(0)
    values, docs = rng.normal(size=999), np.repeat(np.arange(9), 111)
    draws = Documents(docs, 50).quantile(docs, values, 0.5)
    assert draws[0] == pytest.approx(np.quantile(values, 0.5, method="inverted_cdf"))
    assert draws[1:].std() > 0


def test_the_one_over_s_law_must_single_out_the_drifting_cell():
    """A control whose step also follows 1/s while its scale grows as fast does not let
    the law explain the normed cell's K-invariance: the row does not hold."""
    cells = paper_a_cells()
    assert verdicts_a(cells)["inverse scale"] == "holds"
    cells["perloop_penalty"] = cell_a(readout="normed", ce=(4.2, 3.85), cos=1e-9, seed=2,
                                      slope=-1.0)
    assert verdicts_a(cells)["inverse scale"] != "holds"


def test_the_activity_lemma_reads_the_radial_share_of_every_update():
    share = GroupA.of(paper_a_cells(), Documents(np.arange(DOCS), 50), 0.01).activity(
        "perloop_normed")
    assert share.shape == (LOOPS, 51) and (share[:, 0] > 0.9).all()  # growth 1.5x a loop
    flat = GroupA.of(paper_a_cells(grow=1.0), Documents(np.arange(DOCS), 50), 0.01)
    assert np.allclose(flat.activity("perloop_normed"), 0.0)
    unknown = dataclasses.replace(cell_a(**NORMED), d_model=0)
    cells = {**paper_a_cells(), "perloop_normed": unknown}
    assert verdicts_a(cells)["activity"] == "not shown"


def test_two_seeds_decide_only_where_each_seed_alone_agrees():
    good, other = cell_a(**NORMED, seed=5), cell_a(**NORMED, seed=7)
    cells = paper_a_cells()
    cells["perloop_normed"] = two_seeds(good, other)
    found = paper_a_claims(cells, 0.01, 200)[0]
    assert found.verdict == "holds" and "each seed alone agrees (holds/holds)" in found.resampled
    # a judgement that one seed's run passes and the other's fails: pooled, it held
    weak = cell_a(**{**NORMED, "norm": (40.0, 8.0)}, seed=6)
    cells["perloop_normed"] = two_seeds(good, weak)

    def judge(g: GroupA) -> Claim:
        ok = g.mean("perloop_normed", "norm")[0] > 100
        return Claim("drifts", "", "", "", "holds" if ok else "contradicted")

    found = Claim("drifts", "", "", "pooled", "holds")
    on_each_seed(found, judge, cells, {"perloop_normed"}, Documents(np.arange(DOCS), 50),
                  0.01, "ours")
    assert found.verdict == "inconclusive"
    assert "not on each seed alone (holds/contradicted)" in found.value


def test_a_family_is_contradicted_on_bonferroni_intervals():
    docs = Documents(np.arange(40), 2000)
    draws = docs.mean(np.arange(40), np.random.default_rng(0).normal(0, 1, 40))
    one, four = docs.interval(draws), docs.interval(draws, 4)
    assert four.lo < one.lo and four.hi > one.hi
    iv = Interval(0.0, -1.0, 1.0)
    wide = widened(iv, 4)
    assert wide.hi == pytest.approx(2.4977 / 1.9600, rel=1e-3) and wide.lo == -wide.hi
    assert widened(iv, 1) == iv
    # one comparison of three contradicted at 95% but not on its corrected interval
    assert all_of(["holds", "contradicted", "holds"]) == "contradicted"
    assert all_of(["holds", "contradicted", "holds"],
                  ["holds", "inconclusive", "holds"]) == "inconclusive"
    assert all_of(["holds", "holds"], ["holds", "inconclusive"]) == "holds"
