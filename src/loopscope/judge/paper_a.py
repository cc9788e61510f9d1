"""Paper A's claims (the readout blind spot), judged in every recipe group: one function
per claim with its criterion beside its logic, reading the diagnose tables and the
clamp and throughput metrics of each cell.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from loopscope.judge.group_a import (
    CellA,
    GroupA,
    on_each_seed,
    recipes,
    resamples_of,
    sweep_depth,
)
from loopscope.judge.verdicts import (
    Claim,
    Verdict,
    all_of,
    at_least,
    at_most,
    effect,
    inside,
    negligible,
    not_shown,
    widened,
)
from loopscope.measure.intervals import Interval

# The paper's final-loop norms: the per-loop normed cell at 44M and 129M, the controls
PAPER_DRIFT_NORMS = "~39,000 (44M), 56,051 (129M)"
PAPER_CONTROL_NORMS = "17 to 83"
PAPER_NORMS = f"{PAPER_DRIFT_NORMS} vs {PAPER_CONTROL_NORMS} for the controls"
# Its smallest drift ratio: the 44M drift over the largest control norm, 39,000 / 83.
PAPER_SMALLEST_RATIO = 39_000 / 83


def _drift(text: str, criterion: str, value: str, ratio: Interval) -> Claim:
    """A drift claim: the norm ratio above 1 (direction), at least the paper's smallest
    ratio (magnitude)."""
    above_one = ratio.map(lambda v: v - 1)
    return Claim(text, PAPER_NORMS, criterion, f"{value}; ratio {ratio}",
                 effect(above_one, +1), at_least(ratio, PAPER_SMALLEST_RATIO))


def drift(g: GroupA) -> Claim:
    """Paper A: per-loop CE through a normalized readout lets the final-loop norm drift
    to tens of thousands, while every scale-controlled variant stays at tens. The row
    names the controls this group has; the magnitude is judged against the paper's own
    smallest ratio, and the absolute norms stand beside the paper's."""
    text = ("Per-loop CE + normed readout: the final-loop norm drifts far above every "
            "scale-controlled cell of the group")
    if not (g.normed and g.controls):
        return not_shown(text, PAPER_NORMS, "-", "a per-loop normed cell or the controls "
                         "are absent")
    norms = {c: g.mean(c, "norm") for c in g.controls}
    top = np.max(np.stack(list(norms.values())), axis=0)
    ours = g.mean(g.normed, "norm")
    return _drift(f"{text}: {g.controls_named()}",
                  "final-loop mean norm of the per-loop normed cell / the largest of the "
                  "scale-controlled cells' > 1 (interval); magnitude: >= "
                  f"{PAPER_SMALLEST_RATIO:.0f}, the paper's smallest ratio (39,000 / 83)",
                  f"final-loop mean norm {ours[0]:,.1f} ({g.normed}) vs "
                  + ", ".join(f"{n[0]:,.1f} ({c})" for c, n in norms.items()),
                  g.docs.interval(ours / top))


# A heavy tail: at least TAIL_SHARE of the tokens beyond TAIL_FACTOR x the median norm.
# A norm concentrated like a Gaussian state's (a chi distribution, d >= 64) puts no
# token there at all; a log-normal puts 0.1% there once its sigma reaches 0.75.
TAIL_FACTOR = 10.0
TAIL_SHARE = 1e-3


