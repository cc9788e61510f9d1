"""Paper B's measurements as typed records: metrics/convergence/<cell>.json as the
claims (loopscope.judge.paper_b) and the report (loopscope.render.tables_b) read it, as
paper A's cells are read into loopscope.judge.group_a.CellA.

JSON keys are strings, so the convergence stage stores a per-loop series as
{"k1": v1, "k2": v2, ...}; `by_loop` turns it into {1: v1, 2: v2, ...} here, the one
place a stored loop key is parsed, and every reader indexes loops by int. An interval
stays as stored (value, lo, hi and its units: `Stored`), which
loopscope.judge.verdicts' comparisons and loopscope.stats.intervals.Interval take.
Fields are read when asked for, so a partial metrics file (an older run's, a test's)
fails only where a missing field is read, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

from loopscope.base.errors import DataError

T = TypeVar("T")
Stored = dict[str, Any]  # an interval as stored: value, lo, hi (and units, level)


def by_loop(stored: Mapping[str, T]) -> dict[int, T]:
    """A stored per-loop series {"k1": v, ...} as {1: v, ...}, in loop order."""
    found = {}
    for key, value in stored.items():
        if not (key.startswith("k") and key[1:].isdigit()):
            raise DataError(f"a per-loop series has the key {key!r}; loops are stored as "
                            "k1, k2, ...: rerun the convergence stage")
        found[int(key[1:])] = value
    return dict(sorted(found.items()))


class PerLoop:
    """A per-loop series of a metrics record, read once by its own name through the
    record's _field and keyed by int loop (by_loop): what a cached property per series
    would write out four times."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, record: Any, owner: type | None = None) -> Any:
        if record is None:
            return self
        value = record.__dict__[self.name] = by_loop(record._field(self.name))
        return value


@dataclass(frozen=True)
class Decay:
    """A change between two loops (kl_decay, state_decay): the loops it runs from and
    to, and log10 of the ratio of the means there, with its interval."""

    start: int
    end: int
    log10_ratio: Stored

    @classmethod
    def of(cls, raw: Stored) -> Decay:
        return cls(int(raw["from"]), int(raw["to"]), raw["log10_ratio"])


@dataclass(frozen=True)
class Elasticity:
    """CE against uniform depth: each step CE(k+1) - CE(k) for k < R, the gain CE(1) -
    CE(R), the gain of the second half CE(R/2) - CE(R), the largest |CE(D) - CE(R)| past
    R (and where) and CE(max D) - CE(R)."""

    steps: dict[int, Stored]
    gain: Stored
    half_depth: int
    half_gain: Stored
    flat: Stored
    flat_depth: int
    tail: Stored

    @classmethod
    def of(cls, raw: Stored) -> Elasticity:
        return cls(by_loop(raw.get("steps", {})), raw.get("gain", {}),
                   int(raw.get("half_depth", 0)), raw.get("half_gain", {}),
                   raw.get("flat", {}), int(raw.get("flat_depth", 0)), raw.get("tail", {}))


@dataclass(frozen=True)
class ConvergenceLoop:
    """Where predictions stop moving at one KL epsilon: the median convergence loop and
    A1's median exit loop with the share of resamples at each loop, and the share of
    tokens converging after R."""

    epsilon: float
    median_loop: Stored
    median_loop_shares: dict[int, float]
    median_exit_loop: Stored
    median_exit_loop_shares: dict[int, float]
    share_after_r: Stored

    @classmethod
    def of(cls, raw: Stored) -> ConvergenceLoop:
        return cls(float(raw["epsilon"]), raw.get("median_loop", {}),
                   by_loop(raw.get("median_loop_shares", {})), raw.get("median_exit_loop", {}),
                   by_loop(raw.get("median_exit_loop_shares", {})),
                   raw.get("share_after_r", {}))


@dataclass(frozen=True)
class Tolerance:
    """One row of the useful depth's sensitivity table: the tolerance (in nats, or as a
    share of the gain) and the useful depth there, with its interval."""

    kind: str
    tolerance: float
    useful_depth: Stored

    @property
    def key(self) -> tuple[str, float]:
        return self.kind, self.tolerance


