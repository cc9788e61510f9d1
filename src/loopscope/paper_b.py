"""Paper B's claims (per-token fixed-point convergence, exit rules, useful depth), one
function per claim with its criterion beside its logic. Every interval is computed by
the convergence and policies stages from one set of document resamples per cell.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from loopscope.stats import (
    SMALLEST_TYPE,
    Claim,
    Interval,
    Verdict,
    all_of,
    at_least,
    at_most,
    below,
    effect,
    inside,
    negligible,
    not_shown,
)

REGIME = 0.75  # paper B's backbones use their depth: useful depth ~ R; below this x R not


@dataclass
class Backbone:
    """What paper B's claims read of one backbone: metrics/convergence/<name>.json and
    metrics/policies/<name>.json (None: its policies were not swept)."""

    name: str
    conv: dict[str, Any]
    pol: dict[str, Any] | None = None

    @property
    def r(self) -> int:
        return int(self.conv["reference_depth"])

    @property
    def depth(self) -> str:
        """The depth the claims compare against, named: R is the evaluation depth; under
        depth_mean loops_plus_one the training sampler's mean is R + 1."""
        mean = self.conv.get("sampler_mean")
        extra = "" if mean is None or mean == self.r else f", training mean {mean:g}"
        return f"R = {self.r} (model.loops{extra})"

    @property
    def useful(self) -> int:
        return int(self.conv["saturation"]["useful_depth"])

    @property
    def depth_use(self) -> str:
        """The useful depth with its interval, against R: beside every paper B claim."""
        iv = Interval.of(self.conv["saturation"]["useful_depth_iv"])
        return f"{self.name}: useful depth {iv.value:g} [{iv.lo:g}, {iv.hi:g}] of R = {self.r}"

    def regime(self) -> str:
        """Why claims that need a backbone using its depth are read outside paper B's
        regime ("" when inside): paper B's useful depth equals its training mean."""
        if self.useful >= REGIME * self.r:
            return ""
        return (f"outside the paper's regime: useful depth {self.useful} < {REGIME:g} R "
                f"({self.name})")


def _pct(iv: Interval) -> str:
    return f"{iv.value:.1%} [{iv.lo:.1%}, {iv.hi:.1%}]"


def steps(elasticity: dict[str, Any]) -> dict[int, Interval]:
    """CE(k+1) - CE(k) for each step k < R of a backbone's metrics' `elasticity`."""
    return {int(k[1:]): Interval.of(v) for k, v in elasticity["steps"].items()}


def worst_step(elasticity: dict[str, Any]) -> tuple[int, Interval] | None:
    """The step k -> k+1 up to R that helps least (largest CE(k+1) - CE(k)): where
    monotone improvement breaks first, if anywhere. None: no step measured (R = 1)."""
    found = steps(elasticity)
    if not found:
        return None
    k = max(found, key=lambda k: found[k].value)
    return k, found[k]


def elasticity(b: Backbone) -> Claim:
    """Paper B: "monotone improvement from 1 to 8". Monotone: no step k -> k+1 up to R
    makes CE worse by more than the margin, and the second half of the depth still
    helps (CE(R/2) - CE(R) above the margin): one gain from 1 to R is not monotone."""
    e = b.conv["elasticity"]
    margin, half = e["margin"], Interval.of(e["half_gain"])
    by_step, worst = steps(e), worst_step(e)
    if half.too_few_units or any(s.too_few_units for s in by_step.values()):
        verdict: Verdict = "inconclusive"  # as every rule under @decides
    elif any(s.lo > margin for s in by_step.values()) or half.hi < margin:
        verdict = "contradicted"
    elif all(s.hi <= margin for s in by_step.values()) and half.lo > margin:
        verdict = "holds"
    else:
        verdict = "inconclusive"
    worst_text = (f"; worst step CE({worst[0] + 1}) - CE({worst[0]}) {worst[1]}"
                  if worst is not None else "")
    return Claim(
        f"Elasticity [{b.name}]: CE improves monotonically from depth 1 to {b.depth}",
        "monotone improvement from 1 to 8",
        f"every step CE(k+1) - CE(k), k < R, below +{margin} nats (upper bound), and "
        f"CE(R/2) - CE(R) above {margin} nats (lower bound); paired intervals",
        f"CE(1) - CE(R) {Interval.of(e['gain'])}; CE({e['half_depth']}) - CE(R) {half}"
        f"{worst_text} nats", verdict)