def heavy_tail(g: GroupA) -> Claim:
    """Paper A: the drift is token-level and heavy-tailed, not a mean shift. Judged on
    tail mass: the share of tokens whose final-loop norm is beyond 10x the cell's median.
    The magnitude column asks whether that tail is the drifting cell's own: its share
    above every per-loop scale-controlled cell's (paired). T (the growth of the
    p99/median spread from loop 1 to K) and the share beyond 3x stand beside it."""
    text = ("The drift is token-level and heavy-tailed, not a mean shift: a tail of tokens "
            "far beyond the median norm")
    if not g.normed:
        return not_shown(text, "heavy-tailed", "-", "a per-loop normed cell is absent")

    def growth(c: str) -> np.ndarray:
        def spread(k: int) -> np.ndarray:
            return g.quantile(c, "norm", k, 0.99) / g.quantile(c, "norm", k, 0.5)
        return spread(g.cells[c].loops) / spread(1) - 1

    share = g.docs.interval(ours := g.share_above(g.normed, TAIL_FACTOR))
    others = {c: g.share_above(c, TAIL_FACTOR) for c in g.per_loop_controls}
    excess = (g.docs.interval(ours - np.max(np.stack(list(others.values())), axis=0))
              if others else None)
    return Claim(text, "heavy-tailed, not a mean shift",
                 f"share of tokens with a final-loop norm above {TAIL_FACTOR:g}x the cell's "
                 f"median >= {TAIL_SHARE:.1%} (interval; a Gaussian state's norm puts none "
                 "there); magnitude: that share above every per-loop scale-controlled "
                 "cell's (paired difference)",
                 f"share above {TAIL_FACTOR:g}x median {_share(share)}; above 3x "
                 f"{g.share_above(g.normed, 3.0)[0]:.2%}; controls above {TAIL_FACTOR:g}x: "
                 + (", ".join(f"{c} {o[0]:.2%}" for c, o in others.items()) or "none")
                 + f"; T {g.docs.interval(growth(g.normed))}",
                 at_least(share, TAIL_SHARE), effect(excess, +1) if excess else "n/a")


def _share(iv: Interval) -> str:
    return f"{iv.value:.2%} [{iv.lo:.2%}, {iv.hi:.2%}]"


def lemma1(g: GroupA) -> Claim:
    """Paper A's Lemma 1 (visibility), a mechanism check: a normalized readout's loss
    has no radial gradient (only RMSNorm's eps floor remains), a raw readout's has. It
    holds by construction once the readout is implemented right, so it sits in the
    mechanism checks, not among the findings."""
    text = "Lemma 1: a normalized readout's loss has no radial gradient; a raw one has"
    if not (g.normed and g.raw):
        return _check(not_shown(text, "~1e-9 vs ~1e-2", "-", "per-loop normed or raw "
                                "absent"))
    rn, rr = g.mean(g.normed, "cos"), g.mean(g.raw, "cos")
    contrast = g.docs.interval(np.log10(rr / rn))
    return _check(Claim(
        text, "~1e-9 (normed) vs ~1e-2 (raw)",
        "mean per-token radial fraction at K (float64): raw / normed > 1, log10 interval; "
        "magnitude: >= 100x. The normed value is RMSNorm's eps floor (eps d / ||H||^2), "
        "not a measured zero",
        f"{rn[0]:.1e} (eps floor {g.mean(g.normed, 'floor')[0]:.1e}) vs {rr[0]:.1e}; "
        f"log10 ratio {contrast}", effect(contrast, +1), at_least(contrast, 2.0)))


def radial_fractions(g: GroupA) -> Claim:
    """The radial gradient fraction at every loop 1..K, a mechanism check beside Lemma
    1: the normed cell's stays within 10x of its eps floor at every loop, the raw
    cell's at least 100x above the normed cell's."""
    text = "The radial gradient fraction at every loop: at the eps floor (normed), visible (raw)"
    if not (g.normed and g.raw):
        return _check(not_shown(text, "~1e-9 vs ~1e-2", "-", "per-loop normed or raw "
                                "absent"))
    loops = range(1, min(g.cells[g.normed].loops, g.cells[g.raw].loops) + 1)
    floor = [g.docs.interval(np.log10(g.mean(g.normed, "cos", k) / g.mean(g.normed, "floor", k)))
             for k in loops]
    apart = [g.docs.interval(np.log10(g.mean(g.raw, "cos", k) / g.mean(g.normed, "cos", k)))
             for k in loops]
    return _check(Claim(
        text, "~1e-9 (normed) vs ~1e-2 (raw), every loop",
        "at every loop k <= K: log10(normed fraction / its eps floor) <= 1, and log10(raw "
        "fraction / normed fraction) >= 2 (intervals)",
        "; ".join(f"k{k}: {g.mean(g.normed, 'cos', k)[0]:.1e} vs {g.mean(g.raw, 'cos', k)[0]:.1e}"
                  for k in loops),
        all_of([at_most(iv, 1.0) for iv in floor] + [at_least(iv, 2.0) for iv in apart])))


