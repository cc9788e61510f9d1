"""Timing side by side, for the benchmarks (loopscope.measure.bench_exits,
loopscope.tools.bench_train).

Timings on a shared machine are noisy, so every number that matters to a benchmark is a
ratio of medians measured in the same run, configurations interleaved: interleaved_rounds
times every job once per round, in an order rotated between rounds, and keeps each
round's seconds. top_ops and top_operators say where a call's time goes (torch.profiler).
Nothing here asserts a speed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


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
    names = list(jobs)
    times: dict[str, list[float]] = {n: [] for n in names}
    for name in names if warm else []:  # warm-up, untimed
        jobs[name]()
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            _sync()
            start = time.perf_counter()
            jobs[name]()
            _sync()
            times[name].append(time.perf_counter() - start)
    return times


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
