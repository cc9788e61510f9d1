"""Every paper B verdict can come out either way: constructed convergence and policies
metrics (the schema of loopscope.measure.trajectory.convergence and policies)."""

import dataclasses
import json
from pathlib import Path

import jsonschema
import numpy as np
import pandas as pd
import pytest
from report_data import claims_json

from loopscope.judge.criteria import declared
from loopscope.judge.paper_b import paper_b_claims
from loopscope.judge.params import ClaimsConfig
from loopscope.judge.settling import attach, mark_settling
from loopscope.measure.trajectory.settling import WINDOWS

SCHEMA = json.loads((Path(__file__).parents[1] / "tables" / "claims.schema.json").read_text())
VALUES = {f.name: getattr(ClaimsConfig(), f.name) for f in dataclasses.fields(ClaimsConfig)}


def iv(value, lo=None, hi=None):
    return {"value": value, "lo": value - 0.01 if lo is None else lo,
            "hi": value + 0.01 if hi is None else hi}


def narrow(value, half=0.004):
    return iv(value, value - half, value + half)


def conv(r=8, useful=None, gain=0.2, steps=None, half_gain=0.05, flat=0.004, kl_ratio=-4.0,
         change_ratio=-1.0, median=6.0, share=0.1, ws_minus=None, content_minus=None,
         rare=(), sampler_mean=None, nominal_mean=None, median_half=1.0, sensitivity=None,
         late_decay=-0.05, two_step=1.5, floor=0.02, floor_half=0.01, settling=0.95,
         cycling=0.03, spread=0.0, period2=None):
    """Paper-B-like convergence metrics (the schema of convergence.summarize), with the
    per-token table beside them as the claims stage hands it over (token_table)."""
    d = 4 * r
    useful = r if useful is None else useful
    steps = {f"k{k}": narrow(-0.02) for k in range(1, r)} if steps is None else steps
    ws_minus = {"punctuation": iv(-1.0), "content_word": iv(-3.0)} \
        if ws_minus is None else ws_minus
    content_minus = {"whitespace": iv(3.0), "punctuation": iv(2.0)} \
        if content_minus is None else content_minus
    period2 = (0.1 if two_step > 1 else 0.8) if period2 is None else period2
    late = {f"{w:g}R": {"length_r": w, "from": d - int(w * r), "to": d,
                        "floor": narrow(1e-3 * floor, 1e-3 * floor_half), "rho": 0.8,
                        "floor_share": narrow(floor, floor_half),
                        "kl_alternation": narrow(0.0, 0.005),
                        "backward_share": narrow(0.1, 0.02),
                        "two_step_ratio": narrow(two_step, 0.05)} for w in WINDOWS}
    metrics = {
        "r": r, "max_depth": d, "sampler_mean": sampler_mean,
        "nominal_mean": nominal_mean,
        "elasticity": {"gain": iv(gain), "half_depth": r // 2, "half_gain": narrow(half_gain),
                       "steps": steps, "tail": narrow(0.0), "flat": narrow(flat, 0.003),
                       "flat_depth": d},
        "kl": {"k2": 0.4, f"k{2 * r}": 1e-5},
        "kl_decay": {"from": 2, "to": 2 * r, "log10_ratio": iv(kl_ratio, kl_ratio - 0.5,
                                                                kl_ratio + 0.5)},
        "state_change": {f"k{r}": 1e-2, f"k{d}": 1e-3},
        "state_decay": {"from": r, "to": d, "log10_ratio": iv(change_ratio, change_ratio - 0.2,
                                                               change_ratio + 0.2)},
        "cycle": {"late_from": d - r, "late_to": d,
                  "late_decay_per_loop": narrow(late_decay, 0.01),
                  "early_decay_per_loop": narrow(-0.1, 0.01),
                  "two_step_ratio": narrow(two_step, 0.05),
                  "period2_share": narrow(period2, 0.02)},
        "settling": {"windows": late},
        "convergence": {"epsilon": 1e-3,
                        "median_loop": iv(median, median - median_half, median + median_half),
                        "median_loop_shares": {f"k{int(median)}": 1.0},
                        "median_exit_loop": iv(3.0, 2.0, 4.0),
                        "share_after_r": iv(share)},
        "types": {"whitespace": {"mean_loop": 2.0, "share": 0.2},
                  "punctuation": {"mean_loop": 3.0, "share": 0.1},
                  "content_word": {"mean_loop": 5.0, "share": 0.3},
                  "judged": ["whitespace", "punctuation", "content_word"],
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
    return attach(metrics, token_table(settling, cycling, spread), 200, "main")


def token_table(settling=0.95, cycling=0.03, spread=0.0, docs=40, per_doc=20):
    """A per-token table (tables/convergence's late-window columns) whose tokens settle
    (no floor), cycle (a floor, every update pointing back) and drift (a floor, none
    pointing back) in the given shares; each document's share of settling tokens lies
    `spread` above or below the mean by turns."""
    labels = []
    for d in range(docs):
        k = round((settling + (spread if d % 2 else -spread)) * per_doc)
        c = min(round(cycling * per_doc), per_doc - k)
        labels += ["settling"] * k + ["cycling"] * c + ["drifting"] * (per_doc - k - c)
    labels = np.array(labels)
    floor = np.where(labels == "settling", 0.0, 1e-3)
    table = {"seed": 0, "doc": np.repeat(np.arange(docs), per_doc), "type": "content_word",
             "change_last": np.full(len(labels), 1e-3)}
    for w in WINDOWS:
        table.update({f"floor_{w:g}R": floor, f"floor_se_{w:g}R": np.zeros(len(labels)),
                      f"backward_{w:g}R": (labels == "cycling").astype(float),
                      f"kl_alternation_{w:g}R": np.zeros(len(labels))})
    return pd.DataFrame(table)


def policy(loops, delta=0.0, flops_baseline=0.7, matched=True, threshold=1e-3, r=8,
           flops=0.6, unchecked=0.63):
    """A rule's metrics at its chosen setting; mean loops cannot pass the cap R. flops:
    its FLOPs / depth R's with its checks counted, unchecked: without."""
    if not matched:
        return {"matched": False}
    spread = min(0.2, r - loops)
    return {"matched": True, "threshold": threshold, "mean_loops": loops,
            "mean_loops_iv": iv(loops, loops - spread, loops + spread),
            "loops_ratio_iv": iv(loops / r, (loops - spread) / r, (loops + spread) / r),
            "delta_ce": narrow(delta), "flops_ratio": flops,
            "flops_ratio_baseline": flops_baseline, "flops_ratio_iv": narrow(flops, 0.03),
            "flops_ratio_baseline_iv": narrow(flops_baseline, 0.03),
            "flops_ratio_unchecked_iv": narrow(unchecked, 0.02),
            "flops_ratio_baseline_unchecked_iv": narrow(unchecked * 8 / 7, 0.02)}


def curve(low=-0.05, mid=0.0, loops=(2.0, 3.5, 6.5, 7.5)):
    """A1's curve against uniform depth: CE - uniform's at equal mean loops, `low` at
    the settings of at most 4 of 8 loops, `mid` at the others."""
    return [{"threshold": 0.1 / (i + 1), "mean_loops": n,
             "delta_ce_uniform": narrow(low if n <= 4 else mid, 0.003)}
            for i, n in enumerate(loops)]


def pol(r=8, kl=None, probe=None, baseline=7, kl_curve=None):
    """A backbone's policies metrics; A1 against A2 paired from their mean loops."""
    kl = policy(5.0) if kl is None else kl
    probe = policy(7.95, threshold=0.0) if probe is None else probe
    if kl.get("matched") and probe.get("matched") and "vs_probe" not in kl:
        d = kl["mean_loops"] - probe["mean_loops"]
        kl = {**kl, "vs_probe": {"loops_diff": narrow(d, 0.2),
                                 "loops_diff_ratio": narrow(d / r, 0.025),
                                 "ce_diff": narrow(0.0)}}
    return {"r": r, "match_nats": 0.01, "choose_nats": 0.005,
            "baseline_depth": baseline, "uniform": {"matched_depth": baseline},
            "kl": kl, "probe": probe, "kl_curve": curve() if kl_curve is None else kl_curve}


def judged(c, p, second=True, values=None, second_conv=None):
    convs = {"main": c, "second": second_conv or conv(r=4)} if second else {"main": c}
    return paper_b_claims(convs, {"main": p}, "main", "second" if second else None,
                          {**VALUES, **(values or {})})


def verdicts(c, p, second=True, values=None):
    """The rows by key (token order: the main backbone's row)."""
    out = {}
    for row in judged(c, p, second, values):
        out.setdefault(row.key, row)
    return out


def test_paper_b_claims_hold_on_paper_like_metrics():
    found = verdicts(conv(), pol())
    findings = {k: c for k, c in found.items() if c.kind == "finding"}
    assert {c.verdict for c in findings.values()} == {"holds"}, \
        {k: (c.direction, c.magnitude, c.value) for k, c in findings.items()}
    assert found["period_two"].kind == "extension"
    assert found["period_two"].direction == "contradicted"  # no period-2 signature
    for row in found.values():  # every row says what it reads (rows.yaml)
        assert declared(row.key, row.extends)["conditions"] == "backbone"


def worse_step(k, lo, hi):
    steps = {f"k{j}": narrow(-0.02) for j in range(1, 8)}
    steps[f"k{k}"] = iv((lo + hi) / 2, lo, hi)
    return steps


@pytest.mark.parametrize("change, key, verdict", [
    # a step that worsens CE by more than flat_nats: not monotone
    (dict(steps=worse_step(5, 0.02, 0.04)), "elasticity", "contradicted"),
    (dict(steps=worse_step(5, -0.01, 0.03)), "elasticity", "inconclusive"),
    # the second half of the depth does not help: the extension, not the paper's finding
    (dict(half_gain=0.0), "elasticity_second_half", "contradicted"),
    (dict(half_gain=0.0), "elasticity", "holds"),
    (dict(flat=0.05), "flat_past_r", "contradicted"),
    (dict(flat=0.009), "flat_past_r", "inconclusive"),
    (dict(kl_ratio=1.0), "kl_decay", "contradicted"),
    (dict(kl_ratio=0.0), "kl_decay", "inconclusive"),
    (dict(change_ratio=0.5), "state_decay", "contradicted"),
    (dict(change_ratio=0.1), "state_decay", "inconclusive"),
    (dict(median=10.0), "median_convergence", "contradicted"),
    (dict(median=7.5), "median_convergence", "inconclusive"),
    # a tail of 0% is no tail; one that may be under the 2% floor is not shown to be one
    (dict(share=0.0), "tail", "contradicted"),
    (dict(share=0.02), "tail", "inconclusive"),
    (dict(ws_minus={"punctuation": iv(1.0), "content_word": iv(-3.0)}), "token_order",
     "contradicted"),
    (dict(ws_minus={"punctuation": iv(0.0, -0.5, 0.5), "content_word": iv(-3.0)}),
     "token_order", "inconclusive"),
    (dict(useful=12), "saturation", "contradicted"),
    (dict(useful=3), "saturation", "contradicted"),
    (dict(useful=6.5), "saturation", "inconclusive"),
])
def test_each_paper_b_claim_can_fail(change, key, verdict):
    assert verdicts(conv(**change), pol())[key].direction == verdict


def test_a_cycle_on_a_floor_is_not_a_fixed_point():
    """The mean state change falls from R to 4R, but over the late window it levels off
    at a floor (95% of the change at D) and most tokens turn back at every loop: the
    fixed-point extension is contradicted, the period-2 row holds. The paper's finding,
    the change decaying, holds: its one statistic does not see the floor."""
    found = verdicts(conv(floor=0.95, settling=0.2, cycling=0.7, two_step=0.4), pol())
    assert found["state_decay_floor"].direction == "contradicted"
    assert found["state_decay_floor"].extends == "state_decay"
    assert "cycling 70.0%" in found["state_decay_floor"].value
    assert found["state_decay"].direction == "holds"
    assert found["period_two"].direction == "holds"


@pytest.mark.parametrize("change, verdict", [
    (dict(), "holds"),
    (dict(floor=0.95), "contradicted"),  # the mean change levels off at a floor
    (dict(settling=0.5), "contradicted"),  # half the tokens sit on a floor of their own
    (dict(floor=0.1, floor_half=0.05), "inconclusive"),  # the floor straddles the tolerance
    (dict(settling=0.9, spread=0.1), "inconclusive"),  # the settling share straddles 90%
])
def test_the_fixed_point_row_reads_the_floor_and_the_settling_share(change, verdict):
    row = verdicts(conv(**change), pol())["state_decay_floor"]
    assert row.direction == verdict, row.value
    assert [t.unit for t in row.tests] == ["ratio", "share"]
    assert {"late_window", "floor_share", "settling_share", "alternating_share",
            "precision_floor"} <= set(
        row.facts["robustness"]["swept"])


def test_the_fixed_point_row_is_not_shown_without_the_late_window():
    c = conv()
    del c["settling"]
    row = verdicts(c, pol())["state_decay_floor"]
    assert row.direction == "not shown" and "rerun its convergence stage" in row.value
    assert verdicts(c, pol())["state_decay"].direction == "holds"  # the paper's statistic


def test_the_fixed_point_row_says_when_the_backbones_differ_in_kind():
    """The main backbone sits on a floor, the second settles: the row says so, in its
    facts and in words; two backbones that both settle do not differ."""
    c = {"main": conv(floor=0.95), "second": conv(r=4)}
    rows = paper_b_claims(c, {"main": pol()}, "main", "second", VALUES)
    mark_settling(rows, c, ["main", "second"], VALUES)
    row = next(r for r in rows if r.key == "state_decay_floor")
    assert row.facts["settling_kinds"] == {"main": "on a floor", "second": "settles"}
    assert row.facts["differ_in_kind"] and "the backbones differ in kind" in row.value
    main = row.facts["settling_shares"]["main"]
    assert [r["type"] for r in main] == ["all", "content_word"]
    assert main[0]["settling"]["value"] == pytest.approx(0.95)
    record = {**row.record(), "id": "B.state_decay_floor.main", "paper": "B", "group": "main",
              "extends": "B.state_decay.main"}
    jsonschema.validate(claims_json([], [record]), SCHEMA)  # every field it carries declared
    c = {"main": conv(), "second": conv(r=4)}
    rows = paper_b_claims(c, {"main": pol()}, "main", "second", VALUES)
    mark_settling(rows, c, ["main", "second"], VALUES)
    row = next(r for r in rows if r.key == "state_decay_floor")
    assert not row.facts["differ_in_kind"] and "differ" not in row.value


def test_the_period_two_row_tests_its_share_of_tokens_at_declared_thresholds():
    """The two-step / one-step ratio 0.156 [0.074, 1.27] straddles 1, but 25.4% [21.4%,
    30.5%] of tokens with the smaller two-step change is well short of a majority: no
    period-2 signature. Both thresholds are swept; at 25% of tokens the row turns."""
    c = conv()
    c["settling"]["windows"]["1R"]["two_step_ratio"] = iv(0.156, 0.074, 1.27)
    c["cycle"]["period2_share"] = iv(0.254, 0.214, 0.305)
    row = verdicts(c, pol())["period_two"]
    assert row.direction == "contradicted" and row.kind == "extension"
    assert [t.unit for t in row.tests] == ["ratio", "share"]
    robust = row.facts["robustness"]
    assert {"late_window", "period2_ratio", "period2_tokens"} <= set(robust["swept"])
    assert {"parameter": "period2_tokens", "value": 0.25, "verdict": "inconclusive"} in \
        robust["turns"]


def test_token_order_needs_both_ends_not_a_content_whitespace_gap():
    found = verdicts(conv(content_minus={"whitespace": iv(3.0), "punctuation": iv(-1.0)}),
                     pol())
    assert found["token_order"].direction == "contradicted"


def test_token_order_is_corrected_for_its_comparisons():
    """Whitespace - punctuation 0.1 [0.006, 0.21]: against the claim at 95%, but not at
    1 - 0.05 / 4 for the row's four comparisons: the row is inconclusive, where the same
    difference far from zero contradicts it."""
    near = verdicts(conv(ws_minus={"punctuation": iv(0.1, 0.006, 0.21),
                                   "content_word": iv(-3.0)}), pol())["token_order"]
    assert near.direction == "inconclusive" and near.record()["comparisons"] == 4
    far = verdicts(conv(ws_minus={"punctuation": iv(1.0), "content_word": iv(-3.0)}), pol())
    assert far["token_order"].direction == "contradicted"


def test_token_order_is_not_judged_on_rare_types():
    c = conv(rare=["whitespace"])
    del c["types"]["whitespace_minus"]
    found = verdicts(c, pol())["token_order"]
    assert found.direction == "not shown" and "whitespace" in found.value


def test_token_order_is_judged_on_both_backbones():
    found = judged(conv(), pol())
    assert [c.claim for c in found if c.key == "token_order"] == [
        "Convergence depth is ordered by token type [main]: whitespace shallowest, content "
        "words deepest",
        "Convergence depth is ordered by token type [second]: whitespace shallowest, "
        "content words deepest"]


@pytest.mark.parametrize("change, key, magnitude", [
    # the KL decay within 1.5x of the paper's 4.66 decades: too shallow or too steep fails
    (dict(kl_ratio=-2.0), "kl_decay", "contradicted"),
    (dict(kl_ratio=-8.0), "kl_decay", "contradicted"),
    (dict(kl_ratio=-3.2), "kl_decay", "inconclusive"),
    # the median loop: 0.75 R one loop either side, on both sides
    (dict(median=3.0), "median_convergence", "contradicted"),
    (dict(median=7.5, median_half=0.1), "median_convergence", "contradicted"),
    (dict(median=7.0, median_half=0.0), "median_convergence", "holds"),
    (dict(median=5.0, median_half=0.0), "median_convergence", "holds"),
    (dict(median=6.5), "median_convergence", "inconclusive"),
])
def test_paper_b_magnitude_bands_fail_on_both_sides(change, key, magnitude):
    assert verdicts(conv(**change), pol())[key].magnitude == magnitude


def test_magnitudes_have_their_own_verdicts_and_the_headline_needs_both():
    found = verdicts(conv(share=0.5, kl_ratio=-1.0, median=2.0), pol())
    for key in ("tail", "kl_decay", "median_convergence"):
        assert (found[key].direction, found[key].magnitude) == ("holds", "contradicted")
        assert found[key].verdict == "contradicted"


@pytest.mark.parametrize("kl, verdict", [
    (policy(8.0), "contradicted"),                 # saves nothing
    (policy(7.85), "inconclusive"),                # the loops interval reaches R
    (policy(0, matched=False), "inconclusive"),    # unmatched: never holds or contradicted
])
def test_a1_claim_can_fail(kl, verdict):
    assert verdicts(conv(), pol(kl=kl))["a1_fewer_loops"].direction == verdict


@pytest.mark.parametrize("kl, verdict", [
    (policy(5.0, delta=0.05), "contradicted"),     # worse than R beyond the margin
    (policy(5.0, delta=0.008), "inconclusive"),    # non-inferiority not shown
    (policy(5.0, delta=0.006), "holds"),           # the upper bound at the margin
])
def test_a1_matched_quality_is_an_extension_that_leaves_the_finding_alone(kl, verdict):
    """The report windows' quality is a second statistic: it decides the extension
    beside A1, and the finding, mean loops / R, is the same whatever it says."""
    found = verdicts(conv(), pol(kl=kl))
    row = found["a1_matches_quality"]
    assert (row.kind, row.extends, row.direction) == ("extension", "a1_fewer_loops", verdict)
    assert found["a1_fewer_loops"].direction == "holds"


def test_a1_magnitude_is_the_papers_share_of_r_and_the_baseline_an_extension():
    """A1 at 6.5 of 8 loops: fewer than R (the direction holds), but not the paper's
    4.94 / 8 (the magnitude is contradicted); against a matching uniform depth of 6 it
    runs more loops, which only the extension beside it says."""
    found = verdicts(conv(), pol(kl=policy(6.5), baseline=6))
    a1 = found["a1_fewer_loops"]
    assert (a1.direction, a1.magnitude) == ("holds", "contradicted")
    below = found["a1_below_baseline"]
    assert (below.kind, below.extends) == ("extension", "a1_fewer_loops")
    assert below.direction == "contradicted" and "uniform depth 6" in below.value
    assert verdicts(conv(), pol())["a1_below_baseline"].direction == "holds"


@pytest.mark.parametrize("kl, verdict, magnitude", [
    (policy(5.0, unchecked=0.63), "holds", "holds"),
    (policy(5.0, unchecked=0.80), "holds", "contradicted"),  # a smaller saving than 38%
    (policy(5.0, unchecked=0.69), "holds", "inconclusive"),  # straddles 0.62 + 0.0625
    (policy(5.0, unchecked=1.0), "inconclusive", "contradicted"),
    (policy(5.0, unchecked=1.1), "contradicted", "contradicted"),
    (policy(0, matched=False), "inconclusive", "n/a"),
])
def test_a1_compute_is_the_papers_proxy_with_checks_not_counted(kl, verdict, magnitude):
    """A1 in FLOPs is an extension of A1's mean loops: the paper's -38% is counted once."""
    found = verdicts(conv(), pol(kl=kl, baseline=6))["a1_saves_compute"]
    assert (found.direction, found.magnitude) == (verdict, magnitude)
    assert (found.kind, found.extends) == ("extension", "a1_fewer_loops")


@pytest.mark.parametrize("flops, flops_baseline, verdict", [
    (0.6, 0.8, "holds"),
    # fewer loops, but the checks cost more than they save: as many FLOPs as depth R
    (1.0, 1.5, "contradicted"),   # against the baseline, wholly above 1
    (1.1, 1.5, "contradicted"),
    (0.8, 1.0, "inconclusive"),
])
def test_a1_with_its_checks_counted_is_an_extension(flops, flops_baseline, verdict):
    found = verdicts(conv(), pol(kl=policy(5.0, flops=flops, flops_baseline=flops_baseline),
                                 baseline=6))["a1_saves_counted"]
    assert (found.kind, found.extends, found.direction) == ("extension", "a1_fewer_loops",
                                                            verdict)


@pytest.mark.parametrize("probe, verdict", [
    (policy(4.0, threshold=0.1), "contradicted"),     # a good probe saves loops
    (policy(4.0, delta=0.05), "inconclusive"),        # cheaper but not at matched quality
    (policy(7.6), "inconclusive"),                    # interval straddles 0.95 R
    (policy(8.0, delta=0.05), "holds"),               # no saving whatever the quality
    (policy(0, matched=False), "inconclusive"),       # unmatched: no measurement
])
def test_a2_saves_nothing_can_fail(probe, verdict):
    assert verdicts(conv(), pol(probe=probe))["a2_saves_nothing"].direction == verdict


@pytest.mark.parametrize("probe, verdict", [
    (policy(7.95, threshold=0.0), "holds"),     # the paper's 4.94 against 7.99
    (policy(4.0, threshold=0.1), "contradicted"),  # A2 saves more than A1
    (policy(5.1, threshold=0.1), "inconclusive"),  # the paired interval straddles 0
    (policy(0, matched=False), "inconclusive"),    # A2 unmatched: nothing measured
])
def test_a1_beats_a2_is_paired_and_can_fail(probe, verdict):
    found = verdicts(conv(), pol(probe=probe))["a1_beats_a2"]
    assert (found.kind, found.direction) == ("finding", verdict), found.value
    assert {t.reads for t in found.tests + found.magnitude_tests} <= {"(A1 - A2 mean loops) / R"}


def test_a1_beats_a2_magnitude_is_the_papers_gap():
    # A1 beats A2 by a loop where the paper has three: the direction holds, the size not
    found = verdicts(conv(), pol(probe=policy(6.0, threshold=0.1)))["a1_beats_a2"]
    assert (found.direction, found.magnitude) == ("holds", "contradicted")


@pytest.mark.parametrize("kl_curve, verdict", [
    (curve(), "holds"),
    (curve(low=0.03), "contradicted"),              # uniform depth is better at low depth
    (curve(mid=-0.05), "contradicted"),             # not equal near the mean depth
    (curve(low=-0.002), "inconclusive"),            # too close to call at low depth
    (curve(loops=(6.5, 7.5)), "inconclusive"),      # no setting at low depth
    (curve(loops=(2.0, 3.0)), "inconclusive"),      # none in the mean depth range
])
def test_a1_curve_against_uniform_depth_can_fail(kl_curve, verdict):
    found = verdicts(conv(), pol(kl_curve=kl_curve))["a1_curve"]
    assert (found.kind, found.verdict) == ("finding", verdict), found.value


def test_saturation_is_not_shown_with_one_backbone():
    assert verdicts(conv(), pol(), second=False)["saturation"].direction == "not shown"


def test_claims_name_the_depth_they_compare_against():
    found = verdicts(conv(sampler_mean=9.0, nominal_mean=8.0), pol())
    assert "R = 8 (model.loops, m = 8, E[r] = 9)" in found["elasticity"].claim
    assert "R = 8" in found["a1_fewer_loops"].criterion


def test_every_row_carries_its_backbones_regime_as_words_and_as_data():
    found = judged(conv(useful=3), pol())
    assert all(c.regime for c in found)  # every row is read on a backbone
    main_rows = [c for c in found if c.facts["backbones"] == ["main"]]
    assert main_rows and all(c.regime.startswith("outside the paper's regime (main")
                             for c in main_rows)
    assert main_rows[0].facts["regimes"][0]["state"] == "outside"
    assert main_rows[0].facts["regimes"][0]["floor"] == 6.0
    assert all("in the paper's regime" in c.regime for c in judged(conv(), pol()))
    edge = judged(conv(useful=6.5), pol())  # interval [5.5, 6.5] around 0.75 x 8 = 6
    assert edge[0].regime.startswith("at the edge of the paper's regime")
    # the regime share is a declared parameter: at 0.5 the same backbone is inside
    assert judged(conv(useful=6.5), pol(), values={"regime": 0.5})[0].regime.startswith("in ")


def test_saturation_failing_low_is_contradicted_not_excused_by_the_regime():
    found = verdicts(conv(useful=3), pol())["saturation"]
    assert found.direction == "contradicted"
    assert "outside the paper's regime (main" in found.regime


def test_regime_is_read_against_the_nominal_mean():
    # R = 8 evaluated, trained at nominal mean m = 7 (depth_mean: loops): 0.75 m = 5.25
    found = judged(conv(useful=6, nominal_mean=7.0, sampler_mean=8.0), pol())
    assert "0.75 m = 5.25" in found[0].regime and "at the edge" in found[0].regime


def test_saturation_is_fragile_where_a_tolerance_turns_it():
    second = conv(r=4, sensitivity={0.003: 4, 0.01: 4})
    found = next(c for c in judged(conv(useful=5, sensitivity={0.003: 8, 0.01: 5}), pol(),
                                   second_conv=second) if c.key == "saturation")
    assert found.direction == "contradicted"
    rob = found.facts["robustness"]
    assert rob["mark"] == "fragile"
    assert {"parameter": "useful depth's tolerance", "value": "0.003 nats",
            "verdict": "holds"} in rob["turns"]
    steady = next(c for c in judged(conv(useful=8, sensitivity={0.003: 8, 0.01: 8}), pol(),
                                    second_conv=second) if c.key == "saturation")
    assert steady.direction == "holds"
    assert not [t for t in steady.facts["robustness"]["turns"]
                if t["parameter"] == "useful depth's tolerance"]


def test_a_parameter_sweep_marks_a_row_fragile():
    """Elasticity's worst step at 0.008 [0.006, 0.0095]: under the 0.01-nat flat_nats,
    over the 0.005 in its range: fragile, with the value that turns it."""
    found = verdicts(conv(steps=worse_step(5, 0.006, 0.0095)), pol())["elasticity"]
    assert found.direction == "holds"
    rob = found.facts["robustness"]
    assert rob["mark"] == "fragile" and "flat_nats" in rob["swept"]
    assert {"parameter": "flat_nats", "value": 0.005, "verdict": "contradicted"} in rob["turns"]
    robust = verdicts(conv(flat=0.001), pol())["flat_past_r"].facts["robustness"]
    assert robust["mark"] == "robust" and robust["turns"] == []
    assert robust["swept"] == {"flat_nats": [0.005, 0.02]}


def test_every_paper_b_claim_shows_its_backbones_useful_depth_against_r():
    found = judged(conv(useful=3), pol())
    assert all(c.depth_use for c in found)
    assert found[0].depth_use == "main: useful depth 3 [2, 3] of R = 8"
    order_second = [c for c in found if c.key == "token_order"][1]
    assert order_second.depth_use == "second: useful depth 4 [3, 4] of R = 4"
    assert found[-1].depth_use == ("second: useful depth 4 [3, 4] of R = 4; "
                                   "main: useful depth 3 [2, 3] of R = 8")


def test_paper_b_rows_say_what_they_resample_and_that_one_seed_conditions_them():
    main = dict(conv(), units=52, unit="block of 2 windows within 13 documents", seeds=1,
                documents=13, design_effect={"value": 1.8})
    found = paper_b_claims({"main": main, "second": dict(conv(r=4), units=52, seeds=2)},
                           {"main": pol()}, "main", "second", VALUES)
    assert found[0].resampled == (
        "main: 52 units (block of 2 windows within 13 documents), documents resampled "
        "first (13; design effect 1.80), one seed: conditional on that trained model")
    assert found[-1].resampled.startswith("second: 52 units (document) x 2 seeds; main:")


def test_paper_b_claims_are_not_shown_without_a_backbone():
    found = paper_b_claims({}, {}, None, None, VALUES)
    assert found and {c.direction for c in found} == {"not shown"}


def test_a_backbone_of_two_seeds_decides_only_where_each_seed_alone_agrees():
    """The pooled metrics hold on every finding; the second seed's own elasticity has a
    step that makes CE worse: with 2 seeds (under 3) the row turns inconclusive and says
    why, while the rows on which both seeds agree keep their verdicts."""
    bad = conv(steps=worse_step(3, 0.03, 0.05))
    two = {**conv(), "seeds": 2, "per_seed": {"seed42": conv(), "seed43": bad}}
    pols = {**pol(), "per_seed": {"seed42": pol(), "seed43": pol()}}
    found = {r.key: r for r in paper_b_claims({"main": two}, {"main": pols}, "main", None,
                                              VALUES)}
    assert verdicts(conv(), pol(), second=False)["elasticity"].direction == "holds"
    row = found["elasticity"]
    assert row.direction == "inconclusive" and "not on each seed alone" in row.value
    assert [s["direction"] for s in row.facts["seeds"]["each"]] == ["holds", "contradicted"]
    assert found["flat_past_r"].direction == "holds"  # both seeds agree
    assert found["a1_fewer_loops"].verdict == "holds"
    one = {r.key: r for r in paper_b_claims({"main": conv(steps=worse_step(3, 0.03, 0.05))},
                                            {"main": pol()}, "main", None, VALUES)}
    assert one["elasticity"].direction == "contradicted"  # one seed: its own verdict


def test_the_median_and_tail_are_swept_over_the_measured_kl_epsilons():
    c = conv()
    c["by_epsilon"] = [{**c["convergence"], "epsilon": e} for e in (5e-4, 1e-3, 2e-3)]
    c["by_epsilon"][2] = {**c["by_epsilon"][2], "share_after_r": iv(0.005)}  # no tail there
    found = verdicts(c, pol())
    tail = found["tail"].facts["robustness"]
    assert tail["swept"]["KL epsilon"] == [5e-4, 1e-3, 2e-3]
    assert tail["mark"] == "fragile"
    assert tail["turns"] == [{"parameter": "KL epsilon", "value": 2e-3,
                              "verdict": "contradicted"}]
    assert "KL epsilon" in found["median_convergence"].facts["robustness"]["swept"]


def test_paper_bs_metrics_are_read_as_typed_records_indexed_by_loop():
    """The one place a stored loop key ("k1", ...) is parsed: loops come back as ints in
    loop order (k10 after k2), a key of another form and a missing field fail, naming
    them, instead of reading as a wrong loop."""
    from loopscope.base.errors import DataError
    from loopscope.judge.metrics_b import ConvergenceMetrics, by_loop

    assert list(by_loop({"k10": 0.1, "k2": 0.5, "k1": 0.9}).items()) == [
        (1, 0.9), (2, 0.5), (10, 0.1)]
    with pytest.raises(DataError, match="'loop3'"):
        by_loop({"loop3": 1.0})
    m = ConvergenceMetrics({"r": 8, "kl": {"k2": 0.3, "k16": 1e-5},
                            "kl_decay": {"from": 2, "to": 16, "log10_ratio": {"value": -4.5}}})
    assert m.kl[m.kl_decay.start] == 0.3 and m.kl[m.kl_decay.end] == 1e-5
    with pytest.raises(DataError, match="'state_change'"):
        _ = m.state_change
