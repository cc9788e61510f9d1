"""Settling, cycling or drifting: each token's late window labelled at the criteria's
thresholds from what the convergence stage measured of it (tables/convergence/<cell>.parquet,
loopscope.measure.trajectory.settling), and the share of each label with its interval.

A token is
    settling  its floor is consistent with none: the lower end of its floor's 95%
              interval at most floor_share x its relative change at D (a fixed point's
              floor is zero; the share allows for a fit that cannot tell a small floor
              from a slow approach), or at most precision_floor float32 epsilons (a
              state at its fixed point to working precision still jitters by a few
              epsilons a loop, its rounding turning back and forth);
    cycling   its floor is above that, and at least alternating_share of its late
              updates point back against the update before (a period-2 cycle turns
              back at every loop, a monotone approach never, uncorrelated steps half
              the time);
    drifting  neither: a floor, with updates that keep their direction.
The measuring stage stores the floors and the alternation; the judge labels, so
changing a threshold (or the late window judged, claims.late_window) reruns the claims
alone. Shares resample the table's documents (first, where its units are blocks within
them) and, where it holds several seeds, the seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from loopscope.base.errors import DataError
from loopscope.judge.backbone import Backbone
from loopscope.judge.criteria import Criteria, criteria_of
from loopscope.judge.verdicts import Claim, Comparison, at_least, below
from loopscope.measure.trajectory.settling import floor_bound
from loopscope.measure.trajectory.token_types import TOKEN_TYPES
from loopscope.stats.intervals import Documents, Interval, Sample

LABELS = ("settling", "cycling", "drifting")
# The key under which the claims stage hands a backbone's per-token table (Tokens) to its
# rows, beside the metrics it read (attach); no metrics file holds it
TOKENS = "tokens"
KINDS = {"settles": "settles (its floor is shown below the tolerance)",
         "on a floor": "sits on a floor (shown above the tolerance)",
         "undecided": "undecided (its floor's interval straddles the tolerance)"}


class Tokens:
    """A cell's per-token table as the claims read it, with its resamples drawn once
    (`sample`): documents (first, where the units are blocks within them: `parent`)
    and, where the table holds several seeds, the seeds. key: the cell's name."""

    def __init__(self, table: pd.DataFrame, resamples: int = 1000, key: str = "") -> None:
        self.table = table.reset_index(drop=True)
        docs = self.table["doc"].to_numpy()
        parent = self.table["parent"].to_numpy() if "parent" in self.table else docs
        seeds = self.table["seed"].to_numpy()
        runs = seeds if len(np.unique(seeds)) > 1 else None
        blocks = None if np.array_equal(parent, docs) else parent
        self.sample = Sample(Documents(docs, resamples, parents=blocks), docs, runs, key)
        self.resamples, self.key = resamples, key

    def seed(self, seed: int) -> Tokens:
        """The tokens of one seed alone (the seed rule judges each seed's own)."""
        return Tokens(self.table[self.table["seed"] == seed], self.resamples, self.key)

    def labels(self, window: str, loops: int, floor_share: float, alternating_share: float,
               rounding: float = 0.0) -> np.ndarray:
        """Each token's label over the late window `window` ("1R") of `loops` loops; a
        floor at most `rounding` (a relative change) is rounding, not motion."""
        t = self.table
        low = floor_bound(t[f"floor_{window}"].to_numpy(np.float64),
                          t[f"floor_se_{window}"].to_numpy(np.float64), loops)
        settled = low <= np.maximum(floor_share * t["change_last"].to_numpy(np.float64),
                                    rounding)
        alternating = t[f"backward_{window}"].to_numpy() >= alternating_share
        return np.where(settled, "settling", np.where(alternating, "cycling", "drifting"))

    def shares(self, labels: np.ndarray, among: np.ndarray | None = None
               ) -> dict[str, np.ndarray]:
        """Per label, its share of the tokens (among: of those marked), per draw."""
        among = np.ones(len(labels), bool) if among is None else among
        n = np.maximum(self.sample.total(among.astype(np.float64)), 1e-300)
        return {k: self.sample.total((labels == k) & among) / n for k in LABELS}


def attach(conv: dict[str, Any], table: pd.DataFrame, resamples: int, key: str
           ) -> dict[str, Any]:
    """A backbone's convergence metrics with its per-token table beside them (TOKENS),
    the whole and, in each seed's own metrics (`per_seed`), that seed's tokens."""
    tokens = Tokens(table, resamples, key)
    out = {**conv, TOKENS: tokens}
    if "per_seed" in conv:
        out["per_seed"] = {name: {**m, TOKENS: tokens.seed(int(name.removeprefix("seed")))}
                           for name, m in conv["per_seed"].items()}
    return out


