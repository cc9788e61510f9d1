"""Verdicts on the papers' claims, each a test that states its criterion, carries its
uncertainty and can come out either way.

A verdict is one of
    holds          the interval (95%, documents resampled) decides for the claim
    contradicted   the interval decides against it
    inconclusive   the interval does not decide
    not shown      the cells or metrics the claim needs are not in this run
A claim of an effect holds when its interval excludes zero in the claimed direction;
a claim of *no* effect holds when its interval lies inside a stated margin. Where a
paper gives a magnitude, the magnitude gets its own verdict beside the direction.

The stages compute the intervals (they hold the per-token values) and write them into
the metrics files as {"value", "lo", "hi"}; the functions here read metrics only, so
the unit tests can feed constructed metrics and the notebooks only render.
Window intervals are conditional on the trained model: they resample validation
documents, not training runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

Verdict = Literal["holds", "contradicted", "inconclusive", "not shown"]


@dataclass(frozen=True)
class Interval:
    """An estimate with its 95% interval."""

    value: float
    lo: float
    hi: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def of(cls, raw: dict[str, float]) -> Interval:
        return cls(raw["value"], raw["lo"], raw["hi"])

    def __str__(self) -> str:
        return f"{self.value:.4g} [{self.lo:.4g}, {self.hi:.4g}]"


def bootstrap(columns: dict[str, np.ndarray], groups: np.ndarray,
              stat: Callable[[dict[str, np.ndarray]], np.ndarray],
              resamples: int = 1000, seed: int = 0) -> Interval:
    """A statistic of per-token columns with a 95% percentile interval from resampling
    whole groups (documents) with replacement: tokens of one document are correlated,
    so resampling tokens would understate the uncertainty.

    stat receives each column's sum over the (resampled) tokens, as arrays, and returns
    the statistic per resample: ratios of sums cover means, shares and differences of
    conditional means.
    """
    _, g = np.unique(groups, return_inverse=True)
    sums = {k: np.bincount(g, weights=np.asarray(v, dtype=np.float64))
            for k, v in columns.items()}
    k = len(next(iter(sums.values())))
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(k, np.full(k, 1.0 / k), size=resamples).astype(np.float64)
    draws = stat({name: weights @ s for name, s in sums.items()})
    lo, hi = np.nanquantile(draws, [0.025, 0.975])
    whole = stat({name: np.array([s.sum()]) for name, s in sums.items()})
    return Interval(float(whole[0]), float(lo), float(hi))


def bootstrap_mean(values: np.ndarray, groups: np.ndarray, resamples: int = 1000,
                   seed: int = 0) -> Interval:
    """The mean of per-token values, its interval from resampling documents."""
    values = np.asarray(values, dtype=np.float64)
    return bootstrap({"v": values, "n": np.ones_like(values)}, groups,
                     lambda s: s["v"] / np.maximum(s["n"], 1.0), resamples, seed)


def effect(iv: Interval, sign: int) -> Verdict:
    """A claimed effect of the given sign (+1: positive, -1: negative)."""
    lo, hi = (iv.lo, iv.hi) if sign > 0 else (-iv.hi, -iv.lo)
    if lo > 0:
        return "holds"
    return "contradicted" if hi < 0 else "inconclusive"


def negligible(iv: Interval, margin: float) -> Verdict:
    """A claimed absence of effect: the interval inside [-margin, margin]."""
    if -margin <= iv.lo and iv.hi <= margin:
        return "holds"
    return "contradicted" if iv.lo > margin or iv.hi < -margin else "inconclusive"


def at_least(iv: Interval, threshold: float) -> Verdict:
    """A claimed value of at least threshold."""
    if iv.lo >= threshold:
        return "holds"
    return "contradicted" if iv.hi < threshold else "inconclusive"


def within(value: float, lo: float, hi: float) -> Verdict:
    """A magnitude within [lo, hi] (a point value: no interval to be unsure about)."""
    return "holds" if lo <= value <= hi else "contradicted"


@dataclass
class Claim:
    """One row of a claims table."""

    claim: str
    paper: str
    criterion: str
    value: str
    verdict: Verdict
    magnitude: Verdict | Literal["n/a"] = "n/a"

    def row(self) -> dict[str, str]:
        return asdict(self)


def not_shown(claim: str, paper: str, criterion: str, why: str) -> Claim:
    return Claim(claim, paper, criterion, why, "not shown")


# ----------------------------------------------------------------------------- paper B


def _r(metrics: dict[str, Any]) -> int:
    return int(metrics["reference_depth"])


def paper_b_claims(conv: dict[str, dict[str, Any]], pol: dict[str, dict[str, Any]],
                   main: str | None, second: str | None) -> list[Claim]:
    """Paper B's claims from metrics/convergence and metrics/policies of its backbones.

    conv, pol: metrics per cell; main: the backbone of paper B's main setting (mean
    depth 8 there), second: the other one of the saturation test (mean 4); None: absent.
    """
    claims: list[Claim] = []
    if main is None or main not in conv:
        why = "no paper B backbone in this run"
        for text, paper in (("Elasticity", "monotone to R, flat after"),
                            ("Per-token convergence", "median loop 6, ~10% at R")):
            claims.append(not_shown(text, paper, "-", why))
        return claims
    c, r = conv[main], _r(conv[main])
    gain = Interval.of(c["elasticity"]["gain"])
    claims.append(Claim(
        f"Elasticity: CE improves from depth 1 to the training-mean depth R = {r}",
        "monotone improvement from 1 to 8",
        "CE(1) - CE(R) > 0 (interval excludes 0); magnitude: >= 0.1 nats, the premise "
        "every policy result is read against",
        f"{gain} nats", effect(gain, +1), at_least(gain, 0.1)))
    tail = Interval.of(c["elasticity"]["tail"])
    margin = c["elasticity"]["margin"]
    claims.append(Claim(
        f"Past R the loss is flat: CE(R) ~ CE({c['max_depth']})",
        "flat at 3.20 nats from 8 to 32",
        f"CE(D) - CE(R) inside +-{margin} nats", f"{tail} nats", negligible(tail, margin)))
    kl = c["kl"]
    early, late = kl.get("k2"), kl.get(f"k{2 * r}")
    if early is not None and late is not None:
        ratio = late / early if early > 0 else float("inf")
        claims.append(Claim(
            f"Successive outputs converge: mean KL(p_i || p_(i-1)) falls from loop 2 to "
            f"loop {2 * r}", "3.9e-1 -> 8.5e-6 (R = 8: loops 2 -> 16)",
            "KL(2R) < KL(2); magnitude: at least 100x smaller",
            f"{early:.2e} -> {late:.2e}", "holds" if ratio < 1 else "contradicted",
            "holds" if ratio <= 1e-2 else "contradicted"))
    ch = c["state_change"]
    first, last = ch.get(f"k{r}"), ch.get(f"k{c['max_depth']}")
    claims.append(Claim(
        "The state change per loop decays (a fixed point, not a cycle)",
        "decays", f"relative change at loop {c['max_depth']} < at loop R",
        f"{first:.2e} -> {last:.2e}", "holds" if last < first else "contradicted"))
    conv_ = c["convergence"]
    median = conv_["median_loop"]
    claims.append(Claim(
        f"The median token converges before R (epsilon {conv_['epsilon']:g})",
        "median loop 6 at R = 8", "median convergence loop < R; magnitude: within "
        "[0.5, 1] x R (paper: 0.75 R)", f"loop {median:g}",
        "holds" if median < r else "contradicted", within(median / r, 0.5, 1.0)))
    share = Interval.of(conv_["share_after_reference"])
    claims.append(Claim(
        "A tail of tokens is still updating at R", "~10%",
        "share > 0 (interval excludes 0); magnitude: between 5% and 20%",
        f"{share.value:.1%} [{share.lo:.1%}, {share.hi:.1%}]", effect(share, +1),
        within(share.value, 0.05, 0.2)))
    types = c.get("types", {})
    if {"whitespace", "content word"} <= set(types):
        diff = Interval.of(types["content_minus_whitespace"])
        claims.append(Claim(
            "Convergence depth is ordered by token type: whitespace shallowest, content "
            "words deepest", "whitespace shallowest, content deepest",
            "mean convergence loop of content words - whitespace > 0 (interval)",
            f"{diff} loops; " + ", ".join(f"{t} {v['mean_loop']:.2f}"
                                          for t, v in types.items() if isinstance(v, dict)
                                          and "mean_loop" in v),
            effect(diff, +1)))
    claims.extend(_policy_claims(pol.get(main), r))
    claims.append(_saturation(conv, main, second))
    return claims


def _policy_claims(p: dict[str, Any] | None, r: int) -> list[Claim]:
    if p is None:
        return [not_shown("A1 saves loops at matched quality", "4.94 mean loops (-38%)", "-",
                          "no policies metrics for the main backbone")]
    out = []
    match = p["match_nats"]
    matched = p["uniform"]["matched_depth"]
    for rule, paper, text in (("kl", "4.94 mean loops at R = 8 (-38%)",
                               "A1 (KL exit) matches uniform depth-R quality in fewer loops"),
                              ("probe", "7.99 mean loops: no saving",
                               "A2 (oracle-labelled probe) saves nothing")):
        q = p.get(rule)
        if q is None:
            out.append(not_shown(text, paper, "-", f"the {rule} rule was not swept"))
            continue
        if not q.get("matched"):
            out.append(Claim(text, paper, f"a threshold whose CE is within {match} nats of "
                             "depth R on the choose windows", "no threshold matched",
                             "contradicted" if rule == "kl" else "holds"))
            continue
        delta = Interval.of(q["delta_ce"])
        loops = q["mean_loops"]
        quality = negligible(delta, match)
        if rule == "kl":
            saves = loops < r and quality == "holds"
            verdict: Verdict = ("holds" if saves else
                                "inconclusive" if quality == "inconclusive" else "contradicted")
            crit = (f"mean loops < R with CE - CE(R) inside +-{match} nats on the report "
                    f"windows; magnitude: fewer loops than the smallest matching uniform "
                    f"depth ({matched})")
            mag: Verdict = "holds" if loops < matched else "contradicted"
        else:
            verdict = "holds" if loops >= 0.95 * r else "contradicted"
            crit = "mean loops at matched quality >= 0.95 R (no real saving)"
            mag = "n/a"
        out.append(Claim(text, paper, crit,
                         f"{loops:.2f} mean loops ({loops / r - 1:+.0%}), CE - CE(R) {delta}; "
                         f"FLOPs x{q['flops_ratio']:.2f} of depth R", verdict, mag))
    return out


def _saturation(conv: dict[str, dict[str, Any]], main: str, second: str | None) -> Claim:
    text = "Useful depth saturates at the training-mean depth"
    paper = "mean 4 -> 4, mean 8 -> 8"
    crit = "useful depth (smallest within tolerance of the best) equals R, per backbone"
    cells = [c for c in (second, main) if c is not None and c in conv]
    found = {c: (conv[c]["saturation"]["useful_depth"], _r(conv[c])) for c in cells}
    value = ", ".join(f"mean {r} -> {u}" for u, r in found.values())
    ok = all(u == r for u, r in found.values())
    if len(found) < 2:
        return Claim(text, paper, crit, value + " (one backbone only)",
                     "holds" if ok else "contradicted")
    return Claim(text, paper, crit, value, "holds" if ok else "contradicted")


def table(claims: list[Claim]) -> list[dict[str, str]]:
    """Rows for a DataFrame or an HTML table."""
    return [c.row() for c in claims]


# ----------------------------------------------------------------------------- paper A


@dataclass
class CellA:
    """What paper A's claims read of one cell: its group (loopscope.report.cell_group),
    loss placement, and per loop k: mean, median and p99 norm, share of tokens above
    10x the median, perplexity at depth k, radial fraction, the log-log slope of the
    angular step on the scale, clamp delta CE, inference tokens/s (metrics/diagnose,
    clamp and throughput)."""

    group: str
    loss: str
    norm_mean: dict[str, float]
    norm_median: dict[str, float]
    norm_p99: dict[str, float]
    share_above_10x: dict[str, float]
    ppl: dict[str, float]
    radial_fraction: dict[str, float]
    slope: dict[str, float]
    delta_ce: dict[str, float]
    tokens_per_s: dict[str, float]

    @classmethod
    def of(cls, group: str, loss: str, diagnose: dict[str, Any], clamp: dict[str, Any],
           throughput: dict[str, Any]) -> CellA:
        return cls(group, loss, diagnose["norm_mean"], diagnose["norm_median"],
                   diagnose["norm_p99"], diagnose["norm_share_above_10x_median"],
                   diagnose["ppl_at_depth"], diagnose["radial_fraction"],
                   diagnose["angular_vs_scale_slope"],
                   clamp["delta_ce"], throughput["tokens_per_s"])

    @property
    def last(self) -> str:
        return max(self.ppl, key=lambda k: int(k[1:]))


def _verdict(ok: bool) -> Verdict:
    return "holds" if ok else "contradicted"


def paper_a_claims(cells: dict[str, CellA], clamp_margin: float = 0.01) -> list[Claim]:
    """Paper A's claims from the diagnose, clamp and throughput metrics of its cells.

    These verdicts compare point values of one run (direction only, no interval yet);
    the criterion of each says exactly what is compared.
    """
    normed = "perloop_normed" if "perloop_normed" in cells else None
    raw = "perloop_raw" if "perloop_raw" in cells else None
    controls = [c for c, v in cells.items() if v.group == "scale-controlled"]
    perloop_controls = [c for c in controls if cells[c].loss == "per_loop"]
    out: list[Claim] = []
    text = ("Per-loop CE + normed readout: the final-loop norm drifts far above every "
            "scale-controlled cell (raw readout, norm penalty, inter-loop norm)")
    paper = "~39,000 (44M), 56,051 (129M) vs 17 to 83"
    if normed and controls:
        n = cells[normed]
        top = max(controls, key=lambda c: cells[c].norm_mean[cells[c].last])
        a, b = n.norm_mean[n.last], cells[top].norm_mean[cells[top].last]
        out.append(Claim(text, paper, "final-loop mean norm of perloop_normed > that of every "
                         "scale-controlled cell; magnitude: ratio >= 100 (paper ~500-3000)",
                         f"{a:.1f} vs at most {b:.1f} ({top}); ratio {a / b:.1f}x",
                         _verdict(a > b), _verdict(a / b >= 100)))
    else:
        out.append(not_shown(text, paper, "-", "perloop_normed or the controls are absent"))
    text = ("The drift is token-level and heavy-tailed, not a mean shift: the tail grows "
            "faster than the centre")
    if normed:
        n = cells[normed]
        p99 = n.norm_p99[n.last] / n.norm_p99["k1"]
        med = n.norm_median[n.last] / n.norm_median["k1"]
        out.append(Claim(text, "heavy-tailed, not a mean shift",
                         "p99 grows more than the median over the loops",
                         f"p99 x{p99:.2f} vs median x{med:.2f}; share > 10x median "
                         f"{n.share_above_10x[n.last]:.2%}", _verdict(p99 > med)))
    else:
        out.append(not_shown(text, "heavy-tailed", "-", "perloop_normed is absent"))
    text = "Lemma 1: a normalized readout's loss has no radial gradient; a raw one has"
    if normed and raw:
        rn = cells[normed].radial_fraction[cells[normed].last]
        rr = cells[raw].radial_fraction[cells[raw].last]
        out.append(Claim(text, "~1e-9 (normed) vs ~1e-2 (raw)",
                         "final-loop radial fraction < 1e-5 normed and > 1e-3 raw",
                         f"{rn:.1e} vs {rr:.1e}", _verdict(rn < 1e-5 and rr > 1e-3)))
    else:
        out.append(not_shown(text, "~1e-9 vs ~1e-2", "-", "perloop_normed or perloop_raw absent"))
    text = ("Lemma 2: the angular step of the normalized state shrinks like 1/s_k "
            "(log-log slope of angular step on scale across tokens)")
    if normed:
        n = cells[normed]
        slope = n.slope[n.last]
        out.append(Claim(text, "angular update ~ 1/s_k", "slope at the last loop < 0; "
                         "magnitude: slope within [-1.5, -0.5]",
                         f"slope {slope:.2f}", _verdict(slope < 0),
                         within(slope, -1.5, -0.5)))
    else:
        out.append(not_shown(text, "~ 1/s_k", "-", "perloop_normed is absent"))
    text = ("Normed baselines are nearly K-invariant; scale-controlled variants improve "
            "clearly from K=1 to K (PPL(K=1)/PPL(K))")
    if normed and perloop_controls:
        ratio = {c: cells[c].ppl["k1"] / cells[c].ppl[cells[c].last]
                 for c in [normed, *perloop_controls]}
        out.append(Claim(text, "PPL(K=1) ~ PPL(K=4) vs clear improvement",
                         "every per-loop scale-controlled cell gains more from depth than "
                         "perloop_normed", ", ".join(f"{v:.3f} ({c})" for c, v in ratio.items()),
                         _verdict(all(ratio[c] > ratio[normed] for c in perloop_controls))))
    else:
        out.append(not_shown(text, "K-invariant vs improvement", "-", "cells absent"))
    text = "Scale-controlled variants have a better perplexity/throughput frontier"
    if normed and perloop_controls:
        best = min(perloop_controls, key=lambda c: cells[c].ppl[cells[c].last])
        b, n = cells[best], cells[normed]
        out.append(Claim(text, "better frontier", "lower PPL at the training depth for "
                         "the best per-loop scale-controlled cell (same architecture, so the "
                         "same cost)", f"{b.ppl[b.last]:.2f} ({best}) vs {n.ppl[n.last]:.2f}",
                         _verdict(b.ppl[b.last] < n.ppl[n.last])))
    else:
        out.append(not_shown(text, "better frontier", "-", "cells absent"))
    text = "Clamping the recurrent scale of trained normed models changes CE negligibly"
    normed_cells = [c for c, v in cells.items() if v.group == "normed baseline"]
    if normed_cells:
        worst = max(normed_cells, key=lambda c: abs(cells[c].delta_ce[cells[c].last]))
        d = cells[worst].delta_ce[cells[worst].last]
        out.append(Claim(text, "negligible change in CE",
                         f"|delta CE| < {clamp_margin} nats at the final loop for every "
                         "normed cell", ", ".join(f"{cells[c].delta_ce[cells[c].last]:+.4f} ({c})"
                                                  for c in normed_cells),
                         _verdict(abs(d) < clamp_margin)))
    else:
        out.append(not_shown(text, "negligible", "-", "no normed baseline cell"))
    return out
