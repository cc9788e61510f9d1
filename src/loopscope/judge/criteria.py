"""The criteria's free parameters, declared: each one's meaning, where its value comes
from (the paper's words, or ours with the reason) and the range the claims sweep.

The declarations are data, criteria.yaml beside this module. A verdict that turns on a
number nobody can source is a choice, not a finding. So every
claim is judged at params.yaml's values (the `claims:` section) and again at every
other value of each parameter it read (one at a time: a specification curve), and the
row is marked robust (one verdict across them) or fragile (the values that
turn it are listed). `Criteria` hands a claim its values and notes which it read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from loopscope.judge.verdicts import Claim, Verdict


@dataclass(frozen=True)
class Parameter:
    """A free parameter of the criteria: its key under `claims:`, what it decides, its
    source, and the values the specification curve tries (params.yaml's value too)."""

    name: str
    meaning: str
    source: str
    values: tuple[float, ...]


SPEC = Path(__file__).with_name("criteria.yaml")  # the declarations, as data
ROWS = Path(__file__).with_name("rows.yaml")  # what each row reads, as data


@functools.cache
def parameters() -> tuple[Parameter, ...]:
    """The declared parameters (criteria.yaml), in its order."""
    raw = yaml.safe_load(SPEC.read_text())
    return tuple(Parameter(name, p["meaning"], p["source"], tuple(map(float, p["values"])))
                 for name, p in raw.items())


@functools.cache
def by_name() -> dict[str, Parameter]:
    return {p.name: p for p in parameters()}


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


@functools.cache
def rows() -> dict[str, dict[str, str]]:
    """What each row reads (rows.yaml): its conditions, statistic and yardstick, by key."""
    return yaml.safe_load(ROWS.read_text())


def declared(key: str, extends: str = "") -> dict[str, str]:
    """A row's declaration (rows.yaml); an extension recomputing a row over every cell
    (key `<row>_every`) reads that row's, over every cell. A row
    without one is an error: every row says what it reads."""
    found = rows().get(key)
    if found is None and extends and key.endswith("_every"):
        found = {**rows()[key.removesuffix("_every")], "conditions": "every"}
    if found is None:
        raise KeyError(f"{ROWS.name}: no declaration for the row '{key}'")
    return dict(found)


def table(values: dict[str, float]) -> list[dict[str, Any]]:
    """The declared parameters with the values judged at: claims.json's `parameters`."""
    return [{"name": p.name, "value": values[p.name], "meaning": p.meaning,
             "source": p.source, "range": sorted({*p.values, values[p.name]})}
            for p in parameters()]


def swept(name: str, value: float) -> list[float]:
    """The values the curve tries for a parameter judged at `value`, itself excluded."""
    return [v for v in sorted({*by_name()[name].values, value}) if v != value]


def specification(judge: Callable[[Criteria], Claim], criteria: Criteria,
                  extra: Iterable[tuple[str, list[Any], Callable[[Any], Claim]]] = ()
                  ) -> Claim:
    """The claim judged at the criteria's values, and again at every other value of each
    parameter it read (and of each extra: a name, its values, the claim judged at one);
    marked robust when the verdict is the same at every one, else fragile, with
    the values that turn it; "not swept" where it read no parameter and had no extra (a
    row with nothing to sweep is not shown to be robust)."""
    crit = criteria.fresh()
    found = judge(crit)
    turns: list[dict[str, Any]] = []
    tried: dict[str, list[Any]] = {}
    for name in sorted(crit.read):
        tried[name] = swept(name, getattr(crit, name))
        for value in tried[name]:
            turns += _turn(name, value, judge(criteria.but(name, value)).verdict,
                           found.verdict)
    for name, values, at in extra:
        tried[name] = list(values)
        for value in values:
            turns += _turn(name, value, at(value).verdict, found.verdict)
    mark = "fragile" if turns else "robust" if any(tried.values()) else "not swept"
    found.facts["robustness"] = {"mark": mark, "swept": tried, "turns": turns}
    return found


def _turn(name: str, value: Any, got: Verdict, was: Verdict) -> list[dict[str, Any]]:
    return [] if got == was else [{"parameter": name, "value": value, "verdict": got}]


def criteria_of(values: dict[str, float] | Criteria) -> Criteria:
    """A judge's own Criteria, nothing read yet: from the one the judging run built
    (loopscope.judge.claims.judge builds it once from params.yaml's claims section), or
    from plain values (a test's)."""
    return values.fresh() if isinstance(values, Criteria) else Criteria(values)
