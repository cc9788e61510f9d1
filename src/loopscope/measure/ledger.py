"""Where the exit runtime's time goes: a ledger of one call's wall time.

The runtime (loopscope.measure.runtime) marks its work with `part`: the loops (the
core's projections, feed-forward and attention), key/value handling (writing the
buffers, gathering the keys of exited tokens, freezing an exited token's later loops),
gathering and scattering the active tokens (and the exit bookkeeping), the exit checks
(a coda and head readout, or a state comparison) and the work done once per token (the
prelude, the final readout). `measure` runs a call under torch's profiler with those
marks on and returns each part's exclusive seconds (a part nested in another counts in
the inner one only), and `rest`: the call's wall time outside every part (Python,
operator launch). Outside `measure` the marks cost nothing (ACTIVE is off).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

PARTS = {"loop": "loops: the core's matmuls and attention",
         "kv": "key/value handling",
         "gather": "gathering and scattering the active tokens, exit bookkeeping",
         "check": "exit checks (head or state)",
         "once": "once per token: prelude and final readout"}
LABEL = "ledger:"
ACTIVE = False  # the marks record only while `measure` runs


def part(name: str) -> contextlib.AbstractContextManager[Any]:
    """Mark a stretch of the runtime's work as part `name` (one of PARTS)."""
    return torch.profiler.record_function(LABEL + name) if ACTIVE else contextlib.nullcontext()


@contextlib.contextmanager
def _marking() -> Iterator[None]:
    global ACTIVE
    ACTIVE = True
    try:
        yield
    finally:
        ACTIVE = False


def _nearest_part(event: Any) -> Any | None:
    """The closest enclosing marked event of a profiler event, if any."""
    parent = event.cpu_parent
    while parent is not None and not parent.name.startswith(LABEL):
        parent = parent.cpu_parent
    return parent


def exclusive_seconds(events: list[Any]) -> dict[str, float]:
    """Each part's seconds from a profile's events: a marked event's time minus that of
    the marked events nested directly inside it."""
    marked = [e for e in events if e.name.startswith(LABEL)]
    inner: dict[int, float] = {}
    for e in marked:
        outer = _nearest_part(e)
        if outer is not None:
            inner[id(outer)] = inner.get(id(outer), 0.0) + e.cpu_time_total
    out = dict.fromkeys(PARTS, 0.0)
    for e in marked:
        out[e.name[len(LABEL):]] += (e.cpu_time_total - inner.get(id(e), 0.0)) / 1e6
    return out


def measure(fn: Callable[[], Any]) -> dict[str, float]:
    """One call of fn (after an untimed one) under the profiler: seconds per part,
    `rest` (the wall time outside every part) and `wall`."""
    fn()
    with _marking(), torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
    parts = exclusive_seconds(prof.events())
    return {**parts, "rest": wall - sum(parts.values()), "wall": wall}
