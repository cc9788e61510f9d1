"""How loopscope fails: the errors a user can fix, and the checks that raise them early.

Every error a user can fix (a bad param, a missing or corrupt file, a diverged run) is
a LoopscopeError whose message names the key or file and what to do; a stage prints it
as one `error:` line instead of a traceback (loopscope.stage). Disk space and a stage's
inputs are checked here, before compute is spent.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class LoopscopeError(RuntimeError):
    """An error whose message already says what went wrong and what to do."""


class ParamsError(LoopscopeError, ValueError):
    """A bad value in params.yaml (or a cell override), with its key path."""


class DataError(LoopscopeError):
    """Missing, empty or corrupt data files; the message names the file."""


class CorpusError(LoopscopeError):
    """The corpus could not be fetched or verified; the message says what to do."""


class CheckpointError(LoopscopeError):
    """A checkpoint is missing or unreadable; the message names the file."""


class DivergenceError(LoopscopeError):
    """The loss became NaN or infinite; the message names the cell, step and lr."""


class ResourceError(LoopscopeError):
    """Not enough memory or disk for a run, found before it starts; the message gives
    the need, what there is, and the keys to lower."""


class CollapseError(LoopscopeError):
    """Past half of the run the final loop's CE is still no better than the training
    split's unigram entropy while the loss stays finite (a collapse: nothing learned that tells
    the tokens apart); the message names the cell, steps, lr and the cosine seen."""


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


def require_output(path: Path, stage: str) -> Path:
    """path, or a DataError naming the stage that writes it."""
    if not path.is_file():
        raise DataError(f"{path}: not found; run `dvc repro {stage}` first.")
    return path
