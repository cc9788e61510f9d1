"""Paper A's frontier: scale control gives a better perplexity/compute frontier, the
finding read at equal FLOPs (the same for cells of one architecture at one depth, and
the same from run to run), and its extension read on the throughput stage's measured
tokens/s, the axis the paper plots.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from loopscope.judge.group_a import RESULTS, CellA, GroupA
from loopscope.judge.verdicts import Claim, claim, effect, extension, not_shown


def frontier(g: GroupA) -> Claim:
    """Paper A: scale control gives a better perplexity/throughput frontier. At equal
    cost (FLOPs per token: model.cost, the same for cells of one architecture at one
    depth) the frontier is the CE at each depth: every per-loop control below the normed
    cell at every depth 1..K (paired). Measured tokens/s stands beside it, flagged
    where it does not fall with depth (timing noise, not a finding)."""
    text = "Scale-controlled variants have a better perplexity/compute frontier"
    if not (g.normed and g.per_loop_controls):
        return not_shown(text, "better frontier", "-", "cells absent")
    loops = g.cells[g.normed].loops
    tests = [g.test(f"{c}: CE({k}) - the normed cell's", g.mean(c, "ce", k)
                    - g.mean(g.normed, "ce", k), effect, -1, unit="nats",
                    of="CE(k) - the normed cell's")
             for c in g.per_loop_controls for k in range(1, loops + 1)]
    holding = [c for c in g.per_loop_controls
               if all(t.verdict() == "holds" for t in tests if t.statistic.startswith(c))]
    n = g.cell(g.normed)
    speed = "; ".join(f"{c}: tokens/s at K {x.tokens_per_s[x.last]:,.0f}"
                      + ("" if _falls_with_depth(x) else " (not falling with depth: noise)")
                      for c, x in ((c, g.cells[c]) for c in [*g.per_loop_controls, g.normed]))
    return claim(
        text, "better frontier",
        "at every depth k = 1..K, the CE of every per-loop scale-controlled cell - the "
        "normed cell's < 0 (paired intervals), at the FLOPs per token of each (model.cost)",
        "CE(K) - the normed cell's: " + ", ".join(
            f"{c} {g.docs.interval(g.mean(c, 'ce') - g.mean(g.normed, 'ce'))}"
            for c in g.per_loop_controls)
        + f"; holds at every depth for: {', '.join(holding) or 'none'}; FLOPs/token at K "
        f"{n.flops_per_token[n.last]:.3g}; {speed}", tests, key="frontier",
        source=f"{RESULTS}: scale-controlled variants occupy 'a superior PPL-throughput "
        "frontier: lower perplexity at the same throughput'")


def frontier_throughput(g: GroupA) -> Claim:
    """Beyond the counted frontier (an extension of frontier): paper A plots perplexity
    against measured throughput. At each depth k of each per-loop control, the normed
    cell's CE at the control's measured tokens/s (its curve over depths 1..K
    interpolated linearly in seconds per token, clamped at its ends: a mix of two
    depths runs at any speed between theirs); the control's CE below it (paired
    intervals). Timing noise counts as the worst pairing of the throughput
    stage's rounds: the control at its slowest round, the normed cell at its fastest at
    every depth. It is an extension, not the finding, because timings differ from run
    to run while FLOPs (the finding's axis) do not."""
    text = "Scale-controlled variants have a better perplexity/throughput frontier"
    paper = "better PPL/throughput frontier"
    crit = ("at every depth k = 1..K of every per-loop scale-controlled cell: its CE - the "
            "normed cell's CE at the same measured tokens/s (interpolated between depths) "
            "< 0 (paired intervals), the control timed at its slowest round and the normed "
            "cell at its fastest")
    if not (g.normed and g.per_loop_controls):
        return extension(not_shown(text, paper, crit, "cells absent"), "frontier")
    n = g.cell(g.normed)
    fastest = _round_speeds(n, max)
    seconds = np.array([1.0 / fastest[k] for k in range(1, n.loops + 1)])
    if np.any(np.diff(seconds) <= 0):
        return extension(replace(Claim(
            text, paper, crit, f"the normed cell's timing does not slow with depth (s/token "
            f"{', '.join(f'{t:.3g}' for t in seconds)}): timing noise, nothing to read",
            "inconclusive"), key="frontier_throughput"), "frontier")
    tests, parts = [], []
    for c in g.per_loop_controls:
        slowest = _round_speeds(g.cell(c), min)
        for k in range(1, g.cells[c].loops + 1):
            j, w = _between(seconds, 1.0 / slowest[k])
            at_speed = ((1 - w) * g.mean(g.normed, "ce", j + 1)
                        + (w * g.mean(g.normed, "ce", j + 2) if w > 0 else 0.0))
            tests.append(g.test(f"{c}: CE({k}) - the normed cell's at its tokens/s",
                                g.mean(c, "ce", k) - at_speed, effect, -1, unit="nats",
                                of="CE(k) - the normed cell's at the same tokens/s"))
        parts.append(f"{c}: {slowest[g.cells[c].loops]:,.0f} tokens/s at K (slowest round)")
    worst = max(tests, key=lambda t: t.iv.hi)
    value = (f"the normed cell at {fastest[n.loops]:,.0f} tokens/s at K (fastest round); "
             + "; ".join(parts) + f"; closest: {worst.statistic} {worst.iv}")
    return extension(claim(text, paper, crit, value, tests, key="frontier_throughput",
                           source=f"{RESULTS}: 'a superior PPL-throughput frontier'"),
                     "frontier")


def _round_speeds(cell: CellA, pick: Callable[[list[float]], float]) -> dict[int, float]:
    """tokens/s of a cell at each depth, one round's per depth (pick: min, the slowest;
    max, the fastest); the median where the rounds were not kept."""
    rounds = cell.speed_rounds or {k: [v] for k, v in cell.tokens_per_s.items()}
    return {k: pick(rounds[f"k{k}"]) for k in range(1, cell.loops + 1)}


def _between(seconds: np.ndarray, t: float) -> tuple[int, float]:
    """Where t (seconds per token) falls on a curve of increasing seconds per depth: the
    index j of the depth below it and the weight w of the next one (clamped at the
    curve's ends: w 0 at its first depth or past its last)."""
    if t <= seconds[0]:
        return 0, 0.0
    if t >= seconds[-1]:
        return len(seconds) - 1, 0.0
    j = int(np.searchsorted(seconds, t, side="right")) - 1
    return j, float((t - seconds[j]) / (seconds[j + 1] - seconds[j]))


def _falls_with_depth(cell: CellA) -> bool:
    """Whether measured tokens/s falls (weakly) from depth 1 to K: a timing that rises
    with depth is noise."""
    speed = [cell.tokens_per_s[f"k{k}"] for k in range(1, cell.loops + 1)
             if f"k{k}" in cell.tokens_per_s]
    return all(a >= b for a, b in zip(speed, speed[1:], strict=False))
