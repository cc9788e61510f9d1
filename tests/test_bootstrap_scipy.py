"""claims' resampling bootstrap against scipy's, on the simplest case both cover: the mean
of values with one value per group (document), where resampling groups is resampling
values. A dev-only check (scipy is in the dev extra, not a runtime dependency); it skips
where scipy is absent.
"""

import math

import numpy as np
import pytest

from loopscope.stats.intervals import Interval, bootstrap, bootstrap_mean

pytest.importorskip("scipy", minversion="1.15")  # bootstrap's rng= argument
from scipy import stats  # noqa: E402

N = 200  # normal draws, one per group
RESAMPLES = 20_000


def claims_mean(values: np.ndarray, groups: np.ndarray) -> Interval:
    return bootstrap_mean(values, groups, RESAMPLES, seed=0)


def claims_ratio_of_sums(values: np.ndarray, groups: np.ndarray) -> Interval:
    """The same mean through bootstrap's summed columns (sum of values / count)."""
    return bootstrap({"v": values, "n": np.ones_like(values)}, groups,
                     lambda s: s["v"] / s["n"], RESAMPLES, seed=0)


@pytest.mark.parametrize("interval", [claims_mean, claims_ratio_of_sums])
def test_the_group_bootstrap_of_a_mean_is_scipys_percentile_interval(interval):
    values = np.random.default_rng(7).normal(1.0, 2.0, N)
    groups = np.arange(N) * 3 + 11  # one value per group; ids need not be 0..N-1
    ours = interval(values, groups)
    theirs = stats.bootstrap((values,), np.mean, n_resamples=RESAMPLES, method="percentile",
                             confidence_level=0.95, rng=np.random.default_rng(1)
                             ).confidence_interval
    assert ours.value == pytest.approx(values.mean(), rel=1e-12)
    assert ours.units == N
    # Tolerance from the Monte Carlo error of a percentile endpoint: the bootstrap
    # distribution of the mean is about normal with sd se = s / sqrt(N), so the
    # 2.5% quantile of B resamples has sd sqrt(p (1 - p) / B) / density, density =
    # phi(1.96) / se: 0.019 se at B = 20,000. The two bootstraps draw independently,
    # so their difference has sd sqrt(2) times that; 4 sd (0.107 se, 0.015 here) is
    # passed by chance by all but about 1 in 16,000 seeds, while a real error
    # (resampling the wrong units, another level, a shifted point) moves an endpoint
    # by a sizeable share of se. (Seen here: 0.0002 and 0.0018.)
    se = values.std(ddof=1) / math.sqrt(N)
    p = 0.025
    density = math.exp(-1.96**2 / 2) / math.sqrt(2 * math.pi) / se
    tolerance = 4 * math.sqrt(2) * math.sqrt(p * (1 - p) / RESAMPLES) / density
    assert ours.lo == pytest.approx(theirs.low, abs=tolerance)
    assert ours.hi == pytest.approx(theirs.high, abs=tolerance)
    # and ours is the textbook mean +- 1.96 se, to its own Monte Carlo error (0.019 se)
    # and the bootstrap's ddof=0 spread (0.25% narrower): well inside 0.21 se
    assert ours.lo == pytest.approx(values.mean() - 1.96 * se, abs=2 * tolerance)
    assert ours.hi == pytest.approx(values.mean() + 1.96 * se, abs=2 * tolerance)
