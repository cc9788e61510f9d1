"""The criteria's free parameters, declared: each one's meaning, where its value comes
from (the paper's words, or ours with the reason) and the range the claims sweep.

A verdict that turns on a number nobody can source is a choice, not a finding. So every
claim is judged at params.yaml's values (the `claims:` section) and again at every
other value of each parameter it read (one at a time: a specification curve), and the
row is marked robust (one headline verdict across them) or fragile (the values that
turn it are listed). `Criteria` hands a claim its values and notes which it read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from loopscope.judge.verdicts import Claim, Verdict


@dataclass(frozen=True)
class Parameter:
    """A free parameter of the criteria: its key under `claims:`, what it decides, its
    source, and the values the specification curve tries (params.yaml's value too)."""

    name: str
    meaning: str
    source: str
    values: tuple[float, ...]


PARAMETERS: tuple[Parameter, ...] = (
    Parameter("margin_nats", "a claim of no effect (K-invariance, the clamps) holds inside "
              "+-this (nats)", "ours: 1% of perplexity; the paper says 'nearly K-invariant' "
              "and 'negligible' with no number", (0.005, 0.01, 0.025, 0.05)),
    Parameter("gain_share", "'gains more from depth': the baseline's gain below this share "
              "of the control's", "ours: half; the paper says 'improves clearly' against "
              "'nearly K-invariant'", (0.25, 0.5, 0.75)),
    Parameter("leading_share", "Lemma 2's 'leading order': the radial share of a loop's "
              "update at least this", "ours: a radial move a tenth of the angular one",
              (0.05, 0.1, 0.2)),
    Parameter("tail_factor", "a heavy tail's tokens lie beyond this x the median norm",
              "ours: an order of magnitude; a Gaussian state's norm puts no token there",
              (5.0, 10.0, 20.0)),
    Parameter("tail_share", "a heavy tail: at least this share of tokens beyond the factor",
              "ours: a log-normal puts 0.1% there once its sigma reaches 0.75",
              (0.0005, 0.001, 0.002, 0.005)),
    Parameter("slope_band", "the 1/s law's magnitude: the log-log slope within this of -1",
              "ours: the law says -1 (the paper's Lemma 2)", (0.25, 0.5, 0.75)),
    Parameter("flat_nats", "elasticity and flatness: a CE change of one depth step within "
              "this is no change", "ours: 1% of perplexity; the paper says 'monotone' and "
              "'flat (3.20 nats)'", (0.005, 0.01, 0.02)),
    Parameter("regime", "paper B's regime: useful depth at least this x m",
              "ours: the paper's backbones use their depth ('mean 4 -> 4, 8 -> 8')",
              (0.625, 0.75, 0.875)),
    Parameter("tail_floor", "paper B's tail: at least this share of tokens still "
              "updating at R", "ours: fewer is no tail", (0.01, 0.02, 0.05)),
    Parameter("tail_band", "paper B's tail magnitude: the paper's ~10% within this factor",
              "paper B: '~10%' ('about')", (1.5, 2.0, 3.0)),
    Parameter("kl_factor", "the KL decay's magnitude: within this factor of the paper's "
              "4.66 decades", "paper B: 3.9e-1 at loop 2 -> 8.5e-6 at loop 16",
              (1.25, 1.5, 2.0)),
    Parameter("median_band", "the median loop's magnitude: 0.75 R +- this x R",
              "paper B: 'the median token converges at loop 6' of 8, one loop either side",
              (0.0625, 0.125, 0.25)),
    Parameter("a2_share", "A2 'saves nothing': its mean loops at least this x R",
              "paper B: 7.99 of 8 loops", (0.9, 0.95, 0.99)),
    Parameter("noninferiority_nats", "A1 'matches depth R': CE - CE(R) at most this (nats)",
              "ours: the policies' match_nats", (0.005, 0.01, 0.02)),
    Parameter("floor_decades", "Lemma 1 (a check): the normed radial fraction within this "
              "many decades of RMSNorm's eps floor", "ours", (0.5, 1.0, 2.0)),
    Parameter("contrast_decades", "Lemma 1 (a check): the raw fraction this many decades "
              "above the normed", "paper A: ~1e-2 against ~1e-9", (1.0, 2.0, 3.0)),
)
BY_NAME = {p.name: p for p in PARAMETERS}


class Criteria:
    """The parameters' values a claim is judged at; notes every one read (`read`)."""

    def __init__(self, values: dict[str, float]) -> None:
        self._values, self.read = dict(values), set()

    def __getattr__(self, name: str) -> float:
        values = self.__dict__.get("_values", {})
        if name not in values:
            raise AttributeError(name)
        self.read.add(name)
        return values[name]

    def but(self, name: str, value: float) -> Criteria:
        """The same values with one changed, nothing read yet."""
        return Criteria({**self._values, name: value})

    def fresh(self) -> Criteria:
        return Criteria(self._values)

    def values(self) -> dict[str, float]:
        return dict(self._values)


def table(values: dict[str, float]) -> list[dict[str, Any]]:
    """The declared parameters with the values judged at: claims.json's `parameters`."""
    return [{"name": p.name, "value": values[p.name], "meaning": p.meaning,
             "source": p.source, "range": sorted({*p.values, values[p.name]})}
            for p in PARAMETERS]


def swept(name: str, value: float) -> list[float]:
    """The values the curve tries for a parameter judged at `value`, itself excluded."""
    return [v for v in sorted({*BY_NAME[name].values, value}) if v != value]


def specification(judge: Callable[[Criteria], Claim], criteria: Criteria,
                  extra: Iterable[tuple[str, list[Any], Callable[[Any], Claim]]] = ()
                  ) -> Claim:
    """The claim judged at the criteria's values, and again at every other value of each
    parameter it read (and of each extra: a name, its values, the claim judged at one);
    marked robust when the headline verdict is the same at every one, else fragile, with
    the values that turn it."""
    crit = criteria.fresh()
    found = judge(crit)
    turns: list[dict[str, Any]] = []
    tried: dict[str, list[Any]] = {}
    for name in sorted(crit.read):
        tried[name] = swept(name, getattr(crit, name))
        for value in tried[name]:
            turns += _turn(name, value, judge(criteria.but(name, value)).headline,
                           found.headline)
    for name, values, at in extra:
        tried[name] = list(values)
        for value in values:
            turns += _turn(name, value, at(value).headline, found.headline)
    found.facts["robustness"] = {"mark": "fragile" if turns else "robust", "swept": tried,
                                 "turns": turns}
    return found


def _turn(name: str, value: Any, got: Verdict, was: Verdict) -> list[dict[str, Any]]:
    return [] if got == was else [{"parameter": name, "value": value, "verdict": got}]
