"""Verdicts on the papers' claims, each a test that states its criterion, carries its
uncertainty and can come out either way.

A verdict is one of
    holds          the interval (95%, units resampled) decides for the claim
    contradicted   the interval decides against it
    inconclusive   the interval does not decide, or rests on fewer than
                   loopscope.units.FEWEST_UNITS units
    not shown      the cells or metrics the claim needs are not in this run
A claim of an effect holds when its interval excludes zero in the claimed direction;
a claim of *no* effect holds when its interval lies inside a stated margin. Where a
paper gives a magnitude, the magnitude gets its own verdict beside the direction.

The stages compute the intervals (they hold the per-token values) and write them into
the metrics files as {"value", "lo", "hi", "units"}; the functions here read metrics and
tables only, so the unit tests can feed constructed ones, and the claims stage writes
the verdicts for the notebooks to render. Intervals resample validation units
(documents, or blocks of windows: loopscope.units) and, for a cell trained with several
seeds, its seeds (Documents): with one seed an interval is conditional on that model.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np
import pandas as pd

from loopscope.units import FEWEST_UNITS

Verdict = Literal["holds", "contradicted", "inconclusive", "not shown"]


@dataclass(frozen=True)
class Interval:
    """An estimate with its 95% interval, and how many resampling units (documents, or
    blocks of windows: loopscope.units) it rests on (None: not known)."""

    value: float
    lo: float
    hi: float
    units: int | None = None

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def of(cls, raw: dict[str, float]) -> Interval:
        units = raw.get("units")
        return cls(raw["value"], raw["lo"], raw["hi"], None if units is None else int(units))

    def map(self, f: Callable[[float], float]) -> Interval:
        """The interval of f(statistic), f increasing."""
        return Interval(f(self.value), f(self.lo), f(self.hi), self.units)

    @property
    def too_few_units(self) -> bool:
        return self.units is not None and self.units < FEWEST_UNITS

    def __str__(self) -> str:
        return f"{self.value:.4g} [{self.lo:.4g}, {self.hi:.4g}]"


class Documents:
    """Resamples of whole resampling units (documents, or blocks of windows) with
    replacement, drawn once and shared by every statistic of a report: cells measured
    on the same windows are then compared paired. Tokens of one unit are correlated, so
    resampling tokens would understate the uncertainty.

    Where per-token values carry the training run they come from (runs: its seed) and a
    cell has several, the resample is two-level: the cell's runs are drawn with
    replacement too (once per draw, independently for each cell, keyed by the cell's
    name), and a token weighs (times its unit was drawn) x (times its run was drawn).
    The interval then counts training noise as well as the choice of documents. With
    one run per cell the run level changes nothing: the interval is conditional on one
    trained model.

    Each method returns an array of draws: index 0 the statistic on the sample itself,
    1.. one per resample (interval turns it into an Interval)."""

    def __init__(self, docs: np.ndarray, resamples: int = 1000, seed: int = 0) -> None:
        self.ids = np.unique(docs)
        k = len(self.ids)
        self.seed, self.resamples = seed, resamples
        rng = np.random.default_rng(seed)
        draws = rng.multinomial(k, np.full(k, 1.0 / k), size=resamples).astype(np.float64)
        self.weights = np.vstack([np.ones(k), draws])
        self._runs: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}

    def _index(self, docs: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.ids, docs)
        if not np.array_equal(self.ids[np.minimum(idx, len(self.ids) - 1)], docs):
            raise ValueError("tokens from documents outside the resampled set")
        return idx

    def _run_weights(self, runs: np.ndarray | None, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(the run index of every token, per draw the times each run was drawn)."""
        if runs is None:
            return np.zeros(0, np.int64), np.ones((len(self.weights), 1))
        labels, idx = np.unique(np.asarray(runs), return_inverse=True)
        name = (key, tuple(int(v) for v in labels))
        if name not in self._runs:
            n = len(labels)
            rng = np.random.default_rng([self.seed, zlib.crc32(repr(name).encode())])
            draws = rng.multinomial(n, np.full(n, 1.0 / n), size=self.resamples)
            self._runs[name] = np.vstack([np.ones(n), draws.astype(np.float64)])
        return idx, self._runs[name]

    def total(self, docs: np.ndarray, values: np.ndarray, runs: np.ndarray | None = None,
              key: str = "") -> np.ndarray:
        """The sum of per-token values, per draw (runs, key: see the class doc)."""
        d = self._index(np.asarray(docs))
        r, w_run = self._run_weights(runs, key)
        cells = d * w_run.shape[1] + (r if runs is not None else 0)
        per = np.bincount(cells, weights=np.asarray(values, dtype=np.float64),
                          minlength=len(self.ids) * w_run.shape[1])
        per = per.reshape(len(self.ids), w_run.shape[1])
        return ((self.weights @ per) * w_run).sum(1)

    def mean(self, docs: np.ndarray, values: np.ndarray, runs: np.ndarray | None = None,
             key: str = "") -> np.ndarray:
        """The mean of per-token values, per draw."""
        n = self.total(docs, np.ones(len(docs)), runs, key)
        return self.total(docs, values, runs, key) / np.maximum(n, 1e-300)

    def quantile(self, docs: np.ndarray, values: np.ndarray, q: float,
                 runs: np.ndarray | None = None, key: str = "") -> np.ndarray:
        """The q-quantile of per-token values, per draw (each token weighted by how
        often its unit, and its run, were drawn)."""
        values = np.asarray(values, dtype=np.float64)
        order = np.argsort(values, kind="stable")
        idx, ordered = self._index(np.asarray(docs))[order], values[order]
        r, w_run = self._run_weights(runs, key)
        ridx = r[order] if runs is not None else np.zeros(len(order), np.int64)
        out = np.empty(len(self.weights))
        for start in range(0, len(self.weights), 128):  # bounded memory
            w = (self.weights[start:start + 128][:, idx]
                 * w_run[start:start + 128][:, ridx])
            cum = np.cumsum(w, axis=1)
            for j, row in enumerate(cum):
                out[start + j] = ordered[min(np.searchsorted(row, q * row[-1]), len(row) - 1)]
        return out

    def interval(self, draws: np.ndarray) -> Interval:
        """The statistic with its 95% percentile interval over the resamples, and the
        number of units it rests on."""
        lo, hi = np.nanquantile(draws[1:], [0.025, 0.975])
        return Interval(float(draws[0]), float(lo), float(hi), len(self.ids))


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
                   seed: int = 0, runs: np.ndarray | None = None) -> Interval:
    """The mean of per-token values, its interval from resampling units (groups) and,
    given each token's run, runs (Documents)."""
    docs = Documents(groups, resamples, seed)
    return docs.interval(docs.mean(groups, values, runs))