def _check(claim: Claim) -> Claim:
    """A claim about the implementation, not the paper's finding: shown in the
    mechanism checks and not counted among the reproduced findings."""
    claim.kind = "check"
    return claim


# The activity lemma's "leading order": a radial share of the update of at least this.
# A share of 0.1 is a radial displacement a tenth of the angular one; below it the scale
# would be a correction to the update, not part of it.
LEADING_SHARE = 0.1


def activity(g: GroupA) -> Claim:
    """Paper A's Lemma 2 (activity): in a pre-norm residual update F(s u) = s u + b(u),
    the residual branch changes the scale s at leading order, so the recurrence carries
    scale the normalized readout hides. Judged on the per-loop normed cell: the radial
    share of every loop's update (GroupA.activity) at least LEADING_SHARE. The
    controls' shares stand beside it."""
    text = ("Lemma 2 (activity): every loop's update changes the state's scale at leading "
            "order, in the per-loop normed cell")
    share = g.activity(g.normed) if g.normed else None
    if share is None:
        return not_shown(text, "radial part of the update O(1)", "-",
                         "a per-loop normed cell (with its width) is absent")
    k = int(np.argmin(share[:, 0]))
    low = g.docs.interval(share[k])
    beside = [f"{c} {s[:, 0].min():.2f}" for c in g.per_loop_controls
              if (s := g.activity(c)) is not None]
    return Claim(text, "radial part of the update O(1) (Lemma 2)",
                 f"the smallest over loops 1..K of the radial share of the update (radial / "
                 f"whole displacement, depth sweep) >= {LEADING_SHARE:g} (interval)",
                 f"per loop {', '.join(f'{v:.2f}' for v in share[:, 0])}; smallest at loop "
                 f"{k + 1}: {low}" + (f"; controls' smallest: {', '.join(beside)}"
                                      if beside else ""),
                 at_least(low, LEADING_SHARE))


def inverse_scale(g: GroupA) -> Claim:
    """Paper A's angular 1/s law, the mechanism behind K-invariance: past the training
    depth the angular step of the normalized state shrinks like 1/s, and since the
    normed cell's scale grows, its step shrinks further than any control's. Direction:
    the slope below 0 and the step shrinking more than in every per-loop control
    (paired; Bonferroni over the controls for a contradiction). Magnitude: the slope
    inside [-1.5, -0.5] (the law: -1)."""
    text = ("The angular 1/s law: past the training depth the normed cell's angular step "
            "shrinks like 1/s, and further than in the controls")
    if not (g.normed and g.per_loop_controls):
        return not_shown(text, "~ 1/s_k", "-", "a per-loop normed cell or the controls "
                         "are absent")
    slope, growth, shrink = g.lemma2(g.normed)
    iv = g.docs.interval(slope)
    k = len(g.per_loop_controls)
    apart, strict, beside = [], [], []
    for c in g.per_loop_controls:
        cs, cg, cshrink = g.lemma2(c)
        apart.append(effect(g.docs.interval(shrink - cshrink), -1))
        strict.append(effect(g.docs.interval(shrink - cshrink, k), -1))
        beside.append(f"{c}: scale x{cg[0]:.2f}, slope {cs[0]:.2f}, "
                      f"step x{np.exp(cshrink[0]):.2f}")
    depth = sweep_depth(g.cells[g.normed].sweep)
    return Claim(text, "angular step ~ 1/s_k (the mechanism of K-invariance)",
                 f"over loops 2..{depth} of the depth sweep: log-log slope of the mean "
                 "angular step on the mean scale < 0, and log(step_L / step_2) below every "
                 "per-loop control's (paired intervals); magnitude: the slope inside "
                 "[-1.5, -0.5] (the law: -1)",
                 f"slope {iv}, scale x{growth[0]:.2f}, step x{np.exp(shrink[0]):.2f} over "
                 f"the sweep; {'; '.join(beside)}",
                 all_of([effect(iv, -1), *apart], [effect(iv, -1), *strict]),
                 inside(iv, -1.5, -0.5))


