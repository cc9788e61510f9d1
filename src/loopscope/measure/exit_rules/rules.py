"""The exit rules by name, as data: each rule's default threshold(s), the grid
params.yaml ships for it, whether its threshold counts checks, and whether the exit
benchmark times it.

The one list of rules: the rules' classes (loopscope.measure.exit_rules.exits) take their defaults
from here, params validation checks the grids against it (loopscope.measure.params), and
the exit benchmark times the rules marked `timed`. It holds data only (no torch), so
reading params does not import the rules. Adding a rule: one class in exits.py with
its `name`, one entry here, and its grid under policies.grids in params.yaml
(docs/architecture.md, "Add a depth policy").
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from loopscope.base.errors import ParamsError


def doublings(anchor: float, low: int, high: int) -> tuple[float, ...]:
    """0, then anchor x 2^k for k = low..high: a grid through the default whose steps
    are 2x, down to the conservative end (0: nothing is below it, no token exits)."""
    return (0.0,) + tuple(anchor * 2.0 ** k for k in range(low, high + 1))


@dataclass(frozen=True)
class Rule:
    """An exit rule's data: defaults (the first is `default`; Huginn's for Huginn's
    rules), grid (ascending, through every default, steps of at most 2x), counts (the
    threshold is a number of checks: its conservative end is >= R, not 0), timed (the
    exit benchmark times it at its matched threshold), native (it reads the model's own
    exit score, loopscope.measure.exit_rules.exits.ExitScore: only a model that has one runs it)."""

    defaults: tuple[float, ...]
    grid: tuple[float, ...]
    counts: bool = False
    timed: bool = False
    native: bool = False  # reads the model's own exit score: only where it has one


RULES: dict[str, Rule] = {
    # A1: paper B's KL(p_i || p_prev) < threshold
    "kl": Rule((1e-3,), doublings(1e-3, -6, 7), timed=True),
    # Huginn's KL(p_prev || p_i), the first check against uniform; its first release: 5e-4
    "kl-huginn": Rule((1e-3, 5e-4), doublings(1e-3, -6, 7)),
    # the same KL between min-p filtered distributions
    "minp-kl": Rule((1e-5,), doublings(1e-5, -2, 12)),
    # |H(p_i) - H(p_prev)| < threshold
    "entropy-diff": Rule((1e-3,), doublings(1e-3, -4, 8)),
    # ||h_i - h_prev|| / ||h_i|| < threshold (no head)
    "latent-diff": Rule((0.03,), doublings(0.03, -5, 4), timed=True),
    # 1 - cos(h_i, h_prev) < threshold (no head)
    "cosine": Rule((1e-3,), doublings(1e-3, -6, 6), timed=True),
    # ||(h_i - h_prev) - (h_prev - h_prev2)|| / ||h_i|| < threshold (no head, second order;
    # Huginn's sampler default 0.03, as latent-diff's)
    "latent-acceleration": Rule((0.03,), doublings(0.03, -5, 4), timed=True),
    # the same below the threshold at two checks in a row
    "latent-acceleration-2hit": Rule((0.03,), doublings(0.03, -5, 4)),
    # the argmax unchanged for n checks
    "argmax-stability": Rule((5.0,), (1.0, 2.0, 3.0, 4.0, 5.0, 8.0), counts=True),
    # A2: P(argmax changes later) < threshold, a probe's own decision boundary
    "probe": Rule((0.5,), doublings(0.5, -9, 0)),
    # a model's own exit score (an exit gate): prod (1 - p_exit) < threshold; only on a
    # model that has one (exits.NATIVE), so params.yaml ships no grid for it
    "exit-score": Rule((0.5,), doublings(0.5, -9, 0), native=True),
}
# The rules the exit benchmark times, each at its matched threshold: A1 and the three
# head-free rules of one hit. A2 (probe) matches depth R only by hardly exiting (paper B: no saving;
# 7.99 of 8 loops here), kl-huginn exits where kl does, and minp-kl, entropy-diff and
# argmax-stability pay kl's check while exiting later: timing them would lengthen the
# stage, not answer anything new.
TIMED = tuple(name for name, rule in RULES.items() if rule.timed)


def require(cond: bool, path: str, value: object, rule: str) -> None:
    if not cond:
        raise ParamsError(f"'{path}' is {value!r}; it must be {rule}.")


def check_grid(rule: str, grid: list[float]) -> None:
    """One rule's threshold grid: ascending, steps at most 2x apart, the rule's default(s)
    in it, down to the conservative end (0 for a distance or probability: nothing is
    below it, so no token exits and the rule is uniform depth R), so that a setting
    matching depth R always exists and the matched one lies close to the margin. A count
    rule's end (at least R) needs the cells: loopscope.params.check_policy_cells."""
    path = f"policies.grids.{rule}"
    if rule not in RULES:
        hint = difflib.get_close_matches(rule, list(RULES), n=1)
        raise ParamsError(f"'policies.grids' names an unknown rule '{rule}'."
                          + (f" Did you mean '{hint[0]}'?" if hint else "")
                          + f" Known rules: {', '.join(RULES)} (A0, uniform depth, "
                          "is always measured and has no grid).")
    require(bool(grid), path, grid, "a non-empty list of thresholds")
    require(all(b > a for a, b in zip(grid, grid[1:], strict=False)), path, grid,
            "sorted ascending, without repeats")
    if RULES[rule].counts:
        require(all(v >= 1 and v == int(v) for v in grid), path, grid,
                "whole numbers of stable checks, >= 1")
    else:
        require(grid[0] >= 0, path, grid, "thresholds >= 0")
        require(grid[0] == 0, path, grid,
                "down to 0, the conservative end (nothing is below 0: no token exits, "
                "uniform depth R), so that a setting matching depth R always exists")
    if rule in ("probe", "exit-score"):
        require(grid[-1] < 1, path, grid, "probabilities below 1")
    positive = [v for v in grid if v > 0]
    for a, b in zip(positive, positive[1:], strict=False):
        if b > 2 * a * (1 + 1e-9):
            raise ParamsError(f"'{path}' jumps from {a:g} to {b:g} ({b / a:.3g}x); "
                              "consecutive thresholds must be at most 2x apart, so that the "
                              "matched setting lies close to the matching margin.")
    defaults = RULES[rule].defaults
    for d in defaults:
        if not any(abs(v - d) <= 1e-9 * d for v in grid):
            raise ParamsError(f"'{path}' lacks the rule's default threshold {d:g} "
                              f"(defaults: {', '.join(f'{x:g}' for x in defaults)}); "
                              "add it, so that the default is evaluated.")


def default_grids() -> dict[str, list[float]]:
    """The threshold grids params.yaml ships (a native rule's, for a model that has
    an exit score, is its entry's grid: params.yaml ships none)."""
    return {name: list(rule.grid) for name, rule in RULES.items() if not rule.native}