def decides(rule: Callable[..., Verdict]) -> Callable[..., Verdict]:
    """A verdict rule that decides nothing on an interval resting on fewer than
    FEWEST_UNITS resampling units: so few units make a percentile interval too narrow
    to trust (two documents gave near-zero widths)."""
    @functools.wraps(rule)
    def checked(iv: Interval | None, *args: Any) -> Verdict:
        if iv is not None and iv.too_few_units:
            return "inconclusive"
        return rule(iv, *args)
    return checked


@decides
def effect(iv: Interval, sign: int) -> Verdict:
    """A claimed effect of the given sign (+1: positive, -1: negative)."""
    lo, hi = (iv.lo, iv.hi) if sign > 0 else (-iv.hi, -iv.lo)
    if lo > 0:
        return "holds"
    return "contradicted" if hi < 0 else "inconclusive"


@decides
def negligible(iv: Interval, margin: float) -> Verdict:
    """A claimed absence of effect: the interval inside [-margin, margin]."""
    if -margin <= iv.lo and iv.hi <= margin:
        return "holds"
    return "contradicted" if iv.lo > margin or iv.hi < -margin else "inconclusive"


@decides
def at_least(iv: Interval, threshold: float) -> Verdict:
    """A claimed value of at least threshold."""
    if iv.lo >= threshold:
        return "holds"
    return "contradicted" if iv.hi < threshold else "inconclusive"