def k_invariance(g: GroupA) -> Claim:
    """Paper A: the normed per-loop baseline is nearly K-invariant (it cannot use depth)."""
    text = "The normed per-loop baseline is nearly K-invariant: PPL(K=1) ~ PPL(K)"
    if not g.normed:
        return not_shown(text, "K-invariant", "-", "a per-loop normed cell is absent")
    iv = g.docs.interval(g.gain(g.normed))
    return Claim(text, "PPL(K=1) ~ PPL(K=4)", f"CE(1) - CE(K) inside +-{g.margin} nats",
                 f"{iv} nats ({g.normed})", negligible(iv, g.margin))


# "Gains more": the normed baseline's gain CE(1) - CE(K) below this share of the
# control's own gain. A positive difference alone would pass a control that gains
# 0.013 nats against the baseline's 0.007.
GAIN_SHARE = 0.5


def depth_gain(g: GroupA) -> Claim:
    """Paper A: scale-controlled per-loop variants improve clearly from K = 1 to K. For
    each control: the normed baseline gains less than GAIN_SHARE of what the control
    gains (paired), and no step CE(k+1) - CE(k) of the control is worse than the margin,
    as in paper B's elasticity. A cell whose last loop is worse than its best says so."""
    text = "Scale-controlled per-loop variants gain more from depth than the normed baseline"
    if not (g.normed and g.per_loop_controls):
        return not_shown(text, "clear improvement", "-", "cells absent")
    base = g.gain(g.normed)
    family = sum(g.cells[c].loops for c in g.per_loop_controls)  # a gain + K-1 steps each
    verdicts: list[Verdict] = []
    strict: list[Verdict] = []
    parts = []
    for c in g.per_loop_controls:
        gain = g.gain(c)
        more = g.docs.interval(GAIN_SHARE * gain - base)
        steps = g.steps(c)
        verdicts += [effect(more, +1), *(at_most(s, g.margin) for s in steps.values())]
        strict += [effect(g.docs.interval(GAIN_SHARE * gain - base, family), +1),
                   *(at_most(s, g.margin) for s in g.steps(c, family).values())]
        worst = max(steps, key=lambda k: steps[k].value)
        parts.append(f"{c} gain {g.docs.interval(gain)}, {GAIN_SHARE:g} x gain - baseline's "
                     f"{more}, worst step CE({worst + 1}) - CE({worst}) {steps[worst]}"
                     f"{g.worse_last(c)}")
    return Claim(text, "PPL improves clearly from K=1 to K=4",
                 f"for every per-loop scale-controlled cell: the normed cell's CE(1) - CE(K) "
                 f"below {GAIN_SHARE:g} x the control's (paired interval of {GAIN_SHARE:g} x "
                 f"its gain - the baseline's > 0), and every step CE(k+1) - CE(k) of the "
                 f"control below +{g.margin} nats (upper bound); contradicted on Bonferroni "
                 f"intervals over the {family} comparisons",
                 f"baseline {g.normed} gain {g.docs.interval(base)}{g.worse_last(g.normed)}; "
                 + "; ".join(parts), all_of(verdicts, strict))


def frontier(g: GroupA) -> Claim:
    """Paper A: scale control gives a better perplexity/throughput frontier. The cost
    axis is FLOPs per token (model.cost, the same for cells of one architecture and K),
    so at equal cost the frontier is the CE at K. Measured tokens/s stands beside it,
    flagged where it does not fall with depth (timing noise, not a finding)."""
    text = "Scale-controlled variants have a better perplexity/compute frontier"
    if not (g.normed and g.per_loop_controls):
        return not_shown(text, "better frontier", "-", "cells absent")
    best = min(g.per_loop_controls, key=lambda c: g.mean(c, "ce")[0])
    diff = g.docs.interval(g.mean(best, "ce") - g.mean(g.normed, "ce"))
    b, n = g.cell(best), g.cell(g.normed)
    speed = "; ".join(f"{c}: tokens/s at K {x.tokens_per_s[x.last]:,.0f}"
                      + ("" if _falls_with_depth(x) else " (not falling with depth: noise)")
                      for c, x in ((best, b), (g.normed, n)))
    return Claim(text, "better frontier",
                 "CE at K of the best per-loop scale-controlled cell - the normed cell's < 0 "
                 "(paired interval), at the FLOPs per token of each (model.cost)",
                 f"{diff} nats ({best}); FLOPs/token {b.flops_per_token[b.last]:.3g} vs "
                 f"{n.flops_per_token[n.last]:.3g}; {speed}", effect(diff, -1))