@dataclass
class Settled:
    """What the fixed-point row reads of one backbone at its criteria: the late window
    judged (its label and the cell's measurements over it: metrics' settling), and the
    share of each label per resample."""

    label: str
    window: dict[str, Any]
    shares: dict[str, np.ndarray]
    sample: Sample
    rounding: float  # a relative change at most this is rounding (rounding())

    @property
    def loops(self) -> str:
        return f"loops {self.window['from']}..{self.window['to']}"

    def interval(self, label: str, family: int = 1) -> Interval:
        return self.sample.interval(self.shares[label], family)

    def share_test(self, b: Backbone) -> Comparison:
        """At least settling_share of the tokens settle."""
        draws = self.shares["settling"]
        return Comparison(f"share of tokens settling ({self.loops})", self.interval("settling"),
                          at_least, (b.p.settling_share,),
                          lambda k: self.sample.interval(draws, k), unit="share")

    def floor_test(self, b: Backbone) -> Comparison:
        """The floor of the mean relative change below floor_share of the mean change at
        D (a fixed point's floor is zero), or below the rounding floor where that is the
        larger share of it (a mean change at working precision has nothing left to
        decay)."""
        last = b.metrics.state_change.get(int(self.window["to"]), 0.0)
        limit = max(b.p.floor_share, self.rounding / last if last > 0 else math.inf)
        return b.test(f"floor of the mean change / mean change at D ({self.loops})",
                      self.window["floor_share"], below, limit, unit="ratio")

    def text(self) -> str:
        """The labels' shares in words."""
        return ", ".join(f"{k} {percent(self.interval(k))}" for k in LABELS)


def _labels(tokens: Tokens, found: dict[str, Any], p: Criteria) -> tuple[str, np.ndarray]:
    """The late window judged at criteria p (its label) and each token's label over it,
    from metrics' `settling` (found). A window not measured is an error naming
    claims.late_window."""
    label = f"{p.late_window:g}R"
    if label not in found["windows"]:
        raise DataError(f"claims.late_window: {label} is not a late window the convergence "
                        f"stage measured ({', '.join(found['windows'])}); measure it "
                        "(loopscope.measure.trajectory.settling.WINDOWS) or judge at one of those")
    w = found["windows"][label]
    return label, tokens.labels(label, w["to"] - w["from"] + 1, p.floor_share,
                                p.alternating_share, rounding(found, p))


def rounding(found: dict[str, Any], p: Criteria) -> float:
    """The relative change below which a floor is rounding: precision_floor epsilons of
    the arithmetic the convergence stage measured in (metrics' settling.eps)."""
    return p.precision_floor * found.get("eps", float(np.finfo(np.float32).eps))


def settled(b: Backbone) -> Settled | None:
    """The backbone's late window at its criteria (claims.late_window) labelled, or None
    where its metrics or its per-token table predate the measurement (rerun the
    convergence stage) or were not handed over."""
    found, tokens = b.conv.get("settling"), b.conv.get(TOKENS)
    if found is None or tokens is None:
        return None
    label, labels = _labels(tokens, found, b.p)
    return Settled(label, found["windows"][label], tokens.shares(labels), tokens.sample,
                   rounding(found, b.p))


def by_type(tokens: Tokens, conv: dict[str, Any], p: Criteria, order: tuple[str, ...]
            ) -> list[dict[str, Any]]:
    """The share of each label among all tokens and within each token type of `order`
    present (rows: type, tokens, then each label's interval), at criteria p and the
    window it judges."""
    _, labels = _labels(tokens, conv["settling"], p)
    types = tokens.table["type"].to_numpy()
    rows = []
    for name in ("all", *[t for t in order if (types == t).any()]):
        among = None if name == "all" else types == name
        shares = tokens.shares(labels, among)
        rows.append({"type": name, "tokens": int(len(types) if among is None else among.sum()),
                     **{k: tokens.sample.interval(v) for k, v in shares.items()}})
    return rows


def kind(b: Backbone) -> str | None:
    """What the backbone's late state does, by the floor of its mean change: "settles",
    "on a floor", or "undecided"; None where it was not measured."""
    found = settled(b)
    if found is None:
        return None
    verdict = found.floor_test(b).verdict()
    return ("settles" if verdict == "holds" else
            "on a floor" if verdict == "contradicted" else "undecided")


def mark_settling(rows: list[Claim], conv: dict[str, dict[str, Any]], backbones: list[str],
                  values: dict[str, float] | Criteria) -> None:
    """The fixed-point row (key state_decay_floor, the extension of state_decay that
    reads the floors) told, at the criteria's values, what each
    backbone's late state does (facts: `settling_kinds`, `differ_in_kind`) and the share
    of each label among its tokens and within each token type (`settling_shares`), and
    in its value where the backbones differ in kind: one settles while the other sits on
    a floor."""
    judged = {c: Backbone(c, conv[c], None, criteria_of(values)) for c in backbones}
    kinds = {c: k for c, b in judged.items() if (k := kind(b)) is not None}
    differ = {"settles", "on a floor"} <= set(kinds.values())
    shares = {c: [{**r, **{k: r[k].to_dict() for k in LABELS}}
                  for r in by_type(b.conv[TOKENS], b.conv, b.p, TOKEN_TYPES)]
              for c, b in judged.items() if c in kinds}
    for row in rows:
        if row.key != "state_decay_floor":
            continue
        row.facts.update(settling_kinds=kinds, differ_in_kind=differ, settling_shares=shares)
        if differ:
            row.value += "; the backbones differ in kind: " + ", ".join(
                f"{n} {KINDS[k]}" for n, k in kinds.items())


def percent(iv: Interval) -> str:
    """A share with its interval: "62.1% [58.0%, 66.3%]"."""
    return f"{iv.value:.1%} [{iv.lo:.1%}, {iv.hi:.1%}]"