@decides
def at_most(iv: Interval, threshold: float) -> Verdict:
    """A claimed value of at most threshold."""
    if iv.hi <= threshold:
        return "holds"
    return "contradicted" if iv.lo > threshold else "inconclusive"


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
    regime: str = ""  # why the verdict is read outside the paper's regime ("": inside)
    depth_use: str = ""  # paper B: the backbone's useful depth against R
    recipe: str = ""  # the recipe group of paper A's cells the claim is judged in
    resampled: str = ""  # what the interval resamples: units, and seeds per cell

    def row(self) -> dict[str, str]:
        return asdict(self)


def not_shown(claim: str, paper: str, criterion: str, why: str) -> Claim:
    return Claim(claim, paper, criterion, why, "not shown")


# ----------------------------------------------------------------------------- paper B
# One function per claim, its criterion beside its logic. Every interval is computed by
# the convergence and policies stages from one set of document resamples per cell.

REGIME = 0.75  # paper B's backbones use their depth: useful depth ~ R; below this x R not
SMALLEST_TYPE = 0.02  # token types rarer than this share of the typed tokens are not judged


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


@decides
def below(iv: Interval, threshold: float) -> Verdict:
    """A claimed value below threshold."""
    if iv.hi < threshold:
        return "holds"
    return "contradicted" if iv.lo >= threshold else "inconclusive"


def _pct(iv: Interval) -> str:
    return f"{iv.value:.1%} [{iv.lo:.1%}, {iv.hi:.1%}]"


