"""Verdict rules: how an interval decides a verdict, and the claims table's row.

A verdict is one of
    holds          the interval (95%, units resampled) decides for the claim
    contradicted   the interval decides against it
    inconclusive   the interval does not decide, or rests on fewer than
                   loopscope.measure.units.FEWEST_UNITS units
    not shown      the cells or metrics the claim needs are not in this run
A claim of an effect holds when its interval excludes zero in the claimed direction;
a claim of *no* effect holds when its interval lies inside a stated margin. Where a
paper gives a magnitude, the magnitude gets its own verdict beside the direction.

Only the judges import this module (the claims, the reports, the summary): editing how a
verdict is decided reruns no measurement (tests/test_layout.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any, Literal

from loopscope.measure.intervals import ALPHA, Interval

Verdict = Literal["holds", "contradicted", "inconclusive", "not shown"]


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
