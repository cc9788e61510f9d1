"""Disk space, checked before compute is spent: a full disk mid-run is caught anyway
(loopscope.base.files), but only after the compute that produced the output, and a full
disk under a memmap ends the process with SIGBUS instead of an error.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from loopscope.base.errors import ResourceError

FILE_OVERHEAD = 1 << 20  # torch.save's zip records, the config, the summary: < 1 MiB


def format_bytes(n: int) -> str:
    """A size for a message: 1.5 GiB, 42.0 MiB, 512 B."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} B"


def require_disk(needs: dict[Path, int], todo: str) -> None:
    """Check, before writing outputs whose size grows with params, that each file
    system has room for what is written to it (bytes per path, summed per file system).

    A full disk mid-run is caught anyway (atomic_write_bytes, `run`), but only after the
    compute that produced the output; and a full disk under a memmap kills the process
    with SIGBUS instead of an error. todo: what to lower or do, for the message.
    """
    groups: dict[int, tuple[list[Path], int, int]] = {}
    for path, n in needs.items():
        where = Path(path)
        while not where.exists() and where != where.parent:
            where = where.parent  # the folder the output will be created in
        device = os.stat(where).st_dev
        names, total, free = groups.get(device, ([], 0, shutil.disk_usage(where).free))
        groups[device] = ([*names, Path(path)], total + n, free)
    for names, total, free in groups.values():
        if total > free:
            raise ResourceError(
                f"{' and '.join(map(str, names))}: needs about {format_bytes(total)} of disk "
                f"space, but its file system has {format_bytes(free)} free. {todo}")


def model_file_bytes(n_params: int) -> int:
    """About the size of a model file of n_params fp32 weights (for the disk check)."""
    return n_params * 4 + FILE_OVERHEAD


def resume_file_bytes(n_params: int, processes: int = 1) -> int:
    """About the size of a resume checkpoint: weights and AdamW's two moments in fp32,
    the RNG states of every process, the logged rows."""
    return n_params * 4 * 3 + processes * (1 << 16) + FILE_OVERHEAD
