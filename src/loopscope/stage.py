"""What every stage script shares: clean error exits and atomic JSON outputs."""

from __future__ import annotations

import errno
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loopscope.config import ParamsError
from loopscope.corpus import CorpusError
from loopscope.data import DataError, atomic_write_bytes
from loopscope.train import CheckpointError, DivergenceError

# Errors whose message already says what went wrong and what to do: no traceback.
EXPECTED = (ParamsError, DataError, DivergenceError, CorpusError, CheckpointError)


def run(main: Callable[[], None]) -> None:
    """Run a stage's main; print expected errors as one clear line and exit 1."""
    try:
        main()
    except EXPECTED as err:
        sys.exit(f"error: {err}")
    except OSError as err:  # a full disk or a read-only path, named by the OS error
        where = f"{err.filename}: {err.strerror}" if err.filename else str(err)
        todo = ("Free disk space" if err.errno in (errno.ENOSPC, errno.EDQUOT)
                else "Fix the path or its permissions")
        sys.exit(f"error: {where.rstrip('.')}. {todo}, then rerun `dvc repro`.")


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())
