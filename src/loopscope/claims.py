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
import pandas as pd

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


class Documents:
    """Resamples of whole documents with replacement, drawn once and shared by every
    statistic of a report: cells measured on the same windows are then compared paired.
    Tokens of one document are correlated, so resampling tokens would understate the
    uncertainty. Each method returns an array of draws: index 0 the statistic on the
    sample itself, 1.. one per resample (interval turns it into an Interval)."""

    def __init__(self, docs: np.ndarray, resamples: int = 1000, seed: int = 0) -> None:
        self.ids = np.unique(docs)
        k = len(self.ids)
        rng = np.random.default_rng(seed)
        draws = rng.multinomial(k, np.full(k, 1.0 / k), size=resamples).astype(np.float64)
        self.weights = np.vstack([np.ones(k), draws])

    def _index(self, docs: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.ids, docs)
        if not np.array_equal(self.ids[np.minimum(idx, len(self.ids) - 1)], docs):
            raise ValueError("tokens from documents outside the resampled set")
        return idx

    def total(self, docs: np.ndarray, values: np.ndarray) -> np.ndarray:
        """The sum of per-token values, per draw."""
        per_doc = np.bincount(self._index(np.asarray(docs)),
                              weights=np.asarray(values, dtype=np.float64),
                              minlength=len(self.ids))
        return self.weights @ per_doc

    def mean(self, docs: np.ndarray, values: np.ndarray) -> np.ndarray:
        """The mean of per-token values, per draw."""
        return self.total(docs, values) / np.maximum(self.total(docs, np.ones(len(docs))), 1)

    def quantile(self, docs: np.ndarray, values: np.ndarray, q: float) -> np.ndarray:
        """The q-quantile of per-token values, per draw (each token weighted by how
        often its document was drawn)."""
        values = np.asarray(values, dtype=np.float64)
        order = np.argsort(values, kind="stable")
        idx, ordered = self._index(np.asarray(docs))[order], values[order]
        out = np.empty(len(self.weights))
        for start in range(0, len(self.weights), 128):  # bounded memory
            cum = np.cumsum(self.weights[start:start + 128][:, idx], axis=1)
            for j, row in enumerate(cum):
                out[start + j] = ordered[min(np.searchsorted(row, q * row[-1]), len(row) - 1)]
        return out

    @staticmethod
    def interval(draws: np.ndarray) -> Interval:
        """The statistic with its 95% percentile interval over the resamples."""
        lo, hi = np.nanquantile(draws[1:], [0.025, 0.975])
        return Interval(float(draws[0]), float(lo), float(hi))


def bootstrap(columns: dict[str, np.ndarray], groups: np.ndarray,
              stat: Callable[[dict[str, np.ndarray]], np.ndarray],
              resamples: int = 1000, seed: int = 0) -> Interval:
    """A statistic of per-token columns with a 95% interval from resampling whole
    groups (documents): stat receives each column's sum over the (resampled) tokens,
    as arrays, and returns the statistic per draw, so ratios of sums cover means,
    shares and differences of conditional means."""
    docs = Documents(groups, resamples, seed)
    return docs.interval(stat({k: docs.total(groups, v) for k, v in columns.items()}))


def bootstrap_mean(values: np.ndarray, groups: np.ndarray, resamples: int = 1000,
                   seed: int = 0) -> Interval:
    """The mean of per-token values, its interval from resampling documents."""
    docs = Documents(groups, resamples, seed)
    return docs.interval(docs.mean(groups, values))


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
    loss placement, readout, recipe (a label: cells are compared within a recipe),
    training depth K; the per-token table of diagnose (tables/diagnose: doc, and per
    loop ce_k, norm_k, cos_k, floor_k) and the per-document depth sweep (tables/sweep);
    metrics/clamp (per mode, delta_ce_last as an interval); inference tokens/s and FLOPs
    per token at each depth (metrics/throughput)."""

    group: str
    loss: str
    readout: str
    recipe: str
    loops: int
    tokens: pd.DataFrame
    sweep: pd.DataFrame
    clamp: dict[str, Any]
    tokens_per_s: dict[str, float]
    flops_per_token: dict[str, float]

    @property
    def last(self) -> str:
        return f"k{self.loops}"

    def col(self, name: str, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(docs, values) of a per-token column at loop k (default: K)."""
        return (self.tokens["doc"].to_numpy(),
                self.tokens[f"{name}_{self.loops if k is None else k}"].to_numpy())