@dataclass(frozen=True)
class Saturation:
    """The useful depth (the share-of-gain rule) with its interval, the share of
    resamples at each depth, the share the rule allows, and the sensitivity table."""

    useful_depth: int
    useful_depth_iv: Stored
    shares: dict[int, float]
    share: float | None
    sensitivity: list[Tolerance]

    @classmethod
    def of(cls, raw: Stored) -> Saturation:
        return cls(int(raw.get("useful_depth", 0)), raw["useful_depth_iv"],
                   by_loop(raw.get("useful_depth_shares", {})), raw.get("share"),
                   [Tolerance(r["kind"], r["tolerance"], r["useful_depth_iv"])
                    for r in raw.get("sensitivity", [])])


class ConvergenceMetrics:
    """metrics/convergence/<cell>.json, typed (module doc). raw: the file as read."""

    def __init__(self, raw: Stored) -> None:
        self.raw = raw

    def _field(self, name: str) -> Any:
        if name not in self.raw:
            raise DataError(f"metrics/convergence has no {name!r}: rerun the convergence "
                            "stage")
        return self.raw[name]

    @property
    def r(self) -> int:
        """The evaluation depth R (model.loops)."""
        return int(self._field("r"))

    @property
    def max_depth(self) -> int:
        return int(self._field("max_depth"))

    ce_at_depth = PerLoop("Mean CE at each uniform depth 1..D.")
    kl = PerLoop("Mean KL(p_i || p_(i-1)) at each loop i >= 2.")
    state_change = PerLoop("Mean relative state change at each loop.")
    angle = PerLoop("Mean angle of each loop's update (radians).")

    @cached_property
    def elasticity(self) -> Elasticity:
        return Elasticity.of(self._field("elasticity"))

    @cached_property
    def kl_decay(self) -> Decay:
        return Decay.of(self._field("kl_decay"))

    @cached_property
    def state_decay(self) -> Decay:
        return Decay.of(self._field("state_decay"))

    @cached_property
    def convergence(self) -> ConvergenceLoop:
        """The convergence loop at convergence.epsilon."""
        return ConvergenceLoop.of(self._field("convergence"))

    @cached_property
    def by_epsilon(self) -> list[ConvergenceLoop]:
        """The convergence loop at each epsilon of convergence.sensitivity_epsilons."""
        return [ConvergenceLoop.of(c) for c in self.raw.get("by_epsilon", [])]

    @cached_property
    def saturation(self) -> Saturation:
        return Saturation.of(self._field("saturation"))

    @property
    def nominal_mean(self) -> float | None:
        """The training sampler's nominal mean m (None: not recorded)."""
        return self.raw.get("nominal_mean")

    @property
    def sampler_mean(self) -> float | None:
        """The training sampler's E[r] (None: not recorded)."""
        return self.raw.get("sampler_mean")

    @cached_property
    def exit_share(self) -> dict[int, float]:
        """The share of tokens A1's KL exit (the cross-analysis's) leaves at each loop."""
        return by_loop(self._field("cross")["exit_share"])


class PolicyMetrics:
    """metrics/policies/<cell>.json's uniform depths, typed: CE and forward FLOPs per
    token at each uniform depth, R, the matched depth and the matching margin."""

    def __init__(self, raw: Stored) -> None:
        self.raw = raw

    @property
    def r(self) -> int:
        return int(self.raw["r"])

    @cached_property
    def uniform_ce(self) -> dict[int, float]:
        return by_loop(self.raw["uniform"]["ce"])

    @cached_property
    def uniform_flops(self) -> dict[int, float]:
        return by_loop(self.raw["uniform"]["flops"])

    @property
    def matched_depth(self) -> int:
        """The smallest uniform depth matching depth R on `report`."""
        return int(self.raw["uniform"]["matched_depth"])

    @property
    def match_target(self) -> float:
        """CE(R) + the matching margin: the CE a policy has to stay under on `report`."""
        return self.uniform_ce[self.r] + float(self.raw["match_nats"])


def threshold_text(q: dict[str, Any]) -> str:
    """A rule's chosen threshold in words (q: its metrics): one, or each seed's own."""
    if "thresholds" in q:
        return ", ".join(f"{t:g} ({seed})" for seed, t in q["thresholds"].items())
    return f"{q['threshold']:g}"
