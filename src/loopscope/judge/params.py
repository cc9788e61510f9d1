"""params.yaml's claims section: the free parameters of the verdicts, read by the claims
stage alone, so a claim's margin changes no measurement (loopscope.weights.params)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from loopscope.measure import params as measure
from loopscope.weights import params as weights
from loopscope.weights.params import PARAMS, Section, View


@dataclass
class ClaimsConfig(Section):
    """The criteria's free parameters."""

    SECTION = "claims"
    margin_nats: float = 0.01  # a claim of no effect holds inside +-this (nats)

    def check(self, require: Callable[[str, bool, str], None]) -> None:
        require("margin_nats", self.margin_nats > 0, "> 0")


# A judge may read the measuring sections too (the resamples behind paper A's intervals,
# diagnose.bootstrap; policies.cells).
SECTIONS = {**measure.SECTIONS, "claims": (ClaimsConfig, None)}


def load(reads: Iterable[str], path: str | Path = PARAMS) -> View:
    """The keys a judging stage reads (weights.params.load)."""
    return weights.load(reads, SECTIONS, path)