def flat_past_r(b: Backbone) -> Claim:
    """Paper B: "flat (3.20 nats) up to 32". Flat means every depth past R, not the
    last one alone: the largest |CE(D) - CE(R)| over D = R..4R stays inside the margin."""
    e = b.conv["elasticity"]
    flat, margin = Interval.of(e["flat"]), e["margin"]
    return Claim(
        f"Past R the loss is flat [{b.name}]: CE(D) ~ CE(R) for D = R..{b.conv['max_depth']}, "
        f"{b.depth}", "flat at 3.20 nats from 8 to 32",
        f"max over D of |CE(D) - CE(R)| inside {margin} nats (interval)",
        f"{flat} nats (largest at D = {e['flat_depth']}); CE(max D) - CE(R) "
        f"{Interval.of(e['tail'])}", negligible(flat, margin))


def kl_decay(b: Backbone) -> Claim:
    """Paper B: mean KL(p_i || p_{i-1}) 3.9e-1 at loop 2 -> 8.5e-6 at loop 16 (2R)."""
    k = b.conv["kl_decay"]
    ratio = Interval.of(k["log10_ratio"])
    kl = b.conv["kl"]
    return Claim(
        f"Successive outputs converge [{b.name}]: mean KL(p_i || p_(i-1)) falls from loop "
        f"{k['from']} to loop {k['to']} (2R, {b.depth})",
        "3.9e-1 -> 8.5e-6 (R = 8: loops 2 -> 16)",
        "log10 KL(2R) / KL(2) < 0 (interval); magnitude: <= -2 (at least 100x smaller)",
        f"{kl['k' + str(k['from'])]:.2e} -> {kl['k' + str(k['to'])]:.2e}; log10 ratio {ratio}",
        effect(ratio, -1), at_most(ratio, -2.0))


def state_decay(b: Backbone) -> Claim:
    """Paper B: the state change per step decays (a fixed point, not a cycle)."""
    s = b.conv["state_decay"]
    ratio = Interval.of(s["log10_ratio"])
    ch = b.conv["state_change"]
    return Claim(
        f"The state change per loop decays [{b.name}]: a fixed point, not a cycle",
        "decays", f"log10 of the mean relative change at loop {s['to']} / at loop R "
        f"({b.depth}) < 0 (interval)",
        f"{ch['k' + str(s['from'])]:.2e} -> {ch['k' + str(s['to'])]:.2e}; log10 ratio {ratio}",
        effect(ratio, -1))


def median_convergence(b: Backbone) -> Claim:
    """Paper B: "the median token converges at loop 6" with a tail "still updating" at 8.
    Both describe where a prediction stops moving for good, so the convergence loop
    (KL below epsilon from that loop on, through the largest depth measured) is the
    definition judged; A1's exit loop (the first loop KL drops below epsilon) is shown
    beside it: it is what the exit rule acts on, and is never later."""
    c, r = b.conv["convergence"], b.r
    median = Interval.of(c["median_loop"])
    ratio = median.map(lambda v: v / r)
    return Claim(
        f"The median token converges before R [{b.name}] (epsilon {c['epsilon']:g}, "
        f"{b.depth})", "median loop 6 at R = 8",
        "median convergence loop (KL stays below epsilon from it on) < R (interval); "
        "magnitude: inside [0.5, 1] x R (paper: 0.75 R)",
        f"convergence loop {median}; A1's exit loop (first drop below epsilon) "
        f"{Interval.of(c['median_exit_loop'])}", below(median, r), inside(ratio, 0.5, 1.0))


def tail(b: Backbone) -> Claim:
    """Paper B: "a tail of about 10% of tokens continues updating" at the training mean."""
    share = Interval.of(b.conv["convergence"]["share_after_reference"])
    return Claim(
        f"A tail of tokens is still updating at R [{b.name}] ({b.depth})", "~10%",
        "share with a convergence loop after R > 0 (interval excludes 0); magnitude: "
        "interval inside [5%, 20%]", _pct(share), effect(share, +1),
        inside(share, 0.05, 0.2), regime=b.regime())


