"""The stage runner: how a stage ends, an expected error as one clear line and what the
stage cost as data.

dvc.yaml runs every stage through it, from outside the stage's script:

    python -m loopscope.stage STAGE stages/<script>.py [ARGS ...]
    python -m loopscope.stage --untimed configure stages/configure.py configs

The runner is no dependency of the stages it runs. It changes none of their outputs (the
one file it writes, metrics/stage_timings/<STAGE>.json, is a DVC metric with cache:
false), so rewording an error line or changing what a timing records reruns nothing;
the scripts import what computes their results and nothing of this module. A script run
directly (`python stages/diagnose.py backbone`) works the same, with a traceback for an
error and no timings file. Tools (`python -m loopscope.tools.plan` ...) end through `execute`.
"""

from __future__ import annotations

import errno
import os
import runpy
import sys
import time
from collections.abc import Callable
from pathlib import Path

from loopscope.base import timings
from loopscope.base.errors import LoopscopeError
from loopscope.base.files import write_json
from loopscope.preflight.disk import format_bytes

USAGE = ("usage: python -m loopscope.stage [--untimed] STAGE SCRIPT [ARGS ...]\n"
         "  STAGE: the stage's name in dvc.yaml (train@backbone); SCRIPT: stages/<name>.py")


def execute(main: Callable[[], None], stage: str | None = None) -> None:
    """Run main; print expected errors as one clear line and exit 1. On success, end
    with the wall time and peak memory: printed, and, for a stage (its dvc.yaml name,
    train@backbone), written to metrics/stage_timings/<stage>.json (loopscope.base.timings),
    so what a run cost is data."""
    start = time.perf_counter()
    try:
        main()
        name = stage or " ".join([Path(sys.argv[0]).stem, *sys.argv[1:]])
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


def script(path: str, args: list[str]) -> Callable[[], None]:
    """A stage script as a main: runs it as `python path args` would (its __main__
    block), with sys.argv set to match."""
    def main() -> None:
        sys.argv = [path, *args]
        runpy.run_path(path, run_name="__main__")
    return main


def main(argv: list[str]) -> None:
    """`python -m loopscope.stage [--untimed] STAGE SCRIPT [ARGS ...]`."""
    untimed = argv[:1] == ["--untimed"]
    argv = argv[1:] if untimed else argv
    if len(argv) < 2 or not argv[1].endswith(".py"):
        sys.exit(USAGE)
    stage, path, *args = argv
    os.environ["LOOPSCOPE_STAGE"] = stage  # a script that restarts itself (torchrun) runs
    execute(script(path, args), None if untimed else stage)  # each process through here too


if __name__ == "__main__":
    main(sys.argv[1:])
