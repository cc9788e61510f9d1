"""Writing a stage's outputs so that a killed stage leaves nothing DVC could cache as
finished.

Every output is written under a hidden temporary name and renamed into place, so a
killed or failed stage never leaves a half-written file under the real name. JSON is
written with sorted keys: the same values give the same bytes, and DVC sees no change.
Training writes its model files and metrics through this module too, so it stays
small, imports nothing of loopscope and holds no message: an edit here reruns every stage.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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
