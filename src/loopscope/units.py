"""Resampling units: what every interval resamples.

Per-token values of one document are correlated, so intervals resample whole documents
(the files of a corpus, or the blank-line-separated paragraphs of a splits corpus:
loopscope.data). A corpus of a few long files has too few of them: two files gave
intervals of near-zero width, decided either way. So where the windows measured span
fewer than FEWEST_UNITS documents the unit is a block of consecutive windows within a
document, sized to give at least MIN_UNITS; and a claim resting on fewer than
FEWEST_UNITS units is inconclusive whatever its interval (loopscope.stats.decides).
Every metrics file with intervals records its unit and their count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FEWEST_UNITS = 10  # an interval resting on fewer units decides nothing
MIN_UNITS = 30  # blocks are sized to give at least this many


@dataclass(frozen=True)
class Units:
    """The resampling unit of each window (ids) and what a unit is (name)."""

    ids: np.ndarray
    name: str

    def describe(self) -> dict[str, int | str]:
        """The unit and its count, for every metrics file that holds intervals."""
        return {"unit": self.name, "units": int(len(np.unique(self.ids)))}


def resampling_units(docs: np.ndarray, starts: np.ndarray) -> Units:
    """The units of windows starting at `starts` in documents `docs`: the documents
    when there are at least FEWEST_UNITS of them, otherwise blocks of
    len(starts) // MIN_UNITS consecutive windows that never cross a document's end."""
    if len(np.unique(docs)) >= FEWEST_UNITS:
        return Units(np.asarray(docs), "document")
    per = max(1, len(starts) // MIN_UNITS)
    return Units(blocks(docs, starts, per), f"block of {per} windows" if per > 1 else "window")


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
