"""How loopscope fails: the expected errors, atomic writes, and a stage's clean exit.

Every error a user can fix (a bad param, a missing or corrupt file, a diverged run) is
a LoopscopeError whose message names the key or file and what to do; a stage prints it
as one `error:` line instead of a traceback. Outputs are written under a temporary name
and renamed, so a killed or failed stage never leaves a file that DVC could cache as
finished.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from loopscope import timings


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


def temp_path(path: Path) -> Path:
    """The hidden sibling that atomic_write_bytes writes before renaming it to path."""
    return path.with_name(f".{path.name}.tmp")


def atomic_write_bytes(path: Path, data: bytes | memoryview) -> None:
    """Write to a temporary name and rename, so a killed stage leaves no partial file.

    A failed write (a full disk) removes the partial temporary file and re-raises the
    OSError with the destination's name: the OS error of a write() names no file.
    """
    path = Path(path)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(path)) from err


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """A temporary path to write `path` through: renamed to path when the block ends,
    removed if it raises, so no half-written file is left under the real name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically, keys sorted, so the same values give the same bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def run(main: Callable[[], None], stage: str | None = None) -> None:
    """Run a stage's main; print expected errors as one clear line and exit 1. On
    success, end with the stage's wall time and peak memory: printed, and, for a stage
    (its dvc.yaml name, train@backbone), written to metrics/stage_timings/<stage>.json
    (loopscope.timings), so what a run cost is data."""
    start = time.perf_counter()
    try:
        main()
        name = " ".join([Path(sys.argv[0]).stem, *sys.argv[1:]])
        seconds, peak = timings.process_seconds(start), timings.peak_memory()
        if stage is not None and os.environ.get("RANK", "0") == "0":  # torchrun: rank 0
            write_json(timings.timings_file(stage), timings.record(seconds, peak))
        sys.stdout.flush()
        print(f"{name}: {seconds:.1f} s, peak memory {format_bytes(peak)}",
              file=sys.stderr, flush=True)
    except LoopscopeError as err:
        sys.exit(f"error: {err}")
    except OSError as err:  # a full disk or a read-only path, named by the OS error
        where = f"{err.filename}: {err.strerror}" if err.filename else str(err)
        todo = ("Free disk space" if err.errno in (errno.ENOSPC, errno.EDQUOT)
                else "Fix the path or its permissions")
        sys.exit(f"error: {where.rstrip('.')}. {todo}, then rerun `dvc repro`.")
