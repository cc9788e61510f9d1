"""Intervals: an estimate with its 95% interval, and how units (and seeds) are
resampled to get it.

The measuring stages compute the intervals here (they hold the per-token values) and
write them into the metrics files as {"value", "lo", "hi", "units"}; the judges
(loopscope.judge.verdicts) read those back as Interval and decide verdicts on them.
Intervals resample validation units (documents, or blocks of windows:
loopscope.stats.units) and, for a cell trained with several seeds, its seeds
(Documents): with one seed an interval is conditional on that model.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from loopscope.stats.units import FEWEST_UNITS

ALPHA = 0.05  # every interval is a 95% one, before any correction for a family
# Per-token values with at most this many distinct values (a loop index) take the
# quantile's exact grouped path (Documents._few_valued_quantile)
FEW_VALUES = 256


@dataclass(frozen=True)
class Interval:
    """An estimate with its 95% interval, and how many resampling units (documents, or
    blocks of windows: loopscope.stats.units) it rests on (None: not known)."""

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

    Where the units are blocks of windows within a few documents (parents: the document
    of each token), the resample is nested: documents are drawn with replacement, each
    with all its blocks (_nested_draws), so that the blocks of one document, which share
    its topic and style, are not counted as independent (design_effect says how much
    wider that makes an interval).

    Each method returns an array of draws: index 0 the statistic on the sample itself,
    1.. one per resample (interval turns it into an Interval)."""

    def __init__(self, docs: np.ndarray, resamples: int = 1000, seed: int = 0,
                 parents: np.ndarray | None = None) -> None:
        self.ids = np.unique(docs)
        k = len(self.ids)
        self.seed, self.resamples = seed, resamples
        rng = np.random.default_rng(seed)
        if parents is None:
            draws = rng.multinomial(k, np.full(k, 1.0 / k), size=resamples)
            self.top = k
        else:
            parent = self._parent_of(np.asarray(docs), parents)
            draws = _nested_draws(rng, parent, resamples)
            self.top = len(np.unique(parent))
        self.weights = np.vstack([np.ones(k), draws.astype(np.float64)])
        self._runs: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}

    def _parent_of(self, docs: np.ndarray, parents: np.ndarray) -> np.ndarray:
        """The parent (document) of each unit of self.ids, from aligned arrays; a unit in
        two parents is an error."""
        idx = self._index(docs)
        parent = np.full(len(self.ids), -1, np.int64)
        parent[idx] = np.asarray(parents)
        if not np.array_equal(parent[idx], np.asarray(parents)):
            raise ValueError("a resampling unit lies in two documents")
        return parent

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
        distinct, which = np.unique(values, return_inverse=True)
        if len(distinct) <= FEW_VALUES:
            return self._few_valued_quantile(np.asarray(docs), distinct, which, q, runs, key)
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

    def _few_valued_quantile(self, docs: np.ndarray, distinct: np.ndarray,
                             which: np.ndarray, q: float, runs: np.ndarray | None,
                             key: str) -> np.ndarray:
        """quantile where the values take few distinct values (a loop index): the
        weights summed per (unit, run) and value, then the same first value whose
        cumulative weight reaches q of the total. The weights are whole counts, so the
        sums are exact and the draws equal the token-by-token ones, at a fraction of
        the cost."""
        r, w_run = self._run_weights(runs, key)
        n_runs = w_run.shape[1]
        group = self._index(docs) * n_runs + (r if runs is not None else 0)
        groups, inverse = np.unique(group, return_inverse=True)
        counts = np.zeros((len(groups), len(distinct)))
        np.add.at(counts, (inverse, which), 1.0)
        unit, run = groups // n_runs, groups % n_runs
        out = np.empty(len(self.weights))
        for start in range(0, len(self.weights), 512):
            w = self.weights[start:start + 512][:, unit] * w_run[start:start + 512][:, run]
            cum = np.cumsum(w @ counts, axis=1)
            first = np.argmax(cum >= q * cum[:, -1:], axis=1)
            out[start:start + 512] = distinct[first]
        return out

    def interval(self, draws: np.ndarray, family: int = 1) -> Interval:
        """The statistic with its 95% percentile interval over the resamples, and the
        number of units it rests on. family: the number of comparisons the interval is
        one of; the level is then 1 - 0.05 / family (Bonferroni). The units it rests on
        are what is resampled first: the documents, where blocks within them are the
        units (their count is what decides whether an interval can be trusted)."""
        tail = ALPHA / 2 / family
        lo, hi = np.nanquantile(draws[1:], [tail, 1 - tail])
        return Interval(float(draws[0]), float(lo), float(hi), self.top)


@dataclass(frozen=True)
class Sample:
    """The tokens of one cell as its statistics read them: each token's resampling unit
    (docs) and, where the cell has several trained runs, its run (runs: the seed), with
    the resamples (boot) every statistic of the cell shares, so that differences are
    paired and every interval counts the seeds as well as the documents (Documents)."""

    boot: Documents
    docs: np.ndarray
    runs: np.ndarray | None = None
    key: str = ""  # the cell's name: its run resamples are drawn once per name

    def total(self, values: np.ndarray) -> np.ndarray:
        return self.boot.total(self.docs, values, self.runs, self.key)

    def mean(self, values: np.ndarray) -> np.ndarray:
        return self.boot.mean(self.docs, values, self.runs, self.key)

    def quantile(self, values: np.ndarray, q: float) -> np.ndarray:
        return self.boot.quantile(self.docs, values, q, self.runs, self.key)

    def interval(self, draws: np.ndarray, family: int = 1) -> Interval:
        return self.boot.interval(draws, family)

    @property
    def seeds(self) -> int:
        return 1 if self.runs is None else int(len(np.unique(self.runs)))


def _nested_draws(rng: np.random.Generator, parent: np.ndarray, resamples: int
                  ) -> np.ndarray:
    """Per draw (rows) the times each unit (columns, parent: its document) is drawn when
    documents are drawn with replacement and each drawn document brings all its units:
    a document drawn c times counts each of its blocks c times. The blocks are not
    drawn again within it: a second stage with replacement would count the spread
    within a document twice (it is already in the document means the first stage
    varies), doubling the variance for blocks that are independent after all."""
    docs, inverse = np.unique(parent, return_inverse=True)
    times = rng.multinomial(len(docs), np.full(len(docs), 1.0 / len(docs)), size=resamples)
    return times[:, inverse]


def design_effect(docs: np.ndarray, values: np.ndarray, parents: np.ndarray,
                  resamples: int = 1000) -> float:
    """How much more the mean of per-token values varies when documents are resampled
    before their blocks than when the blocks are resampled as independent units: the
    ratio of the two bootstrap variances (1: the blocks of a document are as good as
    independent)."""
    nested, flat = (Documents(docs, resamples, parents=p) for p in (parents, None))
    return float(np.var(nested.mean(docs, values)[1:]) / np.var(flat.mean(docs, values)[1:]))


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
                   seed: int = 0, runs: np.ndarray | None = None,
                   parents: np.ndarray | None = None) -> Interval:
    """The mean of per-token values, its interval from resampling units (groups) and,
    given each token's run, runs; given each token's document (parents), documents
    first, then their units (Documents)."""
    docs = Documents(groups, resamples, seed, parents)
    return docs.interval(docs.mean(groups, values, runs))


