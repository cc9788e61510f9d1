"""The machine a timing was taken on: every timing names its CPU (the CPU differs
between machines, and a ratio taken on one says little of another)."""

from __future__ import annotations

import functools
import platform
from pathlib import Path


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform reports: every timing
    names the machine it was taken on."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