def inside(iv: Interval, lo: float, hi: float) -> Verdict:
    """A magnitude within [lo, hi]: holds when the interval lies inside, contradicted
    when it lies wholly outside."""
    if lo <= iv.lo and iv.hi <= hi:
        return "holds"
    return "contradicted" if iv.hi < lo or iv.lo > hi else "inconclusive"


def all_of(verdicts: list[Verdict]) -> Verdict:
    """A claim about every cell of a group: contradicted if one contradicts it, holds
    if all hold, otherwise inconclusive."""
    if "contradicted" in verdicts:
        return "contradicted"
    return "holds" if all(v == "holds" for v in verdicts) else "inconclusive"


def _lemma2_draws(docs: Documents, sweep: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per draw: Lemma 2's across-loop slope (log mean step_k on log mean s_k-1, loops
    2..L) and the scale growth s_L / s_1, from a per-document sweep table."""
    d = sweep["doc"].to_numpy()
    n = docs.total(d, sweep["tokens"].to_numpy())
    depth = max(int(c.rsplit("_", 1)[1]) for c in sweep.columns if c.startswith("scale_"))
    scale = np.stack([docs.total(d, sweep[f"scale_{k}"].to_numpy()) / n
                      for k in range(1, depth + 1)])
    step = np.stack([docs.total(d, sweep[f"step_{k}"].to_numpy()) / n
                     for k in range(2, depth + 1)])
    x, y = np.log(scale[:-1]), np.log(step)
    xc, yc = x - x.mean(0), y - y.mean(0)
    slope = (xc * yc).sum(0) / np.maximum((xc * xc).sum(0), 1e-300)
    return slope, scale[-1] / scale[0]


def _drift(text: str, paper: str, criterion: str, value: str, ratio: Interval) -> Claim:
    """A drift claim: the norm ratio above 1 (direction), at least 100 (magnitude)."""
    above_one = Interval(ratio.value - 1, ratio.lo - 1, ratio.hi - 1)
    return Claim(text, paper, criterion, f"{value}; ratio {ratio}", effect(above_one, +1),
                 at_least(ratio, 100))


def paper_a_claims(cells: dict[str, CellA], margin: float = 0.01, resamples: int = 1000
                   ) -> list[Claim]:
    """Paper A's claims, each with its criterion, this run's value with a 95% interval
    (documents resampled, paired across cells: every cell is measured on the same
    windows; seeds pooled) and a verdict (see the module docstring). margin: the band
    a claim of no effect must stay inside (nats).

    Cells are compared within the recipe of the per-loop normed cell; the drift ratio
    is also given for every other recipe that has per-loop normed and raw cells.
    """
    per_loop_normed = [c for c, v in cells.items()
                       if v.group == "normed baseline" and v.loss == "per_loop"]
    recipe = cells[per_loop_normed[0]].recipe if per_loop_normed else None
    mine = {c: v for c, v in cells.items() if v.recipe == recipe}
    normed = next((c for c in per_loop_normed if cells[c].recipe == recipe), None)
    controls = [c for c, v in mine.items() if v.group == "scale-controlled"]
    pl_controls = [c for c in controls if mine[c].loss == "per_loop"]
    raw = next((c for c in pl_controls if mine[c].readout == "raw"), None)
    docs = Documents(np.concatenate([v.tokens["doc"].to_numpy() for v in cells.values()])
                     if cells else np.zeros(1), resamples)
    out: list[Claim] = []

    def mean(c: str, name: str, k: int | None = None, of: dict[str, CellA] = mine
             ) -> np.ndarray:
        return docs.mean(*of[c].col(name, k))

    # 1. the drift, under this recipe and every other one that has the two cells
    text = ("Per-loop CE + normed readout: the final-loop norm drifts far above every "
            "scale-controlled cell (raw readout, norm penalty, inter-loop norm)")
    paper = "~39,000 (44M), 56,051 (129M) vs 17 to 83"
    if normed and controls:
        norms = {c: mean(c, "norm") for c in controls}
        top = np.max(np.stack(list(norms.values())), axis=0)
        worst = max(controls, key=lambda c: norms[c][0])
        drift = mean(normed, "norm")
        out.append(_drift(text + f" [{recipe}]", paper,
                          "final-loop mean norm of the per-loop normed cell / the largest of "
                          "the scale-controlled cells' > 1 (interval); magnitude: >= 100 "
                          "(paper ~500-3000)",
                          f"{drift[0]:.1f} vs at most {top[0]:.1f} ({worst})",
                          docs.interval(drift / top)))
    else:
        out.append(not_shown(text, paper, "-", "a per-loop normed cell or the controls "
                             "are absent"))
    for other in sorted({v.recipe for v in cells.values()} - {recipe}):
        theirs = {c: v for c, v in cells.items() if v.recipe == other and v.loss == "per_loop"}
        n_ = next((c for c, v in theirs.items() if v.group == "normed baseline"), None)
        r_ = next((c for c, v in theirs.items() if v.readout == "raw"), None)
        if n_ and r_:
            a, b = mean(n_, "norm", of=theirs), mean(r_, "norm", of=theirs)
            out.append(_drift(f"The drift under the recipe [{other}]: per-loop normed vs raw",
                              paper, "final-loop mean norm ratio > 1; magnitude: >= 100",
                              f"{a[0]:.1f} ({n_}) vs {b[0]:.1f} ({r_})",
                              docs.interval(a / b)))

    # 2. the shape of the drift
    text = ("The drift is token-level and heavy-tailed, not a mean shift: the tail grows "
            "faster than the centre")

    def tail_growth(c: str) -> np.ndarray:
        def ratio(k: int) -> np.ndarray:
            d, v = mine[c].col("norm", k)
            return docs.quantile(d, v, 0.99) / docs.quantile(d, v, 0.5)
        return ratio(mine[c].loops) / ratio(1) - 1

    if normed:
        growth = tail_growth(normed)
        others = {c: tail_growth(c) for c in pl_controls}
        excess = (docs.interval(growth - np.max(np.stack(list(others.values())), axis=0))
                  if others else None)
        d, v = mine[normed].col("norm")
        share = float((v > 10 * np.median(v)).mean())
        out.append(Claim(text, "heavy-tailed, not a mean shift",
                         "T = (p99/median at K) / (p99/median at loop 1) - 1 > 0 (a mean "
                         "shift keeps T = 0); magnitude: T above every per-loop "
                         "scale-controlled cell's (paired difference)",
                         f"T {docs.interval(growth)}; " + ", ".join(
                             f"{c} {o[0]:+.3f}" for c, o in others.items())
                         + f"; share above 10x median {share:.2%}",
                         effect(docs.interval(growth), +1),
                         effect(excess, +1) if excess else "n/a"))
    else:
        out.append(not_shown(text, "heavy-tailed", "-", "a per-loop normed cell is absent"))

    # 3. Lemma 1
    text = "Lemma 1: a normalized readout's loss has no radial gradient; a raw one has"
    if normed and raw:
        rn, rr = mean(normed, "cos"), mean(raw, "cos")
        contrast = docs.interval(np.log10(rr / rn))
        out.append(Claim(text, "~1e-9 (normed) vs ~1e-2 (raw)",
                         "mean per-token radial fraction at K (float64): raw / normed > 1, "
                         "log10 interval; magnitude: >= 100x. The normed value is RMSNorm's "
                         "eps floor (eps d / ||H||^2), not a measured zero",
                         f"{rn[0]:.1e} (eps floor {mean(normed, 'floor')[0]:.1e}) vs "
                         f"{rr[0]:.1e}; log10 ratio {contrast}", effect(contrast, +1),
                         at_least(contrast, 2.0)))
    else:
        out.append(not_shown(text, "~1e-9 vs ~1e-2", "-", "per-loop normed or raw absent"))

    # 4. Lemma 2, as the reference checks it: the sweep past K
    text = ("Lemma 2: past the training depth, the angular step of the normalized state "
            "shrinks like 1/s (angular step x scale constant across loops)")
    if normed:
        slope, growth = _lemma2_draws(docs, mine[normed].sweep)
        depth = sum(c.startswith("scale_") for c in mine[normed].sweep.columns)
        iv = docs.interval(slope)
        contrast = ""
        for c in [x for x in pl_controls if mine[x].readout != "raw"][:1] or pl_controls[:1]:
            cs, cg = _lemma2_draws(docs, mine[c].sweep)
            contrast = f"; {c}: scale x{cg[0]:.2f}, slope {cs[0]:.2f}"
        out.append(Claim(text, "angular step ~ 1/s_k",
                         f"over loops 2..{depth}: log-log slope of the mean angular step on "
                         "the mean scale < 0 (interval); magnitude: inside [-1.5, -0.5] "
                         "(Lemma 2: -1)",
                         f"slope {iv}, scale x{growth[0]:.2f} over the sweep{contrast}",
                         effect(iv, -1), inside(iv, -1.5, -0.5)))
    else:
        out.append(not_shown(text, "~ 1/s_k", "-", "a per-loop normed cell is absent"))

    # 5. depth use: the normed baseline is K-invariant, scale control gains from depth
    def gain(c: str) -> np.ndarray:
        return mean(c, "ce", 1) - mean(c, "ce")

    text = "The normed per-loop baseline is nearly K-invariant: PPL(K=1) ~ PPL(K)"
    if normed:
        g = docs.interval(gain(normed))
        out.append(Claim(text, "PPL(K=1) ~ PPL(K=4)",
                         f"CE(1) - CE(K) inside +-{margin} nats", f"{g} nats ({normed})",
                         negligible(g, margin)))
    else:
        out.append(not_shown(text, "K-invariant", "-", "a per-loop normed cell is absent"))
    text = ("Scale-controlled per-loop variants gain more from depth than the normed "
            "baseline")
    if normed and pl_controls:
        diffs = {c: docs.interval(gain(c) - gain(normed)) for c in pl_controls}
        out.append(Claim(text, "PPL improves clearly from K=1 to K=4",
                         "[CE(1) - CE(K)] of each per-loop scale-controlled cell minus the "
                         "normed cell's > 0 (paired interval), for every one",
                         "; ".join(f"{c} {iv} nats" for c, iv in diffs.items()),
                         all_of([effect(iv, +1) for iv in diffs.values()])))
    else:
        out.append(not_shown(text, "clear improvement", "-", "cells absent"))

    # 6. the frontier
    text = "Scale-controlled variants have a better perplexity/throughput frontier"
    if normed and pl_controls:
        best = min(pl_controls, key=lambda c: mean(c, "ce")[0])
        diff = docs.interval(mean(best, "ce") - mean(normed, "ce"))
        b, n = mine[best], mine[normed]
        out.append(Claim(text, "better frontier",
                         "CE at K of the best per-loop scale-controlled cell - the normed "
                         "cell's < 0 (paired interval), at the cost measured beside it",
                         f"{diff} nats ({best}); tokens/s at K {b.tokens_per_s[b.last]:,.0f} "
                         f"vs {n.tokens_per_s[n.last]:,.0f}, FLOPs/token "
                         f"{b.flops_per_token[b.last]:.3g} vs {n.flops_per_token[n.last]:.3g}",
                         effect(diff, -1)))
    else:
        out.append(not_shown(text, "better frontier", "-", "cells absent"))

    # 7. the clamp
    text = "Clamping the recurrent scale of trained normed models changes CE negligibly"
    normed_cells = [c for c, v in mine.items() if v.group == "normed baseline"]
    if normed_cells:
        found = {(c, mode): Interval.of(mine[c].clamp[mode]["delta_ce_last"])
                 for c in normed_cells for mode in mine[c].clamp}
        out.append(Claim(text, "negligible change in CE",
                         f"delta CE at K inside +-{margin} nats, for every normed cell and "
                         "both clamp modes (freeze_loop1, remove_radial)",
                         "; ".join(f"{c} {mode} {iv}" for (c, mode), iv in found.items()),
                         all_of([negligible(iv, margin) for iv in found.values()])))
    else:
        out.append(not_shown(text, "negligible", "-", "no normed baseline cell"))
    return out
