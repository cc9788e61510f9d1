"""Fixed point, floor or cycle: what each token's state does over the late window of a
uniform-depth trajectory (loopscope.measure.trajectory.trajectories), the loops after the
prediction has long stopped improving.

Paper B reads a decaying state change as "a fixed point, not a cycle". A change can
decay and still level off at a floor above zero (the state keeps moving by a fixed
amount, forever), and a floor can be a cycle (the state returns every second loop) or a
drift. So over each late window (the last `length` x R loops, ending at the deepest
depth measured D: WINDOWS; the claims judge 3R..4R by default) this module measures, per
token:

- the floor c of the relative state change, fitted as c + a rho^j (j = 0.. the loops
  into the window): ordinary least squares on (1, rho^j) at every rho of a grid, the
  rho with the smallest residual kept, and c's standard error from the residual (three
  parameters fitted, so n - 3 degrees of freedom; fit_floor);
- the share of its late updates that point back against the update before (the
  trajectory's `backward`: cosine < 0): a period-2 cycle reverses every update, a
  monotone approach none, uncorrelated steps about half;
- the KL's odd/even alternation: log10 of the KL at odd loops over that at even
  loops, with a log-linear trend removed (alternation).

The cell's metrics carry, per window, the same of the document-resampled mean curves
(the floor of the mean relative change and its share of the mean change at D, the mean
KL's alternation), each with its 95% interval, and the machine epsilon of the float32
arithmetic the changes were computed in: a state at its fixed point to working
precision still moves by a few epsilons a loop, a floor the claims do not count. Which
token is settling, cycling or drifting is the claims' to say (loopscope.judge.settling):
the thresholds are criteria, so changing one reruns no measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Protocol

import numpy as np

from loopscope.base.errors import ParamsError
from loopscope.stats.intervals import ALPHA, Sample

RHO = np.round(np.arange(0.02, 1.0, 0.01), 2)  # the decay rates tried, 0.02 .. 0.99
FEWEST_LOOPS = 4  # a floor, an amplitude and a rate leave one degree of freedom
# The late windows measured, in R: the claims judge at one of them (claims.late_window,
# 1R: loops 3R..4R of the 4R trajectory) and sweep the others. Measuring all three costs
# a few fits, not a rerun when the claims' choice changes; every value the criteria
# sweep must be here (tests/test_settling.py).
WINDOWS = (1.0, 1.5, 2.0)


class Trajectory(Protocol):
    """What this module reads of a trajectory (loopscope.measure.trajectory.trajectories.Trajectory,
    not imported: the judges read this module's bounds and import no torch)."""

    change: np.ndarray
    change2: np.ndarray
    kl: np.ndarray
    backward: np.ndarray

    @property
    def depth(self) -> int: ...


@dataclass(frozen=True)
class Window:
    """A late window: its length in R (as declared) and its loops first..last (1-based,
    last = D, the deepest depth measured; first no earlier than loop 2, the first with
    an update before it)."""

    length: float
    first: int
    last: int

    @property
    def label(self) -> str:
        """The window's name in the table's columns and the metrics: "1R", "1.5R"."""
        return f"{self.length:g}R"

    @property
    def loops(self) -> int:
        return self.last - self.first + 1

    @property
    def rows(self) -> slice:
        """The trajectory's rows (loop i is row i - 1) of the window."""
        return slice(self.first - 1, self.last)


def windows(r: int, depth: int, lengths: tuple[float, ...] = WINDOWS) -> list[Window]:
    """The late windows of a trajectory to depth `depth` of a cell read at R = r: each
    the last round(length x R) + 1 loops (1R: loops D - R .. D), from loop 2 at the
    earliest. A window too short for the floor's fit is a ParamsError naming
    convergence.depth_factor, raised before any compute is spent."""
    out = []
    for length in lengths:
        first = max(depth - int(length * r + 0.5), 2)
        if depth - first + 1 < FEWEST_LOOPS:
            raise ParamsError(
                f"convergence.depth_factor: the {length:g}R late window of a cell with "
                f"R = {r} read to depth {depth} spans {max(depth - first + 1, 0)} loops; "
                f"the floor's fit needs at least {FEWEST_LOOPS}: raise the factor")
        out.append(Window(float(length), first, depth))
    return out


def fit_floor(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The floor of each column of y (n loops, m curves) fitted as c + a rho^j, j =
    0..n-1: at each rho of RHO the least-squares (c, a), and the rho with the smallest
    residual kept. Returns (c, its standard error, rho), each (m,). The standard error
    is the least-squares one at the chosen rho with the residual variance over n - 3
    (rho was fitted too); a constant curve (a floor with nothing above it) gets a = 0
    at every rho, and its c is exact."""
    y = np.asarray(y, dtype=np.float64)
    n = len(y)
    if n < FEWEST_LOOPS:
        raise ValueError(f"a floor's fit needs at least {FEWEST_LOOPS} loops, got {n}")
    j = np.arange(n, dtype=np.float64)
    best = np.full(y.shape[1:], np.inf)
    c, scale, rho = np.zeros_like(best), np.zeros_like(best), np.zeros_like(best)
    for q in RHO:
        x = np.stack([np.ones(n), q ** j], axis=1)
        inv = np.linalg.inv(x.T @ x)
        beta = inv @ (x.T @ y)
        rss = ((y - x @ beta) ** 2).sum(axis=0)
        better = rss < best
        best = np.where(better, rss, best)
        c = np.where(better, beta[0], c)
        scale = np.where(better, math.sqrt(inv[0, 0]), scale)
        rho = np.where(better, q, rho)
    return c, np.sqrt(best / (n - 3)) * scale, rho


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile: exact for 1 and 2 degrees of freedom, the Cornish-Fisher
    expansion in 1/df beyond (Abramowitz and Stegun 26.7.5; within 0.3% at df = 3 for
    p = 0.975, closer with more)."""
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    g = ((z ** 3 + z) / 4, (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
         (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
         (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160)
    return z + sum(gk / df ** (k + 1) for k, gk in enumerate(g))


def floor_bound(floor: np.ndarray, se: np.ndarray, loops: int) -> np.ndarray:
    """The lower end of each token's 95% interval of its floor (t with loops - 3 degrees
    of freedom): a floor "consistent with zero" has it at or below zero."""
    return floor - t_quantile(1 - ALPHA / 2, loops - 3) * se


def alternation(kl: np.ndarray, first: int) -> np.ndarray:
    """Per column of kl (a window's loops in rows, the first of them loop `first`), the
    KL's odd/even alternation: the mean over the window's inner loops k of
    s_k (log10 KL_k - (log10 KL_(k-1) + log10 KL_(k+1)) / 2), s_k = +1 at odd loops and
    -1 at even ones. A log-linear trend cancels; a pure alternation KL_odd / KL_even = q
    on any such trend gives exactly log10 q. A column with a KL of zero in the window
    (predictions identical to float precision) has none: nan."""
    kl = np.asarray(kl, dtype=np.float64)
    zero = (kl <= 0).any(axis=0)
    log = np.log10(np.where(kl > 0, kl, 1.0))
    inner = log[1:-1] - (log[:-2] + log[2:]) / 2
    loops = np.arange(first + 1, first + len(kl) - 1)
    sign = np.where(loops % 2 == 1, 1.0, -1.0).reshape((-1,) + (1,) * (kl.ndim - 1))
    return np.where(zero, np.nan, (sign * inner).mean(axis=0))


def token_columns(traj: Trajectory, r: int) -> dict[str, np.ndarray]:
    """The per-token columns of tables/convergence/<cell>.parquet, for each late window
    of WINDOWS (suffix: its label, "_1R"): floor_ (the fitted floor c of the relative change),
    floor_se_ (its standard error), backward_ (the share of the window's updates that
    point back) and kl_alternation_ (log10 odd / even); and change_last, the relative
    change at D, the scale a floor is judged against."""
    out = {"change_last": traj.change[-1].astype(np.float32)}
    for w in windows(r, traj.depth):
        c, se, _ = fit_floor(traj.change[w.rows])
        out[f"floor_{w.label}"] = c.astype(np.float32)
        out[f"floor_se_{w.label}"] = se.astype(np.float32)
        out[f"backward_{w.label}"] = traj.backward[w.rows].mean(axis=0).astype(np.float32)
        out[f"kl_alternation_{w.label}"] = alternation(traj.kl[w.rows],
                                                            w.first).astype(np.float32)
    return out


def _means(sample: Sample, rows: np.ndarray) -> np.ndarray:
    """The resampled mean of each row of a (loops, tokens) array: (loops, draws)."""
    return np.stack([sample.mean(row) for row in rows])


def summarize(sample: Sample, traj: Trajectory, r: int) -> dict[str, Any]:
    """metrics/convergence/<cell>.json's `settling`: per late window (by label) its
    loops, and from the mean curves of every document resample, each with its 95%
    interval: the floor of the mean relative change (c of c + a rho^j; rho: the point
    fit's), the floor's share of the mean change at D, the mean KL's odd/even
    alternation (log10), the mean share of updates pointing back, and the mean two-step
    change over the mean one-step change (a period-2 cycle below 1, a monotone approach
    about 2, uncorrelated steps about sqrt 2)."""
    iv = sample.interval
    found: dict[str, Any] = {}
    for w in windows(r, traj.depth):
        one = _means(sample, traj.change[w.rows])  # (loops, draws)
        c, _, rho = fit_floor(one)
        kl = _means(sample, np.nan_to_num(traj.kl[w.rows]))
        two = _means(sample, traj.change2[w.rows])
        found[w.label] = {
            "length_r": w.length, "from": w.first, "to": w.last,
            "floor": iv(c).to_dict(), "rho": float(rho[0]),
            "floor_share": iv(c / one[-1]).to_dict(),
            "kl_alternation": iv(alternation(kl, w.first)).to_dict(),
            "backward_share": iv(sample.mean(traj.backward[w.rows].mean(axis=0)))
            .to_dict(),
            "two_step_ratio": iv(two.mean(axis=0) / one.mean(axis=0)).to_dict()}
    # the machine epsilon of the arithmetic the change was computed in (float32): a state
    # at its fixed point to working precision still moves by a few of these a loop
    return {"windows": found, "rho_grid": [float(RHO[0]), float(RHO[-1])],
            "eps": float(np.finfo(np.float32).eps)}
