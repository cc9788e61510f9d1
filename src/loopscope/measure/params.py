"""params.yaml's measuring sections: extract, diagnose, convergence, policies, bench.

Declared apart from the claims' and the reports' sections, so a measuring stage reads
and validates its keys without them (loopscope.weights.params). The exit rules' grids
are checked against the rules' data (loopscope.measure.exit_rules.rules) where they are used, so
adding a rule reruns no measurement that does not exit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopscope.weights import params as weights
from loopscope.weights.params import PARAMS, Section, View

Require = Callable[[str, bool, str], None]


def _list(*values: Any) -> Any:
    return field(default_factory=lambda: list(values))


@dataclass
class ExtractConfig(Section):
    """The fixed validation slice whose per-loop hidden states are saved."""

    SECTION = "extract"
    val_sequences: int = 64
    batch_size: int = 16

    def check(self, require: Require) -> None:
        require("val_sequences", self.val_sequences >= 1, ">= 1")
        require("batch_size", self.batch_size >= 1, ">= 1")


@dataclass
class DiagnoseConfig(Section):
    """How much validation text the depth sweep, clamp and timing read, how deep the
    sweep runs, and the resamples behind paper A's intervals."""

    SECTION = "diagnose"
    val_sequences: int = 64
    batch_size: int = 16
    sweep_depth: int = 30  # the depth sweep's deepest depth (at least the cell's K)
    bootstrap: int = 1000  # document resamples behind every paper A interval
    timing_repeats: int = 3  # throughput: rounds (every cell and depth once); median
    timing_windows: int = 32  # throughput: the first this many of the windows are timed

    def check(self, require: Require) -> None:
        for name in ("val_sequences", "batch_size", "timing_repeats", "timing_windows"):
            require(name, getattr(self, name) >= 1, ">= 1")
        require("sweep_depth", 1 <= self.sweep_depth <= 1000, "in [1, 1000]")
        require("bootstrap", self.bootstrap >= 100, ">= 100 (fewer gives unstable intervals)")


@dataclass
class ConvergenceConfig(Section):
    """Paper B's convergence measurements, on every cell."""

    SECTION = "convergence"
    depth_factor: int = 4  # uniform depths 1 .. factor x R, the evaluation depth
    epsilon: float = 1e-3  # a token has converged once KL stays below this
    windows: int = 128  # validation windows per set (3 sets: probe, choose, report)
    useful_share: float = 0.02  # useful depth: within this share of CE(1) - CE(best)
    sensitivity_nats: list[float] = _list(0.001, 0.003, 0.01, 0.02)
    sensitivity_shares: list[float] = _list(0.01, 0.02, 0.05, 0.1)
    # the median convergence loop and the tail recomputed at these KL epsilons too
    sensitivity_epsilons: list[float] = _list(5e-4, 1e-3, 2e-3)
    bootstrap: int = 1000  # resamples of documents behind every interval
    batch_size: int = 16
    # the cells whose final-loop key/value reuse is measured at R and 2R (an outside
    # model's always is): loopscope.measure.trajectory.reuse
    kv_reuse: list[str] = _list()

    def check(self, require: Require) -> None:
        require("depth_factor", self.depth_factor >= 1, ">= 1")
        require("epsilon", self.epsilon > 0, "> 0")
        for name in ("windows", "bootstrap", "batch_size"):
            require(name, getattr(self, name) >= 1, ">= 1")
        require("useful_share", 0 < self.useful_share < 1, "in (0, 1)")
        require("sensitivity_nats", all(v >= 0 for v in self.sensitivity_nats),
                "a list of tolerances >= 0 (nats)")
        require("sensitivity_shares", all(0 < v < 1 for v in self.sensitivity_shares),
                "a list of shares in (0, 1)")
        require("sensitivity_epsilons", all(v > 0 for v in self.sensitivity_epsilons),
                "a list of KL thresholds > 0")


# The rules paper B's counted rows read (A1's KL exit, A2's probe): swept on every seed,
# so the seed rule can read each seed's own numbers
SEEDED_RULES = ("kl", "probe")


@dataclass
class PoliciesConfig(Section):
    """Paper B's depth policies: threshold grids, the matching rule, the check schedule."""

    SECTION = "policies"
    cells: list[str] = _list()  # the cells whose policies are swept (at least one)
    match_nats: float = 0.01  # matched quality: mean CE within this of uniform depth R
    # rule -> thresholds; each grid is checked against the rule's data where it is used
    # (loopscope.measure.exit_rules.rules.check_grid: configure, and the policies stage)
    grids: dict[str, list[float]] = field(default_factory=dict)
    # rules swept on a cell's first seed alone (extensions: their numbers rest on one
    # trained model); the rules paper B's counted rows read (SEEDED_RULES) sweep every seed
    first_seed_only: list[str] = _list()
    first: int = 1  # first loop with a check
    every: int = 1  # loops between checks
    cross_epsilon: float = 1e-3  # A1 on every cell, capped at depth_factor x R
    # the settle-depth oracle's margin version: the prediction also leads the runner-up
    # by this many nats (top-1 minus top-2 log-probability) from its settle loop on
    oracle_margin: float = 1.0
    batch_size: int = 16

    def check(self, require: Require) -> None:
        require("match_nats", self.match_nats > 0, "> 0")
        require("grids", bool(self.grids), "a mapping of at least one rule to its thresholds")
        for name in ("first", "every", "batch_size"):
            require(name, getattr(self, name) >= 1, ">= 1")
        require("cross_epsilon", self.cross_epsilon > 0, "> 0")
        require("oracle_margin", self.oracle_margin >= 0, ">= 0")
        for rule in self.first_seed_only:  # one not in grids is not swept at all
            require("first_seed_only", rule not in SEEDED_RULES,
                    f"rules other than {', '.join(SEEDED_RULES)}, which the counted rows "
                    f"read on every seed (got {rule!r})")


@dataclass
class BenchConfig(Section):
    """The exit benchmark (python -m loopscope.tools.bench exits)."""

    SECTION = "bench"
    cell: str = ""  # the cell timed (one of policies.cells)
    repeats: int = 5  # timed rounds per configuration (>= 3); the median is reported
    decode_tokens: int = 64  # tokens decoded per stream

    def check(self, require: Require) -> None:
        require("repeats", self.repeats >= 3,
                ">= 3 (every mode is a median of interleaved rounds)")
        require("decode_tokens", self.decode_tokens >= 1, ">= 1")


SECTIONS = {**weights.SECTIONS, "extract": (ExtractConfig, None),
            "diagnose": (DiagnoseConfig, None), "convergence": (ConvergenceConfig, None),
            "policies": (PoliciesConfig, None), "bench": (BenchConfig, None)}


def load(reads: Iterable[str], path: str | Path = PARAMS) -> View:
    """The keys a measuring stage reads (weights.params.load)."""
    return weights.load(reads, SECTIONS, path)
