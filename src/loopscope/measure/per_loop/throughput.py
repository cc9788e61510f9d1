"""Inference tokens/s of every cell at every depth, all cells timed in one process,
interleaved (the throughput stage): the frontier's cost axis, measured."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from loopscope.looped.interface import LoopedModel, h0_rows, run_loops


@dataclass
class Timed:
    """A model to time at inference depths 1..loops over windows x (h0: their initial
    states, None for an embedding state)."""

    model: LoopedModel
    x: torch.Tensor
    loops: int
    h0: torch.Tensor | None = None
    autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext  # the run's


@torch.no_grad()
def throughput(jobs: dict[str, Timed], batch_size: int, rounds: int = 3
               ) -> dict[str, dict[str, list[float]]]:
    """Inference tokens/s of every job at every depth k = 1..loops, each round's:
    {name: {"kK": [v, ...]}} (their median is the figure reported; their spread, the
    timing noise a frontier read on throughput must survive).

    Every (job, depth) pass over its windows is timed once per round, in the same order
    in every round, so all cells are measured under the same machine load, close
    together in time. (Timed in separate processes at different moments, identical
    architectures spread over 36k-46k tokens/s.) A timing: compare within one run, not
    across machines.
    """
    def one_pass(job: Timed, loops: int, n: int) -> None:
        with job.autocast():
            for i in range(0, n, batch_size):
                xb = job.x[i:i + batch_size]
                _, states = run_loops(job.model, xb, loops, h0_rows(job.h0, i, batch_size))
                job.model.read(states[-1], last=True)

    for job in jobs.values():
        job.model.eval()
        one_pass(job, job.loops, batch_size)  # warm-up
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for name, job in jobs.items():
            for loops in range(1, job.loops + 1):
                _sync(job.x.device)
                start = time.perf_counter()
                one_pass(job, loops, len(job.x))
                _sync(job.x.device)
                times.setdefault((name, loops), []).append(time.perf_counter() - start)
    return {name: {f"k{k}": [job.x.numel() / t for t in times[name, k]]
                   for k in range(1, job.loops + 1)} for name, job in jobs.items()}


def _sync(device: torch.device) -> None:
    """Wait for queued CUDA work, so a timer measures the work and not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
