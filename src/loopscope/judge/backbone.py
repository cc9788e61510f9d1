"""Paper B's backbones as its claims read them: a backbone's metrics, its depths (R, m,
E[r]), its useful depth and where that puts it against paper B's regime, as words and as
data, and how its recipe differs from paper B's. The claims are loopscope.judge.paper_b.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from loopscope.judge.criteria import Criteria
from loopscope.judge.metrics_b import ConvergenceMetrics, Elasticity
from loopscope.judge.verdicts import Comparison, widened
from loopscope.stats.intervals import Interval
from loopscope.weights.config import CellConfig

RESULTS = "paper B, results"  # where paper B says it: its summary's sections
FINDINGS = "paper B, contributions"
PAPER_B_SIGMA = 0.5  # paper B's sampler (Huginn's): r = 1 + Poisson(LogNormal(., 0.5))
STATES = {"in": "in the paper's regime", "edge": "at the edge of the paper's regime",
          "outside": "outside the paper's regime"}


@dataclass
class Backbone:
    """What paper B's claims read of one backbone: metrics/convergence/<name>.json and
    metrics/policies/<name>.json (None: its policies were not swept), and the criteria
    its claims are judged at (p)."""

    name: str
    conv: dict[str, Any]
    pol: dict[str, Any] | None = None
    p: Criteria = field(default_factory=lambda: Criteria({"regime": 0.75}))

    @cached_property
    def metrics(self) -> ConvergenceMetrics:
        """Its convergence metrics, typed (loopscope.judge.metrics_b)."""
        return ConvergenceMetrics(self.conv)

    @property
    def r(self) -> int:
        return self.metrics.r

    @property
    def m(self) -> float:
        """The training depth's nominal mean m (paper B's "mean", Huginn's `mean`, the
        depth its evaluation runs; E[r] = m + 1): what the regime is read against."""
        return float(self.conv.get("nominal_mean") or self.r)

    @property
    def depth(self) -> str:
        """The depth the claims compare against, named: R is the evaluation depth, m the
        training sampler's nominal mean (paper B's "mean 8"), E[r] its expectation."""
        mean = self.conv.get("sampler_mean")
        extra = "" if mean is None or mean == self.r else f", m = {self.m:g}, E[r] = {mean:g}"
        return f"R = {self.r} (model.loops{extra})"

    @property
    def useful(self) -> Interval:
        """The useful depth (the share-of-gain rule, loopscope.measure.trajectory.convergence)."""
        return Interval.of(self.metrics.saturation.useful_depth_iv)

    @property
    def useful_shares(self) -> str:
        """The share of resamples at each useful depth, e.g. "5: 62%, 4: 38%"."""
        return shares(self.metrics.saturation.shares)

    @property
    def depth_use(self) -> str:
        """The useful depth with its interval, against R: beside every paper B claim."""
        iv = self.useful
        return f"{self.name}: useful depth {iv.value:g} [{iv.lo:g}, {iv.hi:g}] of R = {self.r}"

    def state(self, useful: Interval | None = None) -> str:
        """Where this backbone stands against paper B's regime, in which useful depth
        equals the training mean: "in" (the useful depth's interval at or above
        p.regime x m), "outside" (below) or "edge" (straddling). useful: another
        useful depth (a row of the sensitivity table)."""
        iv, floor = useful or self.useful, self.p.regime * self.m
        return "in" if iv.lo >= floor else "outside" if iv.hi < floor else "edge"

    def regime(self, useful: Interval | None = None) -> str:
        """The regime mark in words (state); every claim read on the backbone carries
        it, and none excuses its verdict."""
        iv, floor = useful or self.useful, self.p.regime * self.m
        return (f"{STATES[self.state(useful)]} ({self.name}: useful depth {iv.value:g} "
                f"[{iv.lo:g}, {iv.hi:g}] vs {self.p.regime:g} m = {floor:g})")

    def regime_fact(self) -> dict[str, Any]:
        """The regime mark as data: backbone, state, the useful depth and the floor."""
        return {"backbone": self.name, "state": self.state(),
                "useful_depth": self.useful.to_dict(), "floor": self.p.regime * self.m,
                "r": self.r, "m": self.m}

    @property
    def resampled(self) -> str:
        """What the backbone's intervals resample: its units (documents first where they
        are blocks), and its seeds (one seed: conditional on that trained model)."""
        seeds = int(self.conv.get("seeds", 1))
        unit = self.conv.get("unit", "document")
        docs = self.conv.get("documents")
        units = f"{self.name}: {self.conv.get('units', '?')} units ({unit})"
        if docs:
            effect = self.conv.get("design_effect", {}).get("value")
            units += (f", documents resampled first ({docs}; design effect "
                      f"{effect:.2f})" if effect is not None else "")
        return units + (f" x {seeds} seeds" if seeds > 1 else
                        ", one seed: conditional on that trained model")

    def test(self, statistic: str, raw: dict[str, float], rule: Any, *args: float,
             unit: str = "", paper: float | None = None, of: str = "") -> Comparison:
        """A comparison on a stored 95% interval (widened for a family): the statistic's
        unit, the paper's number on its scale where it gives one, and the statistic a
        family's member is an instance of (Comparison.of)."""
        iv = Interval.of(raw)
        return Comparison(statistic, iv, rule, args, lambda k: widened(iv, k), unit, paper,
                          of)

    def at_epsilon(self, epsilon: float) -> Backbone:
        """This backbone with its convergence loop read at another KL epsilon (one the
        convergence stage measured: `by_epsilon`)."""
        found = [c for c in self.conv.get("by_epsilon", [])
                 if math.isclose(float(c["epsilon"]), epsilon, rel_tol=1e-9)]
        if not found:
            raise KeyError(f"{self.name}: no convergence measured at KL epsilon {epsilon:g}")
        return replace(self, conv={**self.conv, "convergence": found[0]})

    def at_tolerance(self, key: tuple[str, float]) -> Backbone:
        """This backbone with its useful depth read at another tolerance of the
        sensitivity table (key: its kind and tolerance)."""
        sat = self.conv["saturation"]
        row = next(r for r in sat["sensitivity"] if (r["kind"], r["tolerance"]) == key)
        return replace(self, conv={**self.conv, "saturation": {
            **sat, "useful_depth_iv": row["useful_depth_iv"]}})


