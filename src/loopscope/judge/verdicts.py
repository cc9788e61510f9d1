"""Verdict rules: how an interval decides a verdict, and the claims table's record.

A verdict is one of
    holds          the interval (95%, units resampled) decides for the claim
    contradicted   the interval decides against it
    inconclusive   the interval does not decide, or rests on fewer than
                   loopscope.stats.units.FEWEST_UNITS units
    not shown      the cells or metrics the claim needs are not in this run
A claim of an effect holds when its interval excludes zero in the claimed direction;
a claim of *no* effect holds when its interval lies inside a stated margin. Where a
paper gives a magnitude, the magnitude gets its own verdict beside the direction, and a
row's verdict, the one counted, is the two together (`combined`): a record's `verdict`,
with its parts `direction` and `magnitude`.

The family-wise rule, the same for both papers: a claim made of k comparisons (every
control, every step, every token type) holds when each holds on its own 95% interval
(the claim needs all of them, so no correction is due), and is contradicted only when
one is contradicted at the Bonferroni level 1 - 0.05 / k (`decide`), so that one of k
chances to fail counts at the 5% level.

Only the judges import this module (the claims, the reports, the summary): editing how a
verdict is decided reruns no measurement (tests/test_layout.py).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any, Literal

from loopscope.stats.intervals import ALPHA, Interval

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


def canonical(statistic: str) -> str:
    """A comparison's statistic without the cell it is taken in ("perloop_raw: CE(1) -
    CE(K)") or against ("... - the normed cell's"): one statistic over several cells
    ("above every control") is one. A family over steps, loops or pairs names its
    statistic itself (Comparison.of)."""
    out = re.sub(r"^[A-Za-z0-9_+.-]+: ", "", statistic)
    return re.sub(r" - [^()]*'s( \(.*\))?$", "", out)


FAMILY_RULE = ("Bonferroni within a claim: a claim of k comparisons holds when each holds "
               "at 95%, and is contradicted when one is at the level 1 - 0.05 / k")
BANDS: dict[Callable[..., Verdict], Callable[..., tuple[float, float]]] = {
    effect: lambda sign: (0.0, math.inf) if sign > 0 else (-math.inf, 0.0),
    negligible: lambda margin: (-margin, margin),
    at_least: lambda threshold: (threshold, math.inf),
    at_most: lambda threshold: (-math.inf, threshold),
    below: lambda threshold: (-math.inf, threshold),
    inside: lambda lo, hi: (lo, hi),
}


@dataclass(frozen=True)
class Comparison:
    """One comparison a claim makes: the interval of a statistic against a rule
    (effect, negligible, at_least, at_most, below, inside) and its arguments. level:
    the interval at the level of a family of k comparisons (from the resamples where
    they are at hand, else the stored 95% interval widened)."""

    statistic: str
    iv: Interval
    rule: Callable[..., Verdict]
    args: tuple[float, ...]
    level: Callable[[int], Interval] | None = None
    unit: str = ""  # the statistic's own unit: nats, ratio, log10 ratio, loops, share, ...
    paper: float | None = None  # the paper's number on the statistic's scale, where it gives one
    of: str = ""  # the statistic this one is an instance of, where the name does not say

    @property
    def reads(self) -> str:
        """The statistic this comparison reads, whatever cell, step or pair it is taken
        at (`of`, else `canonical(statistic)`): a counted row reads one (the paper's)."""
        return self.of or canonical(self.statistic)

    def at(self, family: int) -> Interval:
        if family <= 1:
            return self.iv
        return self.level(family) if self.level is not None else widened(self.iv, family)

    def verdict(self, family: int = 1) -> Verdict:
        return self.rule(self.at(family), *self.args)

    @property
    def band(self) -> tuple[float, float]:
        """Where the claim holds: the interval must lie inside."""
        return BANDS[self.rule](*self.args)

    def margin(self) -> float:
        """How far inside its band the interval lies, in widths of the interval
        (negative: some of it is outside)."""
        lo, hi = self.band
        width = max(self.iv.hi - self.iv.lo, 1e-300)
        return min(self.iv.lo - lo, hi - self.iv.hi) / width

    def record(self, family: int = 1) -> dict[str, Any]:
        """The comparison as data: its interval at the level of a family of `family`
        comparisons (`level`: 0.95, or 1 - 0.05 / family), and its band."""
        lo, hi = self.band
        iv = self.at(family)
        return {"statistic": self.statistic, "unit": self.unit, "value": iv.value,
                "lo": iv.lo, "hi": iv.hi, "level": 1 - ALPHA / max(family, 1),
                "resampling_units": iv.units, "paper": self.paper,
                "band": [None if math.isinf(lo) else lo, None if math.isinf(hi) else hi]}


def decide(tests: list[Comparison]) -> Verdict:
    """A claim of every comparison in tests, by the family-wise rule (module doc)."""
    return all_of([t.verdict() for t in tests], [t.verdict(len(tests)) for t in tests])


def decisive(tests: list[Comparison]) -> tuple[Comparison, int] | None:
    """The comparison a claim's verdict (decide) turns on, and the family size of the
    level its interval is shown at, the level it was judged at: where the claim is
    contradicted, the first comparison contradicted at the Bonferroni level (its
    interval wholly outside the band at that level); where inconclusive, the first that
    does not hold at 95% (at the Bonferroni level its interval straddles the band: it
    neither holds nor is contradicted); where it holds, the one that holds by the
    narrowest margin, at 95% (inside the band)."""
    if not tests:
        return None
    k = len(tests)
    found = decide(tests)
    if found == "contradicted":
        return next(t for t in tests if t.verdict(k) == "contradicted"), k
    if found == "inconclusive":
        return next(t for t in tests if t.verdict() != "holds"), k
    return min(tests, key=Comparison.margin), 1


def combined(direction: Verdict, magnitude: Verdict | str) -> Verdict:
    """A row's verdict from its parts: holds only where the direction and the magnitude
    both hold, contradicted where either is, otherwise inconclusive (the direction alone
    where the row has no magnitude)."""
    if magnitude in ("n/a", "", None) or direction == "not shown":
        return direction
    both = (direction, magnitude)
    if "contradicted" in both:
        return "contradicted"
    return "holds" if both == ("holds", "holds") else "inconclusive"


Kind = Literal["finding", "extension", "check"]


@dataclass
class Claim:
    """One row of a claims table. In words: the claim, what the paper says (paper_says)
    and where (source), the criterion, ours (value); as data: the comparisons the
    direction and the magnitude are decided on (tests, magnitude_tests: their verdicts,
    by the family-wise rule, are `direction` and `magnitude`; `verdict` is the two
    together, the one counted), kind (finding: a claim of the paper | extension: beyond
    the paper | check: of the implementation)."""

    claim: str
    paper_says: str
    criterion: str
    value: str
    direction: Verdict
    magnitude: Verdict | Literal["n/a"] = "n/a"
    regime: str = ""  # paper B: where the backbones read stand against the paper's regime
    depth_use: str = ""  # paper B: the backbone's useful depth against R
    recipe: str = ""  # the recipe group of paper A's cells the claim is judged in
    resampled: str = ""  # what the interval resamples: units, and seeds per cell
    kind: Kind = "finding"
    key: str = ""  # the claim's stable name within its paper (its id's middle)
    extends: str = ""  # an extension: the key of the finding it stands beside
    source: str = ""  # where the paper says it
    tests: list[Comparison] = field(default_factory=list)
    magnitude_tests: list[Comparison] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # structured fields the stage adds

    @property
    def verdict(self) -> Verdict:
        """The row's verdict, the one counted: direction and magnitude together."""
        return combined(self.direction, self.magnitude)

    def record(self) -> dict[str, Any]:
        """The row as data (tables/claims.json, its JSON Schema in tables/claims.schema.json)."""
        found, mag = decisive(self.tests), decisive(self.magnitude_tests)
        out = {k: v for k, v in asdict(self).items()
               if k not in ("tests", "magnitude_tests", "facts") and (k != "extends" or v)}
        out["verdict"] = self.verdict
        out["estimate"] = found[0].record(found[1]) if found is not None else None
        out["magnitude_estimate"] = mag[0].record(mag[1]) if mag is not None else None
        out["comparisons"] = len(self.tests)
        out["reads"] = sorted({t.reads for t in self.tests + self.magnitude_tests})
        return {**out, **self.facts}


def claim(text: str, paper_says: str, criterion: str, value: str, tests: list[Comparison],
          magnitude: list[Comparison] | None = None, **fields: Any) -> Claim:
    """A row decided on its comparisons by the family-wise rule (decide)."""
    mags = magnitude or []
    return Claim(text, paper_says, criterion, value, decide(tests),
                 decide(mags) if mags else "n/a", tests=tests, magnitude_tests=mags,
                 **fields)


# A seed-level bootstrap over fewer seeds than this has too few distinct draws (two
# seeds: three) to carry training noise: each seed's own judgement decides instead.
FEW_SEEDS = 3
SEED_RULE = (f"with under {FEW_SEEDS} seeds, each seed is judged alone: a part (direction, "
             "magnitude) is decided, holds or contradicted, where every seed alone decides "
             "it that way and the pooled interval does not decide it the other way, "
             "whatever the pooled interval says otherwise; where the seeds do not all "
             "decide it alike, it is inconclusive (every row reading such a cell, both "
             "papers; each seed's interval is shown)")
DECIDED = ("holds", "contradicted")


def by_seeds(pooled: str, each: list[str]) -> str:
    """A part's verdict (direction or magnitude) under the seed rule (SEED_RULE), from
    the pooled verdict and each seed's own. Both ways: seeds deciding alike decide it
    where the pooled interval leaves it open (two seeds give a seed-level bootstrap
    three distinct draws: too few to carry training noise, so the pooled interval is
    not the better evidence), and seeds that do not all decide it alike leave open a
    part the pooled interval decides."""
    if pooled not in (*DECIDED, "inconclusive"):
        return pooled  # not shown, n/a: nothing to decide
    agreed = set(each)
    if len(agreed) == 1 and (seen := next(iter(agreed))) in DECIDED:
        return seen if pooled in (seen, "inconclusive") else "inconclusive"
    return "inconclusive"


def seed_rule(found: Claim, alone: list[Claim], cells: list[str]) -> None:
    """The seed rule, one for both papers (SEED_RULE): where a row reads cells trained
    with 2 to FEW_SEEDS - 1 seeds (cells), its direction and magnitude are decided by
    each seed's own judgement (alone: the same row judged on each seed's run alone),
    both ways: every seed deciding a part alike decides it, seeds that disagree leave
    it open. Each seed's verdicts and decisive intervals are kept (facts), with the
    pooled verdicts, and the value says where the seeds decided."""
    if not cells or not alone:
        return
    pooled = {"direction": found.direction, "magnitude": found.magnitude}
    each = []
    for a in alone:
        rec = a.record()
        each.append({"verdict": a.verdict, "direction": a.direction,
                     "magnitude": a.magnitude, "estimate": rec["estimate"],
                     "magnitude_estimate": rec["magnitude_estimate"]})
    found.direction = by_seeds(found.direction, [a.direction for a in alone])
    if found.magnitude != "n/a":
        found.magnitude = by_seeds(found.magnitude, [a.magnitude for a in alone])
    moved = [part for part in ("direction", "magnitude")
             if getattr(found, part) != pooled[part]]
    found.facts["seeds"] = {"rule": f"under {FEW_SEEDS} seeds each seed is judged alone",
                            "cells": sorted(cells), "pooled": pooled, "each": each,
                            "decided": moved}
    for part in moved:
        seen = "/".join(getattr(a, part) for a in alone)
        what = "" if part == "direction" else "magnitude "
        if getattr(found, part) == "inconclusive":
            found.value += f"; {what}not on each seed alone ({seen})"
        else:
            found.value += (f"; {what}{getattr(found, part)} on each seed alone ({seen}), "
                            f"where the pooled interval is {pooled[part]}")
    seen = "/".join(a.direction for a in alone)
    found.resampled += (f"; under {FEW_SEEDS} seeds ({', '.join(sorted(cells))}): each "
                        f"seed judged alone ({seen})")


def extension(found: Claim, extends: str) -> Claim:
    """A row beyond the paper: shown beside the finding it extends (that finding's key:
    a stricter or broader test of it, ours), never counted."""
    found.kind, found.extends = "extension", extends
    return found


def not_shown(claim: str, paper: str, criterion: str, why: str) -> Claim:
    return Claim(claim, paper, criterion, why, "not shown")


def table(claims: list[Claim]) -> list[dict[str, Any]]:
    """The rows as records (Claim.record)."""
    return [c.record() for c in claims]
