"""The verdict rules every row is decided by (loopscope.judge.verdicts), the declared
criteria and their specification curve (loopscope.judge.criteria), and the record a row
becomes in tables/claims.json (its schema: tests/test_claims_json.py)."""

import dataclasses

import numpy as np
import pytest

from loopscope.judge import criteria
from loopscope.judge.criteria import Criteria, parameters, specification
from loopscope.judge.params import ClaimsConfig
from loopscope.judge.verdicts import (
    Claim,
    Comparison,
    all_of,
    at_least,
    at_most,
    by_seeds,
    claim,
    combined,
    decide,
    decisive,
    effect,
    inside,
    negligible,
    not_shown,
    seed_rule,
    widened,
)
from loopscope.stats.intervals import Documents, Interval

VALUES = {f.name: getattr(ClaimsConfig(), f.name) for f in dataclasses.fields(ClaimsConfig)}


def test_interval_verdicts():
    assert effect(Interval(1, 0.5, 1.5), +1) == "holds"
    assert effect(Interval(-1, -1.5, -0.5), +1) == "contradicted"
    assert effect(Interval(0.1, -0.5, 0.7), +1) == "inconclusive"
    assert effect(Interval(-1, -1.5, -0.5), -1) == "holds"
    assert negligible(Interval(0, -0.005, 0.005), 0.01) == "holds"
    assert negligible(Interval(0.1, 0.05, 0.15), 0.01) == "contradicted"
    assert negligible(Interval(0.0, -0.02, 0.02), 0.01) == "inconclusive"
    assert at_least(Interval(0.2, 0.15, 0.25), 0.1) == "holds"
    assert at_least(Interval(0.05, 0.0, 0.08), 0.1) == "contradicted"
    assert inside(Interval(1.0, 0.9, 1.1), 0.5, 1.5) == "holds"
    assert inside(Interval(2.0, 1.8, 2.2), 0.5, 1.5) == "contradicted"


def test_a_claim_about_every_cell_of_none_is_not_shown():
    assert all_of([]) == "not shown"
    assert all_of(["holds", "inconclusive"]) == "inconclusive"


def test_a_family_is_contradicted_on_bonferroni_intervals():
    docs = Documents(np.arange(40), 2000)
    draws = docs.mean(np.arange(40), np.random.default_rng(0).normal(0, 1, 40))
    one, four = docs.interval(draws), docs.interval(draws, 4)
    assert four.lo < one.lo and four.hi > one.hi
    iv = Interval(0.0, -1.0, 1.0)
    wide = widened(iv, 4)
    assert wide.hi == pytest.approx(2.4977 / 1.9600, rel=1e-3) and wide.lo == -wide.hi
    assert widened(iv, 1) == iv
    assert all_of(["holds", "contradicted", "holds"]) == "contradicted"
    assert all_of(["holds", "contradicted", "holds"],
                  ["holds", "inconclusive", "holds"]) == "inconclusive"
    assert all_of(["holds", "holds"], ["holds", "inconclusive"]) == "holds"


def test_the_family_rule_turns_a_contradicted_into_inconclusive():
    """Three comparisons; one contradicts at 95% (upper bound -0.01) but its interval
    widened to 1 - 0.05 / 3 crosses zero: the row is inconclusive. Alone, the same
    comparison contradicts."""
    near = Comparison("x", Interval(-0.2, -0.39, -0.01), effect, (1,))
    far = Comparison("y", Interval(1.0, 0.9, 1.1), effect, (1,))
    assert near.verdict() == "contradicted" and near.verdict(3) == "inconclusive"
    assert decide([near]) == "contradicted"
    assert decide([far, near, far]) == "inconclusive"
    assert decide([far, far]) == "holds"


def test_decisive_is_the_comparison_the_verdict_turns_on_at_its_level():
    a = Comparison("a", Interval(1.0, 0.5, 1.5), effect, (1,))  # 1 width inside
    b = Comparison("b", Interval(0.3, 0.1, 0.5), effect, (1,))  # 0.25 widths inside
    c = Comparison("c", Interval(0.0, -0.5, 0.5), effect, (1,))  # open
    assert decisive([a, b]) == (b, 1) and decisive([]) is None  # holds: the narrowest
    assert decisive([a, c, b]) == (c, 3)  # inconclusive: the one left open
    assert b.record()["band"] == [0.0, None] and b.record()["level"] == 0.95
    assert Comparison("d", Interval(0, -1, 1), at_most, (2.0,)).record()["band"] == [None, 2.0]


def test_a_contradicted_row_shows_the_comparison_that_contradicted_at_its_level():
    """The first comparison that fails is left open (its interval straddles 0); the
    second contradicts at the Bonferroni level of the pair. The row shows the second, at
    that level, wholly outside its band: the interval that decided."""
    open_ = Comparison("open", Interval(0.0, -0.5, 0.5), effect, (1,))
    against = Comparison("against", Interval(-1.0, -1.2, -0.8), effect, (1,))
    assert decide([open_, against]) == "contradicted"
    shown, family = decisive([open_, against])
    assert shown is against and family == 2
    rec = claim("t", "p", "c", "v", [open_, against]).record()["estimate"]
    assert rec["statistic"] == "against" and rec["level"] == 1 - 0.05 / 2
    assert rec["hi"] < 0 and rec["lo"] < -1.2  # widened to the pair's level, still outside


def test_the_verdict_is_direction_and_magnitude_together():
    assert combined("holds", "n/a") == "holds"
    assert combined("holds", "holds") == "holds"
    assert combined("holds", "contradicted") == "contradicted"
    assert combined("holds", "inconclusive") == "inconclusive"
    assert combined("contradicted", "holds") == "contradicted"
    assert combined("not shown", "n/a") == "not shown"


