"""params.yaml's claims section: the free parameters of the verdicts, read by the claims
stage alone, so a claim's criterion changes no measurement (loopscope.weights.params).
Each one's meaning, source and the range the claims sweep are loopscope.judge.criteria.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from loopscope.measure import params as measure
from loopscope.weights import params as weights
from loopscope.weights.params import PARAMS, Section, View


@dataclass
class ClaimsConfig(Section):
    """The criteria's free parameters (loopscope.judge.criteria says what each is)."""

    SECTION = "claims"
    margin_nats: float = 0.01  # a claim of no effect holds inside +-this (nats)
    gain_share: float = 0.5  # "gains more": the baseline's gain below this share of a control's
    leading_share: float = 0.1  # Lemma 2's "leading order": a radial share of the update
    tail_factor: float = 10.0  # a heavy tail: tokens beyond this x the median norm
    tail_share: float = 0.001  # ... at least this share of them
    slope_band: float = 0.5  # the 1/s law's magnitude: the slope within this of -1
    flat_nats: float = 0.01  # elasticity and flatness: a change of depth within this is none
    regime: float = 0.75  # paper B's regime: useful depth at least this x m
    tail_floor: float = 0.02  # paper B's tail: at least this share of tokens after R
    tail_band: float = 2.0  # the tail's magnitude: the paper's ~10% within this factor
    kl_factor: float = 1.5  # the KL decay's magnitude: within this factor of the paper's
    median_band: float = 0.125  # the median loop's magnitude: 0.75 R +- this x R
    a2_share: float = 0.95  # A2 saves nothing: at least this share of R's loops
    noninferiority_nats: float = 0.01  # A1 matches depth R: CE - CE(R) at most this
    a1_band: float = 0.0625  # A1's magnitude: mean loops / R within this of the paper's 4.94 / 8
    low_depth: float = 0.5  # paper B's "low depths": mean loops at most this x R
    mean_range: float = 0.75  # paper B's "mean depth range": mean loops at least this x R
    floor_decades: float = 1.0  # Lemma 1 check: the normed fraction within this of its floor
    contrast_decades: float = 2.0  # Lemma 1 check: the raw fraction this above the normed
    late_window: float = 1.0  # the late window judged: the last this x R loops (3R..4R)
    floor_share: float = 0.1  # a floor below this share of the change at D is none
    settling_share: float = 0.9  # "a fixed point": at least this share of tokens settle
    alternating_share: float = 0.75  # a token alternates: this share of updates point back
    period2_ratio: float = 1.0  # period 2: two-step / one-step change below this
    period2_tokens: float = 0.5  # ... and at least this share of tokens' two-step smaller
    precision_floor: float = 10.0  # a floor below this many float32 epsilons is rounding

    def check(self, require: Callable[[str, bool, str], None]) -> None:
        for name in ("margin_nats", "leading_share", "tail_share", "slope_band",
                     "flat_nats", "tail_floor", "median_band", "noninferiority_nats", "a1_band",
                     "floor_decades", "contrast_decades"):
            require(name, getattr(self, name) > 0, "> 0")
        for name in ("gain_share", "regime", "a2_share", "low_depth", "mean_range"):
            require(name, 0 < getattr(self, name) < 1, "in (0, 1)")
        for name in ("tail_factor", "tail_band", "kl_factor"):
            require(name, getattr(self, name) > 1, "> 1 (a factor)")
        for name in ("late_window", "period2_ratio", "precision_floor"):
            require(name, getattr(self, name) > 0, "> 0")
        for name in ("floor_share", "settling_share", "alternating_share", "period2_tokens"):
            require(name, 0 < getattr(self, name) < 1, "in (0, 1)")


# A judge may read the measuring sections too (the resamples behind paper A's intervals,
# diagnose.bootstrap; policies.cells).
SECTIONS = {**measure.SECTIONS, "claims": (ClaimsConfig, None)}


def load(reads: Iterable[str], path: str | Path = PARAMS) -> View:
    """The keys a judging stage reads (weights.params.load)."""
    return weights.load(reads, SECTIONS, path)
