"""Statistics and verdict rules: what an interval is, how units (and seeds) are
resampled, and how an interval decides a verdict.

A verdict is one of
    holds          the interval (95%, units resampled) decides for the claim
    contradicted   the interval decides against it
    inconclusive   the interval does not decide, or rests on fewer than
                   loopscope.units.FEWEST_UNITS units
    not shown      the cells or metrics the claim needs are not in this run
A claim of an effect holds when its interval excludes zero in the claimed direction;
a claim of *no* effect holds when its interval lies inside a stated margin. Where a
paper gives a magnitude, the magnitude gets its own verdict beside the direction.

The measuring stages compute the intervals here (they hold the per-token values) and
write them into the metrics files as {"value", "lo", "hi", "units"}; the claims of each
paper (loopscope.paper_a, loopscope.paper_b) read those and apply the rules below. The
measuring stages may import this module, never the claims modules: so rewording a claim
reruns the claims stage and the reports, not the measurements (tests/test_layout.py).
Intervals resample validation units (documents, or blocks of windows: loopscope.units)
and, for a cell trained with several seeds, its seeds (Documents): with one seed an
interval is conditional on that model.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any, Literal

import numpy as np

from loopscope.units import FEWEST_UNITS

# Token types rarer than this share of the typed tokens are not judged: the convergence
# stage sets them apart as rare, and paper B's token-order claim states the floor.
SMALLEST_TYPE = 0.02

Verdict = Literal["holds", "contradicted", "inconclusive", "not shown"]
ALPHA = 0.05  # every interval is a 95% one, before any correction for a family


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

    def interval(self, draws: np.ndarray, family: int = 1) -> Interval:
        """The statistic with its 95% percentile interval over the resamples, and the
        number of units it rests on. family: the number of comparisons the interval is
        one of; the level is then 1 - 0.05 / family (Bonferroni)."""
        tail = ALPHA / 2 / family
        lo, hi = np.nanquantile(draws[1:], [tail, 1 - tail])
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


@decides
def below(iv: Interval, threshold: float) -> Verdict:
    """A claimed value below threshold."""
    if iv.hi < threshold:
        return "holds"
    return "contradicted" if iv.lo >= threshold else "inconclusive"


@decides
def inside(iv: Interval, lo: float, hi: float) -> Verdict:
    """A magnitude within [lo, hi]: holds when the interval lies inside, contradicted
    when it lies wholly outside."""
    if lo <= iv.lo and iv.hi <= hi:
        return "holds"
    return "contradicted" if iv.hi < lo or iv.lo > hi else "inconclusive"


def all_of(verdicts: list[Verdict], corrected: list[Verdict] | None = None) -> Verdict:
    """A claim about every comparison of a family (every cell of a group, every step):
    holds if each holds on its 95% interval (the claim needs all of them, so no
    correction is due), contradicted if one is contradicted, otherwise inconclusive;
    "not shown" with nothing to judge (a claim about every cell of none must not hold).
    corrected: the same comparisons judged on Bonferroni intervals (level 1 - 0.05 / k
    for k comparisons, Documents.interval's family, or `widened`); "contradicted" is
    then read from them, so that one of k chances to fail counts at the 5% level."""
    if not verdicts:
        return "not shown"
    if "contradicted" in (verdicts if corrected is None else corrected):
        return "contradicted"
    return "holds" if all(v == "holds" for v in verdicts) else "inconclusive"


def widened(iv: Interval, family: int) -> Interval:
    """A stored 95% interval at the Bonferroni level for a family of `family`
    comparisons: each side stretched from the estimate by the normal quantile ratio
    z(1 - 0.025 / family) / z(0.975). For intervals whose resamples are not at hand
    (the measuring stages store only the 95% interval)."""
    if family <= 1:
        return iv
    z = NormalDist().inv_cdf
    f = z(1 - ALPHA / 2 / family) / z(1 - ALPHA / 2)
    return Interval(iv.value, iv.value - f * (iv.value - iv.lo),
                    iv.value + f * (iv.hi - iv.value), iv.units)


@dataclass
class Claim:
    """One row of a claims table."""

    claim: str
    paper: str
    criterion: str
    value: str
    verdict: Verdict
    magnitude: Verdict | Literal["n/a"] = "n/a"
    regime: str = ""  # paper B: where the backbones read stand against the paper's regime
    depth_use: str = ""  # paper B: the backbone's useful depth against R
    recipe: str = ""  # the recipe group of paper A's cells the claim is judged in
    resampled: str = ""  # what the interval resamples: units, and seeds per cell
    kind: str = "finding"  # finding: a claim of the paper | check: of the implementation

    def row(self) -> dict[str, str]:
        return asdict(self)


def not_shown(claim: str, paper: str, criterion: str, why: str) -> Claim:
    return Claim(claim, paper, criterion, why, "not shown")


def table(claims: list[Claim]) -> list[dict[str, str]]:
    """Rows for a DataFrame or an HTML table; the regime, depth use, recipe and
    resampled columns only where a claim has one."""
    rows = [c.row() for c in claims]
    for r in rows:
        del r["kind"]  # the table a row sits in says it: findings and checks apart
    for col in ("regime", "depth_use", "recipe", "resampled"):
        if not any(r[col] for r in rows):
            for r in rows:
                del r[col]
    return rows
