"""params.yaml's recalibrate section: readout recalibration
(loopscope.measure.per_loop.recalibrate).

Declared in a module of its own, beside the other measuring sections rather than among
them (loopscope.measure.params): every measuring stage depends on that module, so a
section added there would rerun every cell's measuring; this one reruns the
recalibration alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from loopscope.measure import params as measure
from loopscope.weights import params as weights
from loopscope.weights.params import PARAMS, Section, View


@dataclass
class RecalibrateConfig(Section):
    """Which cells are recalibrated, how the fits are split from what they are scored
    on, and how hard the affine readout is held to the trained one."""

    SECTION = "recalibrate"
    cells: list[str] = field(default_factory=list)  # an outside model's always is
    folds: int = 2  # the windows' units dealt into this many folds: fit on the others
    # the loops an affine readout is fitted at, as shares of R (0: loop 1, 1: loop R);
    # a temperature is fitted at every loop
    affine_at: list[float] = field(default_factory=lambda: [0.0, 0.5])
    ridge: float = 0.1  # the affine map's penalty: ridge x (||W||^2 + ||b||^2)
    iterations: int = 25  # L-BFGS iterations per affine fit
    bootstrap: int = 1000  # resamples of units (and seeds) behind every interval
    batch_size: int = 16  # windows per readout call

    def check(self, require: Callable[[str, bool, str], None]) -> None:
        require("folds", self.folds >= 2, ">= 2 (a fit is scored on windows it never saw)")
        require("affine_at", all(0.0 <= f <= 1.0 for f in self.affine_at),
                "a list of shares of R in [0, 1]")
        require("ridge", self.ridge >= 0, ">= 0")
        for name in ("iterations", "batch_size"):
            require(name, getattr(self, name) >= 1, ">= 1")
        require("bootstrap", self.bootstrap >= 100, ">= 100 (fewer gives unstable intervals)")

    def affine_loops(self, r: int) -> list[int]:
        """The loops (1 .. r) an affine readout is fitted at, for depth R = r."""
        return sorted({min(r, max(1, round(f * r))) for f in self.affine_at})


SECTIONS = {**measure.SECTIONS, "recalibrate": (RecalibrateConfig, None)}


def load(reads: Iterable[str], path: str | Path = PARAMS) -> View:
    """The keys the recalibration stage reads (weights.params.load)."""
    return weights.load(reads, SECTIONS, path)
