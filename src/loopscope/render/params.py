"""params.yaml's report section, read by the report stages alone."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from loopscope.judge import params as judge
from loopscope.weights import params as weights
from loopscope.weights.params import PARAMS, Section, View


@dataclass
class ReportConfig(Section):
    """How the report notebooks are executed."""

    SECTION = "report"
    timeout_s: int = 600  # a notebook cell's limit (papermill)

    def check(self, require: Callable[[str, bool, str], None]) -> None:
        require("timeout_s", self.timeout_s >= 1, ">= 1")


SECTIONS = {**judge.SECTIONS, "report": (ReportConfig, None)}


def load(reads: Iterable[str], path: str | Path = PARAMS) -> View:
    """The keys a rendering stage reads (weights.params.load)."""
    return weights.load(reads, SECTIONS, path)