def shares(found: dict[int, float]) -> str:
    """{5: 0.62, 4: 0.38} -> "5: 62%, 4: 38%" (most frequent first)."""
    return ", ".join(f"{k}: {v:.0%}" for k, v in sorted(found.items(), key=lambda kv: -kv[1]))


def recipe_deviation(cfg: CellConfig) -> str:
    """How a backbone's recipe differs from paper B's (the sampler's sigma 0.5, a
    prelude and a coda around the core), or "paper B's" where it does not."""
    t, m = cfg.train, cfg.model
    found = []
    if t.depth_sigma != PAPER_B_SIGMA:
        found.append(f"sampler sigma {t.depth_sigma:g}, not {PAPER_B_SIGMA:g}")
    if not (m.n_prelude and m.n_coda):
        found.append(f"{m.n_prelude} prelude and {m.n_coda} coda blocks (paper B has both)")
    return "; ".join(found) or "paper B's"


# The rows the sampler's sigma moves, measured: docs/depth.md's lever-sigma01 against its
# default (sigma 0.5) moves the tail at R and the useful depth, and with the tail the
# convergence loops' distribution the median is read from
MOVED_BY_SIGMA = ("median_convergence", "tail", "saturation")


def mark_sigma(records: list[dict[str, Any]], configs: dict[str, CellConfig]) -> None:
    """Paper B's records that the sampler's sigma moves (MOVED_BY_SIGMA) told each
    backbone's sigma where it is not paper B's (`sampler_sigma`, and in the value)."""
    for r in records:
        if r["key"] not in MOVED_BY_SIGMA:
            continue
        off = {b: configs[b].train.depth_sigma for b in r.get("backbones", [])
               if b in configs and configs[b].train.depth_sigma != PAPER_B_SIGMA}
        if off:
            r["sampler_sigma"] = off
            r["value"] += ("; trained at sampler sigma " + ", ".join(
                f"{s:g} ({b})" for b, s in off.items()) + f", not paper B's {PAPER_B_SIGMA:g}:"
                " the sigma moves this row (docs/depth.md, lever-sigma01)")


def steps(elasticity: Elasticity) -> dict[int, Interval]:
    """CE(k+1) - CE(k) for each step k < R of a backbone's elasticity."""
    return {k: Interval.of(v) for k, v in elasticity.steps.items()}


def worst_step(elasticity: Elasticity) -> tuple[int, Interval] | None:
    """The step k -> k+1 up to R that helps least (largest CE(k+1) - CE(k)): where
    monotone improvement breaks first, if anywhere. None: no step measured (R = 1)."""
    found = steps(elasticity)
    if not found:
        return None
    k = max(found, key=lambda k: found[k].value)
    return k, found[k]
