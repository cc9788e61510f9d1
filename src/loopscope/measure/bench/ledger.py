"""Where the exit runtime's time goes: a ledger of one call's wall time.

The runtime (loopscope.measure.bench.runtime) marks its work with `part`: the loops (the
core's projections, feed-forward and attention), key/value handling (writing the
buffers, gathering the keys of exited tokens, freezing an exited token's later loops),
gathering and scattering the active tokens (and the exit bookkeeping), the exit checks
(a coda and head readout, or a state comparison) and the work done once per token (the
prelude, the final readout). `measure` runs a call with those marks on and returns each
part's exclusive seconds (a part nested in another counts in the inner one only), and
`rest`: the call's wall time outside every part (Python, operator launch).

The marks are read by a clock (two perf_counter reads per mark), not by torch's
profiler: the profiler records every operator, and on the committed backbone that
inflated a batch-1 decoding call by 41% and a batched one by 58% over the same call
unprofiled, so its parts described a slower call than the one benchmarked. On CUDA each
mark synchronizes first, so a part is charged with its own kernels. Outside `measure` the
marks cost nothing (ACTIVE is None).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

PARTS = {"loop": "loops: the core's matmuls and attention",
         "kv": "key/value handling",
         "gather": "gathering and scattering the active tokens, exit bookkeeping",
         "check": "exit checks (head or state)",
         "once": "once per token: prelude and final readout"}


@dataclass
class Clock:
    """Exclusive seconds per part. inner: for each open part, the seconds already spent
    in parts nested inside it (taken off its own when it closes)."""

    sync: Callable[[], None] = lambda: None
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    inner: list[float] = field(default_factory=list)


ACTIVE: Clock | None = None  # the marks record only while `measure` runs


@contextlib.contextmanager
def _timed(clock: Clock, name: str) -> Iterator[None]:
    clock.sync()
    clock.inner.append(0.0)
    start = time.perf_counter()
    try:
        yield
    finally:
        clock.sync()
        spent = time.perf_counter() - start
        clock.seconds[name] += spent - clock.inner.pop()
        if clock.inner:
            clock.inner[-1] += spent


def part(name: str) -> contextlib.AbstractContextManager[Any]:
    """Mark a stretch of the runtime's work as part `name` (one of PARTS)."""
    return _timed(ACTIVE, name) if ACTIVE is not None else contextlib.nullcontext()


def measure(fn: Callable[[], Any], device: torch.device | str = "cpu") -> dict[str, float]:
    """One call of fn (after an untimed one) with the marks on: seconds per part, `rest`
    (the wall time outside every part) and `wall`."""
    global ACTIVE
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    fn()
    ACTIVE = clock = Clock(sync)
    try:
        sync()
        start = time.perf_counter()
        fn()
        sync()
        wall = time.perf_counter() - start
    finally:
        ACTIVE = None
    return {**clock.seconds, "rest": wall - sum(clock.seconds.values()), "wall": wall}
