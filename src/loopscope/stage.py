"""How a stage ends: an expected error as one clear line, and what the stage cost as data.

Every stage script ends with `run(main, stage="<its dvc.yaml name>")`.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from loopscope import timings
from loopscope.errors import LoopscopeError, format_bytes
from loopscope.outputs import write_json


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