def test_every_criteria_parameter_is_declared_with_a_source_and_a_range():
    assert [p.name for p in parameters()] == list(VALUES)  # params.yaml's order too
    for p in parameters():
        assert p.meaning and p.source and len(p.values) >= 2, p.name
    rows = criteria.table(VALUES)
    assert [r["name"] for r in rows] == [p.name for p in parameters()]
    assert all(r["value"] in r["range"] for r in rows)


def test_a_specification_curve_marks_a_row_fragile_with_the_values_that_turn_it():
    iv = Interval(0.008, 0.006, 0.0095)

    def judge(p: Criteria):
        return claim("a step", "", "", "", [Comparison("step", iv, at_most, (p.flat_nats,))])

    found = specification(judge, Criteria(VALUES))
    assert found.direction == "holds"
    rob = found.facts["robustness"]
    assert rob["mark"] == "fragile" and rob["swept"] == {"flat_nats": [0.005, 0.02]}
    assert rob["turns"] == [{"parameter": "flat_nats", "value": 0.005,
                             "verdict": "contradicted"}]
    wide = specification(judge, Criteria({**VALUES, "flat_nats": 0.02}))
    assert wide.facts["robustness"]["turns"][0]["value"] == 0.005
    steady = specification(
        lambda p: claim("x", "", "", "", [Comparison("x", Interval(1, 0.9, 1.1), effect, (1,))]),
        Criteria(VALUES))
    assert steady.facts["robustness"] == {"mark": "not swept", "swept": {}, "turns": []}


def test_a_row_record_carries_its_estimate_band_and_counts():
    tests = [Comparison("a", Interval(1.0, 0.5, 1.5, 40), effect, (1,)),
             Comparison("b", Interval(0.3, 0.1, 0.5, 40), effect, (1,))]
    row = claim("text", "paper", "criterion", "value", tests,
                [Comparison("m", Interval(2.0, 1.5, 2.5, 40), at_least, (1.8,))], key="k")
    rec = row.record()
    assert rec["estimate"] == {"statistic": "b", "unit": "", "value": 0.3, "lo": 0.1,
                               "hi": 0.5, "level": 0.95, "resampling_units": 40,
                               "paper": None, "band": [0.0, None]}
    assert rec["magnitude"] == "inconclusive" and rec["verdict"] == "inconclusive"
    assert rec["comparisons"] == 2 and rec["key"] == "k"
    assert not_shown("t", "p", "c", "why").record()["estimate"] is None



@pytest.mark.parametrize("pooled, each, expected", [
    # seeds that each decide a part alike decide it where the pooled interval is open
    ("inconclusive", ["holds", "holds"], "holds"),
    ("inconclusive", ["contradicted", "contradicted"], "contradicted"),
    ("holds", ["holds", "holds"], "holds"),
    # seeds that do not all decide it alike leave open what the pooled interval decides
    ("holds", ["holds", "inconclusive"], "inconclusive"),
    ("contradicted", ["holds", "contradicted"], "inconclusive"),
    ("inconclusive", ["holds", "inconclusive"], "inconclusive"),
    # seeds against the pooled interval: open
    ("contradicted", ["holds", "holds"], "inconclusive"),
    # nothing to decide
    ("n/a", ["n/a", "n/a"], "n/a"),
    ("not shown", ["holds", "holds"], "not shown"),
])
def test_the_seed_rule_decides_both_ways(pooled, each, expected):
    assert by_seeds(pooled, each) == expected


def _row(value: float, lo: float, hi: float, mag: tuple[float, float, float]) -> Claim:
    """A row of one effect and one magnitude band [0.5, 0.68] on constructed intervals."""
    iv, m = Interval(value, lo, hi, 40), Interval(*mag, 40)
    return claim("c", "p", "k", "v", [Comparison("x", iv, effect, (1,))],
                 [Comparison("x", m, inside, (0.5, 0.68))])


def test_each_seed_contradicting_the_magnitude_contradicts_a_row_the_pooled_interval_leaves_open():
    """The row of B.a1_saves_compute at 1b03d58: each seed alone above the band, the
    pooled interval straddling its edge; the seeds decide it, and their intervals are
    kept beside the pooled verdicts."""
    pooled = _row(0.3, 0.2, 0.4, (0.69, 0.66, 0.72))
    assert (pooled.direction, pooled.magnitude) == ("holds", "inconclusive")
    seeds = [_row(0.3, 0.2, 0.4, (0.70, 0.692, 0.708)), _row(0.3, 0.2, 0.4, (0.70, 0.688, 0.706))]
    seed_rule(pooled, seeds, ["backbone"])
    assert (pooled.direction, pooled.magnitude, pooled.verdict) == (
        "holds", "contradicted", "contradicted")
    record = pooled.facts["seeds"]
    assert record["pooled"] == {"direction": "holds", "magnitude": "inconclusive"}
    assert record["decided"] == ["magnitude"]
    assert [s["magnitude_estimate"]["lo"] for s in record["each"]] == [0.692, 0.688]
    assert "magnitude contradicted on each seed alone" in pooled.value
    # one seed inside the band: the seeds disagree, the pooled verdict is not upgraded
    mixed = _row(0.3, 0.2, 0.4, (0.69, 0.66, 0.72))
    seed_rule(mixed, [seeds[0], _row(0.3, 0.2, 0.4, (0.6, 0.55, 0.65))], ["backbone"])
    assert mixed.magnitude == "inconclusive" and mixed.facts["seeds"]["decided"] == []