def _falls_with_depth(cell: CellA) -> bool:
    """Whether measured tokens/s falls (weakly) from depth 1 to K: a timing that rises
    with depth is noise."""
    speed = [cell.tokens_per_s[f"k{k}"] for k in range(1, cell.loops + 1)
             if f"k{k}" in cell.tokens_per_s]
    return all(a >= b for a, b in zip(speed, speed[1:], strict=False))


def _clamped(g: GroupA, cells: list[str], modes: list[str] | None
             ) -> dict[tuple[str, str], Interval]:
    return {(c, mode): Interval.of(g.cell(c).clamp[mode]["delta_ce_last"])
            for c in cells for mode in g.cells[c].clamp if modes is None or mode in modes}


def clamp(g: GroupA) -> Claim:
    """Paper A: clamping the recurrent scale of a trained per-loop normed model changes
    CE negligibly: the scale its normed readout ignores carries nothing. The paper's
    clamp rescales each state to its loop-1 magnitude (freeze_loop1); the other modes
    and cells are the next row."""
    text = ("The paper's clamp (each state rescaled to its loop-1 magnitude) on the per-loop "
            "normed model changes CE negligibly")
    found = _clamped(g, [g.normed], ["freeze_loop1"]) if g.normed else {}
    if not found:
        return not_shown(text, "negligible", "-", "no per-loop normed cell with the "
                         "freeze_loop1 clamp")
    return Claim(text, "negligible change in CE",
                 f"delta CE at K inside +-{g.margin} nats (claims.margin_nats); the "
                 "seed-to-seed spread of CE at K is shown beside it",
                 "; ".join(f"{c} {iv}" for (c, _), iv in found.items()) + _seed_spread(g),
                 _every_negligible(list(found.values()), g.margin))


def clamp_other(g: GroupA) -> Claim:
    """The clamp beyond the paper's run: every other mode (remove_radial, which the paper
    did not report) and the terminal-loss normed cells."""
    text = "Other clamps (remove_radial; terminal-loss normed cells) change CE negligibly"
    normed = [c for c, v in g.cells.items() if v.group == "normed baseline"]
    found = {k: iv for k, iv in _clamped(g, normed, None).items()
             if not (k[0] == g.normed and k[1] == "freeze_loop1")}
    if not found:
        return not_shown(text, "(not in the paper)", "-", "no other clamp measured")
    return Claim(text, "(not in the paper)",
                 f"delta CE at K inside +-{g.margin} nats, for every normed cell and mode; "
                 "contradicted on Bonferroni intervals over them",
                 "; ".join(f"{c} {mode} {iv}" for (c, mode), iv in found.items()),
                 _every_negligible(list(found.values()), g.margin))


def _every_negligible(found: list[Interval], margin: float) -> Verdict:
    """Every stored clamp interval inside +-margin; contradicted on Bonferroni-widened
    intervals over the family (stats.widened: the clamp stage stores 95% intervals)."""
    return all_of([negligible(iv, margin) for iv in found],
                  [negligible(widened(iv, len(found)), margin) for iv in found])


def _seed_spread(g: GroupA) -> str:
    """'; seed-to-seed spread ...': the largest difference between two seeds' mean CE at
    K over the group's per-loop cells trained more than once ("" where none is)."""
    spread = {}
    for c in [g.normed, *g.per_loop_controls]:
        t = g.cells[c].tokens
        if "seed" in t and t["seed"].nunique() > 1:
            means = t.groupby("seed")[f"ce_{g.cells[c].loops}"].mean()
            spread[c] = float(means.max() - means.min())
    if not spread:
        return ""
    worst = max(spread, key=lambda c: spread[c])
    return f"; seed-to-seed spread of CE at K up to {spread[worst]:.4f} nats ({worst})"


