"""Paper B's depth-policy rows: A1 (the KL exit rule, no training) and A2 (a probe
trained on oracle labels), each read at the setting the policies stage chose on the
choose windows to match depth R's quality. A1's -38% is counted once, on its mean
loops / R; its matched quality on the report windows and its FLOPs are extensions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from loopscope.judge.backbone import FINDINGS, RESULTS, Backbone
from loopscope.judge.metrics_b import threshold_text
from loopscope.judge.verdicts import (
    Claim,
    Comparison,
    at_least,
    at_most,
    below,
    claim,
    extension,
    inside,
    negligible,
    not_shown,
)
from loopscope.stats.intervals import Interval

PAPER_A1 = 4.94 / 8  # A1's mean loops at R = 8, as a share of R (-38%)
PAPER_A2 = 7.99 / 8  # A2's mean loops at R = 8, as a share of R
PAPER_A1_A2 = PAPER_A1 - PAPER_A2  # A1's mean loops minus A2's, as a share of R


UNMATCHED = "no setting matched depth R's quality on the choose windows: nothing measured"


def _policy_value(q: dict[str, Any], p: dict[str, Any]) -> str:
    base = p["baseline_depth"]
    bare = q.get("flops_ratio_unchecked_iv")
    which = "thresholds, each seed's own" if "thresholds" in q else "threshold"
    return (f"{which} {threshold_text(q)}: {Interval.of(q['mean_loops_iv'])} mean loops; "
            f"CE - CE(R) {Interval.of(q['delta_ce'])}; FLOPs x{q['flops_ratio']:.2f} of "
            f"depth R, x{q['flops_ratio_baseline']:.2f} of uniform depth {base} (checks "
            "counted)" + (f", x{bare['value']:.2f} of depth R (checks not counted)"
                          if bare else ""))


def _policy_row(b: Backbone, rule: str, text: str, paper: str, crit: str, key: str,
                tests: Callable[[dict[str, Any], dict[str, Any]],
                                tuple[list[Comparison], list[Comparison]]],
                source: str) -> Claim:
    """A row on one rule's chosen setting: not shown where the rule was not swept,
    inconclusive where no setting matched depth R, else decided on its tests."""
    q = (b.pol or {}).get(rule)
    if q is None:
        return not_shown(text, paper, "-", f"the {rule} rule was not swept on this backbone")
    if not q.get("matched"):
        return replace(Claim(text, paper, crit, UNMATCHED, "inconclusive"), key=key,
                       source=source)
    direction, magnitude = tests(b.pol, q)
    return claim(text, paper, crit, _policy_value(q, b.pol), direction, magnitude, key=key,
                 source=source)


def a1_fewer_loops(b: Backbone) -> Claim:
    """Paper B: A1 (KL exit) matches uniform depth-8 quality at 4.94 mean loops (-38%),
    on its one statistic, mean loops / R (the paper's FLOPs proxy): below 1, and as a
    magnitude within a1_band of 4.94 / 8. The setting is the one chosen on the choose
    windows to match depth R's quality; that the report windows confirm the match, and
    what it saves in FLOPs, are extensions (a1_matches_quality, a1_saves_compute,
    a1_saves_counted)."""
    band = b.p.a1_band
    lo, hi = PAPER_A1 - band, PAPER_A1 + band
    return _policy_row(
        b, "kl", f"A1 (KL exit) matches uniform depth-R quality in fewer loops [{b.name}]",
        "4.94 mean loops at R = 8 (-38%)",
        f"mean loops / R < 1 at the setting matching depth R's quality on the choose "
        f"windows, {b.depth} (interval); magnitude: inside [{lo:.3g}, {hi:.3g}], the "
        f"paper's 4.94 / 8 = {PAPER_A1:.3g} +- {band:g} (interval)", "a1_fewer_loops",
        lambda p, q: ([b.test("mean loops / R", q["loops_ratio_iv"], below, 1.0,
                              unit="share of R")],
                      [b.test("mean loops / R", q["loops_ratio_iv"], inside, lo, hi,
                              unit="share of R", paper=PAPER_A1)]),
        f"{FINDINGS}: A1 'reaches uniform depth-8 quality in 4.94 loops on average (-38%)'")


def a1_matches_quality(b: Backbone) -> Claim:
    """Beyond the paper (an extension of a1_fewer_loops): the quality A1 was matched at
    on the choose windows holds on the report windows, a one-sided non-inferiority
    test (CE - CE(R) at most noninferiority_nats; the threshold was chosen at half the
    policies' match_nats)."""
    m = b.p.noninferiority_nats
    return extension(_policy_row(
        b, "kl", f"A1's matched quality holds on the report windows [{b.name}]",
        "(the paper matches on one set)",
        f"CE - CE(R) on report at most {m:g} nats (upper bound; contradicted when the lower "
        f"bound is above), {b.depth}", "a1_matches_quality",
        lambda p, q: ([b.test("CE - CE(R)", q["delta_ce"], at_most, m, unit="nats")], []),
        ""), "a1_fewer_loops")


def a1_below_baseline(b: Backbone) -> Claim:
    """Beyond the paper (an extension of a1_fewer_loops): A1's mean loops below the
    smallest uniform depth that matches R's quality on the choose windows (the honest
    baseline: a uniform depth that matches R costs no checks)."""
    base = (b.pol or {}).get("baseline_depth")
    return extension(_policy_row(
        b, "kl", f"A1 (KL exit) runs fewer loops than the smallest uniform depth matching R "
        f"[{b.name}]", "(not in the paper: it compares with depth 8)",
        f"mean loops < the smallest uniform depth matching R's quality ({base}, interval)",
        "a1_below_baseline",
        lambda p, q: ([b.test("mean loops", q["mean_loops_iv"], below, p["baseline_depth"],
                              unit="loops")], []), ""), "a1_fewer_loops")


def a1_saves_compute(b: Backbone) -> Claim:
    """Beyond the paper (an extension of a1_fewer_loops): paper B's -38% is in mean
    loops, a FLOPs proxy that counts no exit check; this reads it in FLOPs per token,
    checks not counted, where the prelude, the embedding and the final readout count
    too, against uniform depth R, held to the paper's number within a1_band."""
    band = b.p.a1_band
    lo, hi = PAPER_A1 - band, PAPER_A1 + band
    return extension(_policy_row(
        b, "kl", f"A1 (KL exit) saves compute at matched quality [{b.name}]",
        "-38% loops (checks not counted)",
        f"FLOPs per token (checks not counted) / depth R's < 1, {b.depth} (interval); "
        f"magnitude: inside [{lo:.3g}, {hi:.3g}], the paper's {PAPER_A1:.3g} +- {band:g} "
        "(interval)", "a1_saves_compute",
        lambda p, q: ([b.test("FLOPs / depth R's (checks not counted)",
                              q["flops_ratio_unchecked_iv"], below, 1.0, unit="ratio")],
                      [b.test("FLOPs / depth R's (checks not counted)",
                              q["flops_ratio_unchecked_iv"], inside, lo, hi, unit="ratio",
                              paper=PAPER_A1)]),
        f"{FINDINGS}: 'a 38% reduction of the mean depth (a FLOPs proxy)'"), "a1_fewer_loops")


def a1_saves_counted(b: Backbone) -> Claim:
    """Beyond the paper (an extension of a1_fewer_loops): A1's FLOPs with its checks
    counted (each reads the coda and head over every active token), against uniform
    depth R and against the smallest uniform depth matching R's quality."""
    base = (b.pol or {}).get("baseline_depth")
    return extension(_policy_row(
        b, "kl", f"A1 (KL exit) saves compute with its checks counted [{b.name}]",
        "(not in the paper: its proxy counts no check)",
        f"FLOPs per token (checks counted) / depth R's < 1, and / the smallest uniform depth "
        f"matching R's ({base}) < 1 (intervals)", "a1_saves_counted",
        lambda p, q: ([b.test("FLOPs / depth R's", q["flops_ratio_iv"], below, 1.0,
                              unit="ratio"),
                       b.test("FLOPs / the baseline's", q["flops_ratio_baseline_iv"], below,
                              1.0, unit="ratio")], []), ""), "a1_fewer_loops")


def a2_saves_nothing(b: Backbone) -> Claim:
    """Paper B: A2 (a linear probe trained on oracle convergence labels) needs 7.99 of 8
    loops: no saving. Holds when its chosen setting runs at least a2_share x R loops (no
    saving whatever its quality); contradicted only by a real saving at matched quality
    (both comparisons then decided, by the family-wise rule)."""
    share, m = b.p.a2_share, b.p.noninferiority_nats
    row = _policy_row(
        b, "probe", f"A2 (oracle-labelled probe) saves nothing [{b.name}]",
        "7.99 mean loops: no saving",
        f"mean loops at matched quality (upper bound of CE - CE(R) <= {m:g} nats) >= "
        f"{share:g} R, {b.depth} (interval)", "a2_saves_nothing",
        lambda p, q: ([b.test("mean loops", q["mean_loops_iv"], at_least, share * b.r,
                               unit="loops", paper=PAPER_A2 * b.r)], []),
        f"{FINDINGS}: the router 'needs almost the full depth (7.99 loops)'")
    q = (b.pol or {}).get("probe") or {}
    if row.direction == "contradicted":  # a saving, but is it at matched quality?
        quality = b.test("CE - CE(R)", q["delta_ce"], at_most, m, unit="nats").verdict()
        row.direction = "contradicted" if quality == "holds" else "inconclusive"
    return row


def a1_beats_a2(b: Backbone) -> Claim:
    """Paper B: reading convergence beats learning to predict it. A1 (no training) and
    A2 (a probe trained on oracle labels), each at the setting matching depth R's
    quality, on the same report tokens: A1's mean loops minus A2's, as a share of R,
    below 0, and as a magnitude within a1_band of the paper's (4.94 - 7.99) / 8. Each
    seed runs its own chosen setting of each rule (paired per token)."""
    band = b.p.a1_band
    lo, hi = PAPER_A1_A2 - band, PAPER_A1_A2 + band
    text = f"Reading convergence beats learning it: A1 runs fewer loops than A2 [{b.name}]"
    paper = "4.94 against 7.99 mean loops at R = 8"
    crit = (f"(A1's mean loops - A2's) / R < 0 at their settings matching depth R's quality, "
            f"paired on the report tokens, {b.depth} (interval); magnitude: inside "
            f"[{lo:.3g}, {hi:.3g}], the paper's {PAPER_A1_A2:.3g} +- {band:g} (interval)")
    src = (f"{FINDINGS}: 'reading the model's state dynamics directly beats learning to "
           "predict them'")
    pol = b.pol or {}
    if "kl" not in pol or "probe" not in pol:
        return replace(not_shown(text, paper, crit, "A1 or A2 was not swept on this "
                                 "backbone"), key="a1_beats_a2", source=src)
    q = pol["kl"].get("vs_probe")
    if q is None:
        return replace(Claim(text, paper, crit, "A1 or A2 matched no setting on some seed: "
                             "nothing measured", "inconclusive"), key="a1_beats_a2",
                       source=src)
    value = (f"A1 - A2: {Interval.of(q['loops_diff'])} mean loops "
             f"({Interval.of(q['loops_diff_ratio'])} of R); CE {Interval.of(q['ce_diff'])}"
             f" nats; A1 {pol['kl']['mean_loops']:.2f}, A2 {pol['probe']['mean_loops']:.2f}"
             " mean loops")
    return claim(text, paper, crit, value,
                 [b.test("(A1 - A2 mean loops) / R", q["loops_diff_ratio"], below, 0.0,
                         unit="share of R")],
                 [b.test("(A1 - A2 mean loops) / R", q["loops_diff_ratio"], inside, lo, hi,
                         unit="share of R", paper=PAPER_A1_A2)], key="a1_beats_a2",
                 source=src)


def a1_curve(b: Backbone) -> Claim:
    """Paper B: A1 beats uniform depth at low depths and equals it in the mean depth
    range. One statistic along A1's whole quality-compute curve: at each swept setting,
    its CE minus uniform depth's at the same mean loops (the uniform curve interpolated
    between depths; the policies stage's `kl_curve`), on the report windows. Below 0 at
    every setting of at most low_depth x R mean loops; within +-margin_nats at every
    setting of at least mean_range x R (the family-wise rule over all of them)."""
    low, mid, m = b.p.low_depth, b.p.mean_range, b.p.margin_nats
    text = f"A1 beats uniform depth at low depth and equals it near the mean depth [{b.name}]"
    paper = "better at low depths, equal in the mean depth range"
    crit = (f"CE - uniform depth's CE at equal mean loops (report windows, intervals): "
            f"< 0 at every A1 setting of at most {low:g} R mean loops; inside +-{m:g} nats "
            f"at every setting of at least {mid:g} R, {b.depth}")
    src = (f"{RESULTS} (its summary, translated): A1 'outperforms the uniform baseline at "
           "low depths and matches it in the mean-depth range'")
    curve = (b.pol or {}).get("kl_curve")
    if curve is None:
        return replace(not_shown(text, paper, crit, "A1's curve was not measured on this "
                                 "backbone"), key="a1_curve", source=src)
    of = "CE - uniform depth's at equal mean loops"
    lows = [e for e in curve if e["mean_loops"] <= low * b.r]
    mids = [e for e in curve if e["mean_loops"] >= mid * b.r]
    if not lows or not mids:
        return replace(Claim(text, paper, crit, "no swept A1 setting at "
                             + ("low depth" if not lows else "the mean depth range"),
                             "inconclusive"), key="a1_curve", source=src)
    tests = ([b.test(f"{of}, {e['mean_loops']:.2f} loops", e["delta_ce_uniform"], below,
                     0.0, unit="nats", of=of) for e in lows]
             + [b.test(f"{of}, {e['mean_loops']:.2f} loops", e["delta_ce_uniform"],
                       negligible, m, unit="nats", of=of) for e in mids])
    value = "; ".join(f"{e['mean_loops']:.2f} loops: {Interval.of(e['delta_ce_uniform'])}"
                      for e in (*lows, *mids))
    return claim(text, paper, crit, value, tests, key="a1_curve", source=src)