def elasticity(b: Backbone) -> Claim:
    """Paper B: "monotone improvement from 1 to 8". Monotone: no step k -> k+1 up to R
    makes CE worse by more than the margin, and the second half of the depth still
    helps (CE(R/2) - CE(R) above the margin): one gain from 1 to R is not monotone."""
    e = b.conv["elasticity"]
    margin, half = e["margin"], Interval.of(e["half_gain"])
    steps = {int(k[1:]): Interval.of(v) for k, v in e["steps"].items()}
    worst = max(steps, key=lambda k: steps[k].value) if steps else None
    if half.too_few_units or any(s.too_few_units for s in steps.values()):
        verdict: Verdict = "inconclusive"  # as every rule under @decides
    elif any(s.lo > margin for s in steps.values()) or half.hi < margin:
        verdict = "contradicted"
    elif all(s.hi <= margin for s in steps.values()) and half.lo > margin:
        verdict = "holds"
    else:
        verdict = "inconclusive"
    worst_text = (f"; worst step CE({worst + 1}) - CE({worst}) {steps[worst]}"
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


def table(claims: list[Claim]) -> list[dict[str, str]]:
    """Rows for a DataFrame or an HTML table; the regime, depth use, recipe and
    resampled columns only where a claim has one."""
    rows = [c.row() for c in claims]
    for col in ("regime", "depth_use", "recipe", "resampled"):
        if not any(r[col] for r in rows):
            for r in rows:
                del r[col]
    return rows


# ----------------------------------------------------------------------------- paper A


@dataclass
class CellA:
    """What paper A's claims read of one cell: its group (loopscope.report.cell_group),
    loss placement, readout, recipe (a label: cells are compared within a recipe),
    training depth K; the per-token table of diagnose (tables/diagnose: doc, and per
    loop ce_k, norm_k, cos_k, floor_k) and the per-document depth sweep (tables/sweep);
    metrics/clamp (per mode, delta_ce_last as an interval); inference tokens/s and FLOPs
    per token at each depth (metrics/throughput). Rows of both tables carry the run
    (seed) they come from: intervals resample a cell's seeds as well as documents."""

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
    unit: str = "document"  # what the tables' doc column holds (loopscope.units)

    @property
    def last(self) -> str:
        return f"k{self.loops}"

    @property
    def seeds(self) -> int:
        return int(self.tokens["seed"].nunique()) if "seed" in self.tokens else 1

    def col(self, name: str, k: int | None = None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(docs, values, runs) of a per-token column at loop k (default: K); runs: the
        seed of each token's run (None: one run)."""
        return (self.tokens["doc"].to_numpy(),
                self.tokens[f"{name}_{self.loops if k is None else k}"].to_numpy(),
                _runs(self.tokens))


def _runs(table: pd.DataFrame) -> np.ndarray | None:
    return table["seed"].to_numpy() if "seed" in table else None


@decides
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


def _lemma2_draws(docs: Documents, sweep: pd.DataFrame, key: str
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per draw: Lemma 2's across-loop slope (log mean step_k on log mean s_k-1, loops
    2..L) and the scale growth s_L / s_1, from a per-document (and run) sweep table of
    the cell named key."""
    d, runs = sweep["doc"].to_numpy(), _runs(sweep)

    def total(col: str) -> np.ndarray:
        return docs.total(d, sweep[col].to_numpy(), runs, key)

    n = total("tokens")
    depth = max(int(c.rsplit("_", 1)[1]) for c in sweep.columns if c.startswith("scale_"))
    scale = np.stack([total(f"scale_{k}") / n for k in range(1, depth + 1)])
    step = np.stack([total(f"step_{k}") / n for k in range(2, depth + 1)])
    x, y = np.log(scale[:-1]), np.log(step)
    xc, yc = x - x.mean(0), y - y.mean(0)
    slope = (xc * yc).sum(0) / np.maximum((xc * xc).sum(0), 1e-300)
    return slope, scale[-1] / scale[0]


def _drift(text: str, paper: str, criterion: str, value: str, ratio: Interval) -> Claim:
    """A drift claim: the norm ratio above 1 (direction), at least 100 (magnitude)."""
    above_one = ratio.map(lambda v: v - 1)
    return Claim(text, paper, criterion, f"{value}; ratio {ratio}", effect(above_one, +1),
                 at_least(ratio, 100))


@dataclass
class GroupA:
    """One recipe's paper A cells as the claims read them: the per-loop normed baseline,
    the scale-controlled cells (per-loop ones apart), the per-loop raw cell, and the
    resamples shared by every claim of the report (so cells are paired). used: the
    cells a claim has read so far (resampled() names their seeds)."""

    cells: dict[str, CellA]
    recipe: str | None
    docs: Documents
    margin: float
    used: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, cells: dict[str, CellA], docs: Documents, margin: float,
           recipe: str | None = None) -> GroupA:
        """The cells of one recipe (default: the first per-loop normed cell's)."""
        if recipe is None:
            normed = [v for v in cells.values()
                      if v.group == "normed baseline" and v.loss == "per_loop"]
            recipe = normed[0].recipe if normed else None
        return cls({c: v for c, v in cells.items() if v.recipe == recipe}, recipe, docs,
                   margin)

    @property
    def normed(self) -> str | None:
        return next((c for c, v in self.cells.items()
                     if v.group == "normed baseline" and v.loss == "per_loop"), None)

    @property
    def controls(self) -> list[str]:
        return [c for c, v in self.cells.items() if v.group == "scale-controlled"]

    @property
    def per_loop_controls(self) -> list[str]:
        return [c for c in self.controls if self.cells[c].loss == "per_loop"]

    @property
    def raw(self) -> str | None:
        return next((c for c in self.per_loop_controls if self.cells[c].readout == "raw"),
                    None)

    def cell(self, c: str) -> CellA:
        """Cell c, recorded as read by the claim being judged."""
        self.used.add(c)
        return self.cells[c]

    def mean(self, c: str, name: str, k: int | None = None) -> np.ndarray:
        """Per draw: the mean of a per-token column of cell c at loop k (default K)."""
        return self.docs.mean(*self.cell(c).col(name, k), key=c)

    def quantile(self, c: str, name: str, k: int, q: float) -> np.ndarray:
        """Per draw: the q-quantile of a per-token column of cell c at loop k."""
        d, v, runs = self.cell(c).col(name, k)
        return self.docs.quantile(d, v, q, runs, c)

    def lemma2(self, c: str) -> tuple[np.ndarray, np.ndarray]:
        return _lemma2_draws(self.docs, self.cell(c).sweep, c)

    def gain(self, c: str) -> np.ndarray:
        """Per draw: CE(1) - CE(K), what depth buys the cell."""
        return self.mean(c, "ce", 1) - self.mean(c, "ce")

    def resampled(self) -> str:
        """What the intervals of the claim just judged resample: units, and seeds per
        cell read; a cell trained once makes the interval conditional on that model."""
        kinds = sorted({self.cells[c].unit for c in self.used}) or ["document"]
        units = f"{len(self.docs.ids)} units ({', '.join(kinds)})"
        one = sorted(c for c in self.used if self.cells[c].seeds < 2)
        many = sorted({self.cells[c].seeds for c in self.used} - {1})
        seeds = f" x seeds ({'/'.join(map(str, many))} per cell)" if many else ""
        if one:
            seeds += (f"; one seed for {', '.join(one)}: conditional on that trained model")
        return units + seeds


DRIFT_PAPER = "~39,000 (44M), 56,051 (129M) vs 17 to 83"


def drift(g: GroupA) -> Claim:
    """Paper A: per-loop CE through a normalized readout lets the final-loop norm drift
    to tens of thousands, while every scale-controlled variant stays at tens."""
    text = ("Per-loop CE + normed readout: the final-loop norm drifts far above every "
            "scale-controlled cell (raw readout, norm penalty, inter-loop norm)")
    if not (g.normed and g.controls):
        return not_shown(text, DRIFT_PAPER, "-", "a per-loop normed cell or the controls "
                         "are absent")
    norms = {c: g.mean(c, "norm") for c in g.controls}
    top = np.max(np.stack(list(norms.values())), axis=0)
    worst = max(g.controls, key=lambda c: norms[c][0])
    ours = g.mean(g.normed, "norm")
    return _drift(text, DRIFT_PAPER,
                  "final-loop mean norm of the per-loop normed cell / the largest of the "
                  "scale-controlled cells' > 1 (interval); magnitude: >= 100 (paper "
                  "~500-3000)", f"{ours[0]:.1f} vs at most {top[0]:.1f} ({worst})",
                  g.docs.interval(ours / top))


def heavy_tail(g: GroupA) -> Claim:
    """Paper A: the drift is token-level and heavy-tailed, not a mean shift. T compares
    the p99/median spread at K with loop 1's: a mean shift keeps T = 0."""
    text = ("The drift is token-level and heavy-tailed, not a mean shift: the tail grows "
            "faster than the centre")
    if not g.normed:
        return not_shown(text, "heavy-tailed", "-", "a per-loop normed cell is absent")

    def growth(c: str) -> np.ndarray:
        def spread(k: int) -> np.ndarray:
            return g.quantile(c, "norm", k, 0.99) / g.quantile(c, "norm", k, 0.5)
        return spread(g.cells[c].loops) / spread(1) - 1

    ours = growth(g.normed)
    others = {c: growth(c) for c in g.per_loop_controls}
    excess = (g.docs.interval(ours - np.max(np.stack(list(others.values())), axis=0))
              if others else None)
    _, v, _ = g.cells[g.normed].col("norm")
    share = float((v > 10 * np.median(v)).mean())
    return Claim(text, "heavy-tailed, not a mean shift",
                 "T = (p99/median at K) / (p99/median at loop 1) - 1 > 0 (a mean shift keeps "
                 "T = 0); magnitude: T above every per-loop scale-controlled cell's (paired "
                 "difference)",
                 f"T {g.docs.interval(ours)}; " + ", ".join(
                     f"{c} {o[0]:+.3f}" for c, o in others.items())
                 + f"; share above 10x median {share:.2%}",
                 effect(g.docs.interval(ours), +1), effect(excess, +1) if excess else "n/a")


def lemma1(g: GroupA) -> Claim:
    """Paper A's Lemma 1: a normalized readout's loss has no radial gradient (only
    RMSNorm's eps floor remains), a raw readout's has."""
    text = "Lemma 1: a normalized readout's loss has no radial gradient; a raw one has"
    if not (g.normed and g.raw):
        return not_shown(text, "~1e-9 vs ~1e-2", "-", "per-loop normed or raw absent")
    rn, rr = g.mean(g.normed, "cos"), g.mean(g.raw, "cos")
    contrast = g.docs.interval(np.log10(rr / rn))
    return Claim(text, "~1e-9 (normed) vs ~1e-2 (raw)",
                 "mean per-token radial fraction at K (float64): raw / normed > 1, log10 "
                 "interval; magnitude: >= 100x. The normed value is RMSNorm's eps floor "
                 "(eps d / ||H||^2), not a measured zero",
                 f"{rn[0]:.1e} (eps floor {g.mean(g.normed, 'floor')[0]:.1e}) vs {rr[0]:.1e}; "
                 f"log10 ratio {contrast}", effect(contrast, +1), at_least(contrast, 2.0))


def lemma2(g: GroupA) -> Claim:
    """Paper A's Lemma 2, as the reference checks it on the sweep past K: the angular
    step of the normalized state shrinks like 1/s (slope -1 on log-log axes)."""
    text = ("Lemma 2: past the training depth, the angular step of the normalized state "
            "shrinks like 1/s (angular step x scale constant across loops)")
    if not g.normed:
        return not_shown(text, "~ 1/s_k", "-", "a per-loop normed cell is absent")
    sweep = g.cells[g.normed].sweep
    slope, growth = g.lemma2(g.normed)
    depth = sum(c.startswith("scale_") for c in sweep.columns)
    iv = g.docs.interval(slope)
    contrast = ""
    pl = g.per_loop_controls
    for c in [x for x in pl if g.cells[x].readout != "raw"][:1] or pl[:1]:
        cs, cg = g.lemma2(c)
        contrast = f"; {c}: scale x{cg[0]:.2f}, slope {cs[0]:.2f}"
    return Claim(text, "angular step ~ 1/s_k",
                 f"over loops 2..{depth}: log-log slope of the mean angular step on the mean "
                 "scale < 0 (interval); magnitude: inside [-1.5, -0.5] (Lemma 2: -1)",
                 f"slope {iv}, scale x{growth[0]:.2f} over the sweep{contrast}",
                 effect(iv, -1), inside(iv, -1.5, -0.5))


def k_invariance(g: GroupA) -> Claim:
    """Paper A: the normed per-loop baseline is nearly K-invariant (it cannot use depth)."""
    text = "The normed per-loop baseline is nearly K-invariant: PPL(K=1) ~ PPL(K)"
    if not g.normed:
        return not_shown(text, "K-invariant", "-", "a per-loop normed cell is absent")
    iv = g.docs.interval(g.gain(g.normed))
    return Claim(text, "PPL(K=1) ~ PPL(K=4)", f"CE(1) - CE(K) inside +-{g.margin} nats",
                 f"{iv} nats ({g.normed})", negligible(iv, g.margin))


def depth_gain(g: GroupA) -> Claim:
    """Paper A: scale-controlled per-loop variants improve clearly from K = 1 to K."""
    text = "Scale-controlled per-loop variants gain more from depth than the normed baseline"
    if not (g.normed and g.per_loop_controls):
        return not_shown(text, "clear improvement", "-", "cells absent")
    diffs = {c: g.docs.interval(g.gain(c) - g.gain(g.normed)) for c in g.per_loop_controls}
    return Claim(text, "PPL improves clearly from K=1 to K=4",
                 "[CE(1) - CE(K)] of each per-loop scale-controlled cell minus the normed "
                 "cell's > 0 (paired interval), for every one",
                 "; ".join(f"{c} {iv} nats" for c, iv in diffs.items()),
                 all_of([effect(iv, +1) for iv in diffs.values()]))


def frontier(g: GroupA) -> Claim:
    """Paper A: scale control gives a better perplexity/throughput frontier."""
    text = "Scale-controlled variants have a better perplexity/throughput frontier"
    if not (g.normed and g.per_loop_controls):
        return not_shown(text, "better frontier", "-", "cells absent")
    best = min(g.per_loop_controls, key=lambda c: g.mean(c, "ce")[0])
    diff = g.docs.interval(g.mean(best, "ce") - g.mean(g.normed, "ce"))
    b, n = g.cell(best), g.cell(g.normed)
    return Claim(text, "better frontier",
                 "CE at K of the best per-loop scale-controlled cell - the normed cell's < 0 "
                 "(paired interval), at the cost measured beside it",
                 f"{diff} nats ({best}); tokens/s at K {b.tokens_per_s[b.last]:,.0f} vs "
                 f"{n.tokens_per_s[n.last]:,.0f}, FLOPs/token {b.flops_per_token[b.last]:.3g} "
                 f"vs {n.flops_per_token[n.last]:.3g}", effect(diff, -1))


def clamp(g: GroupA) -> Claim:
    """Paper A: clamping the recurrent scale of trained normed models (both reference
    modes) changes CE negligibly: the scale the normed readout ignores carries nothing."""
    text = "Clamping the recurrent scale of trained normed models changes CE negligibly"
    normed = [c for c, v in g.cells.items() if v.group == "normed baseline"]
    if not normed:
        return not_shown(text, "negligible", "-", "no normed baseline cell")
    found = {(c, mode): Interval.of(g.cell(c).clamp[mode]["delta_ce_last"])
             for c in normed for mode in g.cells[c].clamp}
    return Claim(text, "negligible change in CE",
                 f"delta CE at K inside +-{g.margin} nats, for every normed cell and both "
                 "clamp modes (freeze_loop1, remove_radial)",
                 "; ".join(f"{c} {mode} {iv}" for (c, mode), iv in found.items()),
                 all_of([negligible(iv, g.margin) for iv in found.values()]))


CLAIMS_A = (drift, heavy_tail, lemma1, lemma2, k_invariance, depth_gain, frontier, clamp)


def recipes(cells: dict[str, CellA]) -> list[str]:
    """The recipes with a per-loop normed cell, in the cells' order: each is a group
    paper A's claims are judged in."""
    return list(dict.fromkeys(v.recipe for v in cells.values()
                              if v.group == "normed baseline" and v.loss == "per_loop"))


def _resamples(cells: dict[str, CellA], resamples: int) -> Documents:
    return Documents(np.concatenate([v.tokens["doc"].to_numpy() for v in cells.values()])
                     if cells else np.zeros(1), resamples)


def paper_a_claims(cells: dict[str, CellA], margin: float = 0.01, resamples: int = 1000
                   ) -> list[Claim]:
    """Paper A's claims judged in every recipe group (recipes), each with its
    criterion, this run's value with a 95% interval (units resampled, paired across
    cells: every cell is measured on the same windows; and each cell's seeds resampled
    where it has several: Documents) and a verdict (see the module docstring). margin:
    the band a claim of no effect must stay inside (nats). The recipe and resampled
    columns say which group and what the interval counts.
    """
    docs = _resamples(cells, resamples)
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
            out.append(claim)
    return out


def init_effect(cells: dict[str, CellA], resamples: int = 1000) -> str:
    """One sentence on what the recipe (the init above all) does to the drift's
    magnitude: the drift ratio of every recipe group, side by side ("" with fewer than
    two groups that show it)."""
    docs = _resamples(cells, resamples)
    found = {}
    for recipe in recipes(cells):
        g = GroupA.of(cells, docs, 0.0, recipe)
        if g.normed and g.controls:
            top = np.max(np.stack([g.mean(c, "norm") for c in g.controls]), axis=0)
            found[recipe] = docs.interval(g.mean(g.normed, "norm") / top)
    if len(found) < 2:
        return ""
    (lo_r, lo), (hi_r, hi) = sorted(found.items(), key=lambda kv: kv[1].value)[::len(found) - 1]
    fold = hi.value / lo.value
    return (f"With readout, loss placement, data and schedule the same, the drift ratio is "
            f"{lo} under [{lo_r}] and {hi} under [{hi_r}]: the recipe (its initialization "
            f"above all) {'moves' if fold >= 2 else 'barely moves'} the drift's magnitude "
            f"{fold:,.1f}-fold.")