def final_norm(g: GroupA) -> Claim:
    """Paper A's third control, judged by the design rule: a final-norm-only cell reads
    raw before its last loop, so its intermediate losses see the scale and it should not
    drift. Direction: the per-loop normed cell's final-loop norm above it; magnitude: its
    norm no larger than the largest scale-controlled cell's."""
    text = ("Final-norm only (raw readouts before the last loop) does not drift: its "
            "intermediate losses see the scale")
    fn = next((c for c, v in g.cells.items()
               if v.group == "final-norm only" and v.loss == "per_loop"), None)
    if not (g.normed and fn):
        return not_shown(text, "a control (design rule)", "-",
                         "a per-loop normed or final-norm-only cell is absent")
    ours = g.mean(fn, "norm")
    ratio = g.docs.interval(g.mean(g.normed, "norm") / ours)
    value = f"final-loop mean norm {ours[0]:,.1f} ({fn}); normed / it {ratio}"
    mag: Verdict | Literal["n/a"] = "n/a"
    if g.controls:
        top = np.max(np.stack([g.mean(c, "norm") for c in g.controls]), axis=0)
        against = g.docs.interval(ours / top)
        value += f"; it / the largest control's {against}"
        mag = at_most(against, 1.0)
    return Claim(text, "a control (design rule)",
                 "final-loop mean norm of the per-loop normed cell / the final-norm-only "
                 "cell's > 1 (interval); magnitude: the final-norm-only cell's / the largest "
                 "scale-controlled cell's <= 1", value,
                 effect(ratio.map(lambda v: v - 1), +1), mag)


CLAIMS_A = (drift, heavy_tail, final_norm, activity, inverse_scale, k_invariance, depth_gain,
            frontier, clamp, clamp_other, lemma1, radial_fractions)


def paper_a_claims(cells: dict[str, CellA], margin: float = 0.01, resamples: int = 1000
                   ) -> list[Claim]:
    """Paper A's claims judged in every recipe group (recipes), each with its
    criterion, this run's value with a 95% interval (units resampled, paired across
    cells: every cell is measured on the same windows; and each cell's seeds resampled
    where it has several: Documents) and a verdict (see the module docstring). margin:
    the band a claim of no effect must stay inside (nats). The recipe and resampled
    columns say which group and what the interval counts; with under FEW_SEEDS seeds
    the seed rule applies (_on_each_seed). Mechanism checks come back with kind "check".
    """
    docs = resamples_of(cells, resamples)
    out = []
    for recipe in recipes(cells) or [None]:
        g = GroupA.of(cells, docs, margin, recipe)
        for judge in CLAIMS_A:
            g.used.clear()
            claim = judge(g)
            if recipe is not None:
                claim.recipe = recipe
            if claim.verdict != "not shown":
                claim.resampled = g.resampled()
                on_each_seed(claim, judge, g.cells, set(g.used), docs, margin, recipe)
            out.append(claim)
    return out


def init_effect(cells: dict[str, CellA], resamples: int = 1000) -> str:
    """One sentence on what the recipe does to the drift's magnitude: the drift ratio
    of the two groups furthest apart, and their fold with an interval from the same
    resamples ("" with fewer than two groups that show it). The recipes differ in
    init, FFN and weight decay together, so the sentence does not credit any one."""
    docs = resamples_of(cells, resamples)
    found = {}
    for recipe in recipes(cells):
        g = GroupA.of(cells, docs, 0.0, recipe)
        if g.normed and g.controls:
            top = np.max(np.stack([g.mean(c, "norm") for c in g.controls]), axis=0)
            found[recipe] = g.mean(g.normed, "norm") / top
    if len(found) < 2:
        return ""
    ordered = sorted(found, key=lambda r: found[r][0])
    lo_r, hi_r = ordered[0], ordered[-1]
    fold = docs.interval(found[hi_r] / found[lo_r])
    moves = ("moves" if fold.lo >= 2 else "barely moves" if fold.hi < 2 else
             "may move")
    return (f"With readout, loss placement, data and schedule the same, the drift ratio is "
            f"{docs.interval(found[lo_r])} under [{lo_r}] and {docs.interval(found[hi_r])} "
            f"under [{hi_r}]: the recipe (init, FFN and weight decay together; no pair of "
            f"cells here isolates one of them) {moves} the drift's magnitude {fold}-fold "
            "(moves: the fold's interval above 2).")