def token_order(b: Backbone) -> Claim:
    """Paper B: "whitespace shallowest, content words deepest". Both ends of the order,
    against every other type common enough to judge: whitespace below each, content
    words above each (paired intervals). A content - whitespace gap alone would let a
    type deeper than content words, or shallower than whitespace, pass."""
    t = b.conv["types"]
    text = (f"Convergence depth is ordered by token type [{b.name}]: whitespace shallowest, "
            "content words deepest")
    paper = "whitespace shallowest, content deepest"
    crit = ("mean convergence loop of whitespace - each other type < 0 and of content "
            f"words - each other type > 0 (paired intervals); types under "
            f"{SMALLEST_TYPE:.0%} of tokens are too rare to judge")
    rare = ", ".join(t.get("rare", [])) or "none"
    if "whitespace_minus" not in t or "content_minus" not in t:
        return not_shown(text, paper, crit, f"whitespace or content words too rare or "
                         f"absent (too rare: {rare})")
    ws = {k: Interval.of(v) for k, v in t["whitespace_minus"].items()}
    content = {k: Interval.of(v) for k, v in t["content_minus"].items()}
    means = ", ".join(f"{n} {t[n]['mean_loop']:.2f}" for n in t.get("judged", []))
    value = (f"means: {means}; whitespace - " + ", ".join(f"{k} {v}" for k, v in ws.items())
             + "; content - " + ", ".join(f"{k} {v}" for k, v in content.items())
             + f"; too rare: {rare}")
    return Claim(text, paper, crit, value,
                 all_of([effect(v, -1) for v in ws.values()]
                        + [effect(v, +1) for v in content.values()]))


def _at_matched_quality(q: dict[str, Any], match: float) -> Verdict:
    """Non-inferiority of a policy's chosen setting on the report windows: the upper
    bound of CE - CE(R) at most the margin (holds), its lower bound above (contradicted)."""
    delta = Interval.of(q["delta_ce"])
    if delta.hi <= match:
        return "holds"
    return "contradicted" if delta.lo > match else "inconclusive"


def _policy_value(q: dict[str, Any], p: dict[str, Any]) -> str:
    base = p["baseline_depth"]
    return (f"threshold {q['threshold']:g}: {Interval.of(q['mean_loops_iv'])} mean loops; "
            f"CE - CE(R) {Interval.of(q['delta_ce'])}; FLOPs x{q['flops_ratio']:.2f} of "
            f"depth R, x{q['flops_ratio_baseline']:.2f} of uniform depth {base}")


UNMATCHED = "no setting matched depth R's quality on the choose windows: nothing measured"


