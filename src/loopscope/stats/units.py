"""Resampling units: what every interval resamples.

Per-token values of one document are correlated, so intervals resample whole documents
(the files of a corpus, or the blank-line-separated paragraphs of a splits corpus:
loopscope.weights.data). A corpus of a few long files has too few of them: two files gave
intervals of near-zero width, decided either way. So where the windows measured span
fewer than FEWEST_UNITS documents the unit is a block of consecutive windows within a
document, as long as it takes for adjacent blocks to be nearly uncorrelated
(block_length), and every report says that its units are blocks within so many
documents. A claim resting on fewer than FEWEST_UNITS units is inconclusive whatever its
interval (loopscope.judge.verdicts.decides). Every metrics file with intervals records its unit
and their count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FEWEST_UNITS = 10  # an interval resting on fewer units decides nothing
MIN_UNITS = 30  # paper B's sets: documents, else blocks, aiming at this many (runs.py)
LAG1_MAX = 0.1  # adjacent block means at most this correlated count as independent
SMALLEST_PAIRS = 4  # fewer adjacent pairs measure no correlation: stop lengthening


@dataclass(frozen=True)
class Units:
    """The resampling unit of each window (ids), what a unit is (name) and, where the
    units are blocks within documents, the document of each window (parents: an
    interval then resamples documents first, loopscope.stats.intervals.Documents)."""

    ids: np.ndarray
    name: str
    parents: np.ndarray | None = None

    def describe(self) -> dict[str, int | str]:
        """The unit and its count (and the documents they lie in, for blocks), for every
        metrics file that holds intervals."""
        out: dict[str, int | str] = {"unit": self.name, "units": int(len(np.unique(self.ids)))}
        if self.parents is not None:
            out["documents"] = int(len(np.unique(self.parents)))
        return out


def resampling_units(docs: np.ndarray, starts: np.ndarray, values: np.ndarray,
                     fewest: int = FEWEST_UNITS) -> Units:
    """The units of windows starting at `starts` in documents `docs`: the documents
    when there are at least `fewest` of them, otherwise blocks of consecutive windows,
    never crossing a document's end, as long as block_length finds on the per-window
    `values` (window_surprisal: the same for every cell and seed, so the cells'
    intervals stay paired on the same units). Paper B's sets ask for MIN_UNITS: its
    integer statistics (useful depth, median loop) need more units than a mean does to
    vary between resamples."""
    n_docs = len(np.unique(docs))
    if n_docs >= fewest:
        return Units(np.asarray(docs), "document")
    per, r = block_length(docs, starts, values)
    what = f"block of {per} windows" if per > 1 else "window"
    lag = "" if np.isnan(r) else f", lag-1 autocorrelation {r:.2f}"
    return Units(blocks(docs, starts, per), f"{what} within {n_docs} documents{lag}",
                 np.asarray(docs))


def block_length(docs: np.ndarray, starts: np.ndarray, values: np.ndarray
                 ) -> tuple[int, float]:
    """The shortest block (1, 2, 4, ... windows) whose adjacent block means within a
    document have a lag-1 autocorrelation at most LAG1_MAX, or within two standard
    errors (2 / sqrt(pairs)) of zero; with it, that autocorrelation. Windows of one
    text are correlated (its topic drifts slowly), so blocks resampled as if
    independent would understate the spread; a block long enough that its neighbour
    tells little about it is nearly independent. Lengthening stops when fewer than
    SMALLEST_PAIRS adjacent pairs remain: the longest blocks then, few as they may be
    (fewer than FEWEST_UNITS decide nothing)."""
    per = 1
    while True:
        r, pairs = lag1(docs, starts, values, per), _pairs(docs, starts, per)
        independent = not r > max(LAG1_MAX, 2 / np.sqrt(max(pairs, 1)))  # nan: no spread
        if independent or _pairs(docs, starts, 2 * per) < SMALLEST_PAIRS:
            return per, r
        per *= 2


def _block_docs(docs: np.ndarray, starts: np.ndarray, per: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """The block id of each window (blocks of `per`) and the document of each block."""
    ids = blocks(docs, starts, per)
    block_doc = np.zeros(ids.max() + 1 if len(ids) else 0, np.int64)
    block_doc[ids] = np.asarray(docs)
    return ids, block_doc


def _pairs(docs: np.ndarray, starts: np.ndarray, per: int) -> int:
    """Adjacent pairs of blocks of `per` windows within one document."""
    block_doc = _block_docs(docs, starts, per)[1]
    return int(np.sum(block_doc[1:] == block_doc[:-1]))


def lag1(docs: np.ndarray, starts: np.ndarray, values: np.ndarray, per: int) -> float:
    """The lag-1 autocorrelation of the means of blocks of `per` windows: the Pearson
    correlation of each block's mean with the next block's in the same document
    (nan with fewer than two such pairs or no spread)."""
    ids, block_doc = _block_docs(docs, starts, per)
    n = len(block_doc)
    means = np.bincount(ids, np.asarray(values, np.float64), n) / np.bincount(ids, None, n)
    same = block_doc[1:] == block_doc[:-1]
    a, b = means[:-1][same], means[1:][same]
    if len(a) < 2 or a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def window_surprisal(tokens: np.ndarray, starts: np.ndarray, context: int) -> np.ndarray:
    """Each window's mean surprisal -log p(t) under the unigram frequencies of
    `tokens`: a per-window value every cell and seed shares (the same windows, the same
    tokens), whose drift along a text follows its topic as a model's loss does."""
    tokens = np.asarray(tokens)
    counts = np.bincount(tokens)
    surprisal = -np.log(counts / counts.sum(), where=counts > 0,
                        out=np.zeros(len(counts)))
    at = np.asarray(starts)[:, None] + np.arange(context)[None, :]
    return surprisal[tokens[at]].mean(axis=1)


def blocks(docs: np.ndarray, starts: np.ndarray, per: int) -> np.ndarray:
    """Ids of runs of `per` consecutive windows (in start order) within each document."""
    order = np.argsort(starts, kind="stable")
    d = np.asarray(docs)[order]
    n = len(d)
    first = np.r_[True, d[1:] != d[:-1]] if n else np.zeros(0, bool)
    rank = np.arange(n) - np.maximum.accumulate(np.where(first, np.arange(n), 0))
    ids = np.empty(n, np.int64)
    ids[order] = np.cumsum(first | (rank % per == 0)) - 1
    return ids
