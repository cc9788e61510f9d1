"""Timing side by side, for the benchmarks (loopscope.measure.bench.bench_exits,
loopscope.tools.bench_train).

Timings on a shared machine are noisy, so every number that matters to a benchmark is a
ratio of medians measured in the same run, configurations interleaved: interleaved_rounds
times every job once per round, in an order rotated between rounds, and keeps each
round's seconds. checked_rounds does the same under a check each round must pass (a round
that fails it is retimed) and adds rounds where they spread (SPREAD). top_ops and
top_operators say where a call's time goes (torch.profiler). Nothing here asserts a speed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm import tqdm

Round = dict[str, float]  # the seconds of each job in one round

# Rounds spread when some job's slowest kept round is more than SPREAD above its fastest
# (max / min > 1 + SPREAD): a median of three then rests on rounds far enough apart that
# one of them moves a ratio of medians by more than the depth check's slack
# (loopscope.measure.bench.bench_exits.DEPTH_SLACK). A spread set is timed for as many rounds
# again, once, so its median rests on twice the rounds.
SPREAD = 0.2


def _sync() -> None:
    """Wait for queued CUDA work, so a job's seconds are its own, not its predecessor's."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def interleaved(jobs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds of each job over interleaved_rounds."""
    return {n: statistics.median(v) for n, v in interleaved_rounds(jobs, repeats).items()}


def interleaved_rounds(jobs: dict[str, Callable[[], Any]], repeats: int, warm: bool = True
                       ) -> dict[str, list[float]]:
    """Seconds of each job in each of `repeats` rounds (after one untimed warm-up call,
    unless the caller has already run every job: warm=False), the jobs interleaved
    within a round and their order rotated between rounds, so drift in the machine's
    speed falls on all of them alike."""
    times: dict[str, list[float]] = {n: [] for n in jobs}
    for job in jobs.values() if warm else []:  # warm-up, untimed
        job()
    for r in range(repeats):
        for name, seconds in timed_round(jobs, r).items():
            times[name].append(seconds)
    return times


def timed_round(jobs: dict[str, Callable[[], Any]], shift: int,
                clock: Callable[[], float] = time.perf_counter) -> Round:
    """One round: each job run once, their order rotated by `shift` (the round's index),
    its seconds by `clock`; keyed in the jobs' own order."""
    names = list(jobs)
    shift %= len(names)
    seconds = {}
    for name in names[shift:] + names[:shift]:
        _sync()
        start = clock()
        jobs[name]()
        _sync()
        seconds[name] = clock() - start
    return {n: seconds[n] for n in names}


@dataclass
class Checked:
    """Rounds timed under a check (checked_rounds): the kept rounds' seconds per job,
    the rounds set aside by a retime, how many kept rounds still failed the check (a
    retime that failed again once the retimes were spent), and whether the rounds spread
    (SPREAD) and were doubled."""

    rounds: dict[str, list[float]]
    retimed: dict[str, list[float]] = field(default_factory=dict)
    failed: int = 0
    extended: bool = False

    @property
    def spread(self) -> float:
        """The largest max / min - 1 of any job's kept rounds."""
        return max((max(v) / min(v) - 1 for v in self.rounds.values()), default=0.0)


def checked_rounds(time_round: Callable[[int], Round], repeats: int,
                   holds: Callable[[Round], bool], bar: tqdm | None = None) -> Checked:
    """`repeats` rounds (time_round(i) times round i, its jobs interleaved), each checked
    by `holds`: a round that fails is set aside and timed again while the set has retimes
    left (as many as `repeats` in all); once they are spent a failing round is kept and
    counted. Where the kept rounds spread (SPREAD), `repeats` more are timed the same
    way, so a set takes at most three times its rounds. `bar` advances a step a round
    timed; its total grows by each retime and by the added rounds."""
    kept: list[Round] = []
    aside: list[Round] = []
    failed = 0

    def grow(by: int) -> None:
        if bar is not None:
            bar.total += by
            bar.refresh()

    def one() -> None:
        nonlocal failed
        while True:
            got = time_round(len(kept) + len(aside))
            if bar is not None:
                bar.update()
            good = holds(got)
            if good or len(aside) >= repeats:
                failed += not good
                kept.append(got)
                return
            aside.append(got)
            grow(1)

    for _ in range(repeats):
        one()
    extended = Checked(_by_job(kept)).spread > SPREAD
    if extended:
        grow(repeats)
        for _ in range(repeats):
            one()
    return Checked(_by_job(kept), _by_job(aside), failed, extended)


def _by_job(rounds: list[Round]) -> dict[str, list[float]]:
    """Rounds as each job's list of seconds."""
    return {n: [r[n] for r in rounds] for n in (rounds[0] if rounds else {})}


def top_ops(fn: Callable[[], Any], n: int = 12) -> list[dict]:
    """Where one call of fn spends its time: the top operators by self CPU time
    (torch.profiler), after one untimed call."""
    fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return top_operators(prof.key_averages(), n)


def top_operators(events: Any, n: int) -> list[dict]:
    """The n operators of a profile (its key_averages) with the most self time, with
    their shares of all operator time."""
    events = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    return [{"op": e.key, "share": e.self_cpu_time_total / total, "calls": e.count}
            for e in events[:n]]