def _swept(b: Backbone, rule: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The backbone's policies metrics and those of one rule (None: not swept)."""
    q = (b.pol or {}).get(rule)
    return None if q is None else (b.pol, q)


def a1_saves(b: Backbone) -> Claim:
    """Paper B: A1 (KL exit) matches uniform depth-8 quality at 4.94 mean loops (-38%).
    Matched quality is a one-sided non-inferiority test on the report windows (the
    threshold was chosen on the choose windows at half the margin, so the delta is not
    at the margin by construction). The saving is read against depth R and, as its
    magnitude, against the smallest uniform depth that matches R, in loops and FLOPs
    (checks counted)."""
    text = f"A1 (KL exit) matches uniform depth-R quality in fewer loops [{b.name}]"
    paper = "4.94 mean loops at R = 8 (-38%)"
    if (found := _swept(b, "kl")) is None:
        return not_shown(text, paper, "-", "the kl rule was not swept on this backbone")
    p, q = found
    match, base = p["match_nats"], p["baseline_depth"]
    crit = (f"at matched quality (upper bound of CE - CE(R) <= {match} nats on report): "
            f"mean loops < R, {b.depth} (interval); magnitude: loops < the smallest "
            f"uniform depth matching R ({base}) and FLOPs below it")
    if not q.get("matched"):
        return Claim(text, paper, crit, UNMATCHED, "inconclusive", regime=b.regime())
    loops = Interval.of(q["mean_loops_iv"])
    saves, quality = below(loops, b.r), _at_matched_quality(q, match)
    verdict: Verdict = ("contradicted" if saves == "contradicted" else
                        saves if quality == "holds" else "inconclusive")
    mag: Verdict = ("contradicted" if q["flops_ratio_baseline"] >= 1 else below(loops, base))
    return Claim(text, paper, crit, _policy_value(q, p), verdict, mag, regime=b.regime())


def a2_saves_nothing(b: Backbone) -> Claim:
    """Paper B: A2 (a linear probe trained on oracle convergence labels) needs 7.99 of 8
    loops: no saving. Holds when its chosen setting runs at least 0.95 R loops (no
    saving whatever its quality); contradicted only by a real saving at matched quality."""
    text = f"A2 (oracle-labelled probe) saves nothing [{b.name}]"
    paper = "7.99 mean loops: no saving"
    if (found := _swept(b, "probe")) is None:
        return not_shown(text, paper, "-", "the probe rule was not swept on this backbone")
    p, q = found
    match = p["match_nats"]
    crit = (f"mean loops at matched quality (upper bound of CE - CE(R) <= {match} nats) "
            f">= 0.95 R, {b.depth} (interval)")
    if not q.get("matched"):
        return Claim(text, paper, crit, UNMATCHED, "inconclusive")
    nothing = at_least(Interval.of(q["mean_loops_iv"]), 0.95 * b.r)
    verdict: Verdict = (nothing if nothing == "holds" or
                        _at_matched_quality(q, match) == "holds" else "inconclusive")
    return Claim(text, paper, crit, _policy_value(q, p), verdict)


def saturation(backbones: list[Backbone]) -> Claim:
    """Paper B's hypothesis: useful depth (the smallest depth within tolerance of the best
    CE) saturates at the training mean, 4 -> 4 and 8 -> 8. It is a claim about two
    backbones: with one, nothing is tested. Read outside the paper's regime when any
    backbone does not use its depth: then the verdict says what our backbones do, not
    whether depth use follows the training mean at the paper's scale."""
    text = "Useful depth saturates at the training-mean depth"
    paper = "mean 4 -> 4, mean 8 -> 8"
    crit = (f"useful depth inside [{REGIME:g} R, {2 - REGIME:g} R] for every backbone "
            "(interval; document resamples)")
    if len(backbones) < 2:
        return not_shown(text, paper, crit, "needs two backbones of different R; this run "
                         f"has {len(backbones)}")
    found = {b.name: Interval.of(b.conv["saturation"]["useful_depth_iv"]) for b in backbones}
    verdicts = [inside(i.map(lambda v, r=b.r: v / r), REGIME, 2 - REGIME)
                for b, i in zip(backbones, found.values(), strict=True)]
    value = "; ".join(f"{b.name}: R = {b.r} -> {found[b.name]}" for b in backbones)
    regime = "; ".join(r for b in backbones if (r := b.regime()))
    return Claim(text, paper, crit, value, all_of(verdicts), regime=regime)


def paper_b_claims(conv: dict[str, dict[str, Any]], pol: dict[str, dict[str, Any]],
                   main: str | None, second: str | None) -> list[Claim]:
    """Paper B's claims from metrics/convergence and metrics/policies of its backbones.

    conv, pol: metrics per cell; main: the backbone of paper B's main setting (mean
    depth 8 there), second: the other one of the saturation test (mean 4); None: absent.
    Token order is judged on both backbones, one row each.
    """
    if main is None or main not in conv:
        why = "no paper B backbone in this run"
        return [not_shown(text, paper, "-", why)
                for text, paper in (("Elasticity", "monotone to 8, flat after"),
                                    ("Per-token convergence", "median loop 6, ~10% at R"))]
    b = Backbone(main, conv[main], pol.get(main))
    others = [Backbone(c, conv[c], pol.get(c)) for c in (second,) if c is not None and c in conv]
    rows = [(c, [b]) for c in (elasticity(b), flat_past_r(b), kl_decay(b), state_decay(b),
                               median_convergence(b), tail(b))]
    rows += [(token_order(x), [x]) for x in [b, *others]]
    rows += [(a1_saves(b), [b]), (a2_saves_nothing(b), [b]),
             (saturation([*others, b]), [*others, b])]
    return [replace(c, depth_use="; ".join(x.depth_use for x in read)) for c, read in rows]
