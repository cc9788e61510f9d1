"""What each stage cost: wall time and peak memory, written as data by every stage.

The stage runner (loopscope.stage) ends every stage by writing
metrics/stage_timings/<stage>.json (the stage as dvc.yaml names it: train@backbone,
report_index; all but configure, which every `make repro` runs in a second and would
leave a changed file each time), so the cost of a run is read off its files instead of
estimated: `python -m loopscope.base.timings` prints the table and the ratio of
measuring to training. The files are DVC metrics with cache: false, apart from every
reproducible output, as train's metrics/train_timings/ are. No stage depends on this
module: the runner wraps the stages from outside.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from loopscope.base.machine import cpu_identity, cpu_model
from loopscope.base.paths import STAGE_TIMINGS

# Stages that train models; every other stage measures, renders or summarizes them.
TRAINING = ("configure", "prepare", "train")


def timings_file(stage: str) -> Path:
    """metrics/stage_timings/<stage>.json; stage as dvc.yaml names it (train@backbone)."""
    return STAGE_TIMINGS / f"{stage}.json"


def peak_memory() -> int:
    """Peak resident memory in bytes of this process or any child it waited for (a
    report's notebook kernel), whichever is larger. ru_maxrss is in KiB on Linux (and
    the BSDs) but in bytes on macOS, so the unit follows the platform."""
    import resource  # POSIX only, so imported where it is used
    unit = 1 if sys.platform == "darwin" else 1024
    return unit * max(resource.getrusage(who).ru_maxrss
                      for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def process_seconds(since: float) -> float:
    """Seconds since this process started (imports included), from psutil's process
    start time; else (psutil cannot read it) since the perf_counter reading `since`.

    On Linux psutil's create_time is boot time + the start's clock ticks, and the boot
    time (/proc/stat btime) has whole seconds only, so time.time() - create_time can be
    a second off; there create_time - boot_time (the exact ticks since boot) is taken
    from CLOCK_BOOTTIME, the clock those ticks count on. Elsewhere (macOS) the start time
    is exact to the microsecond and is taken from the wall clock.
    """
    try:
        start = psutil.Process().create_time()
        if hasattr(time, "CLOCK_BOOTTIME"):  # Linux
            return time.clock_gettime(time.CLOCK_BOOTTIME) - (start - psutil.boot_time())
        return time.time() - start
    except (OSError, RuntimeError, psutil.Error):
        return time.perf_counter() - since


def record(seconds: float, peak: int) -> dict[str, Any]:
    """One stage's timings file: wall seconds (process start to end), peak memory, the
    machine (CPU model and its identity beyond the name, logical cores this process may
    use)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"seconds": round(seconds, 2), "peak_memory_bytes": int(peak),
            "cpu": cpu_model(), "cpu_identity": cpu_identity(), "cores": cores}


def is_training(stage: str) -> bool:
    """Whether a stage (train@backbone, prepare) is part of training a run."""
    return stage.split("@")[0] in TRAINING


def read_all(folder: Path = STAGE_TIMINGS) -> dict[str, dict[str, Any]]:
    """Every stage's timings file in folder, by stage name."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def summarize(found: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Seconds spent training (configure, prepare, train@*) and measuring (every other
    stage), and their ratio: the cost issue's yardstick (measuring at most a fifth)."""
    train = sum(t["seconds"] for s, t in found.items() if is_training(s))
    measure = sum(t["seconds"] for s, t in found.items() if not is_training(s))
    return {"training_seconds": round(train, 2), "measuring_seconds": round(measure, 2),
            "measuring_over_training": round(measure / train, 4) if train else None,
            "stages": len(found),
            "cpus": sorted({cpu_name(t) for t in found.values()})}


def cpu_name(timing: dict[str, Any]) -> str:
    """The CPU a stage ran on, with its family and model where recorded: two CPUs of
    one model name ("AMD EPYC") can be different microarchitectures, with other
    speeds and other bytes."""
    name, ident = timing.get("cpu", "unknown CPU"), timing.get("cpu_identity") or {}
    if ident.get("family") and ident.get("model"):
        return f"{name} family {ident['family']} model {ident['model']}"
    return name


def table(found: dict[str, dict[str, Any]]) -> str:
    """The per-stage timings and the totals as a plain-text table."""
    lines = [f"{'stage':<34} {'seconds':>9} {'peak MiB':>9}"]
    for stage, t in sorted(found.items(), key=lambda kv: (not is_training(kv[0]), kv[0])):
        lines.append(f"{stage:<34} {t['seconds']:>9.1f} "
                     f"{t['peak_memory_bytes'] / 2**20:>9.0f}")
    s = summarize(found)
    ratio = s["measuring_over_training"]
    lines += [f"training  {s['training_seconds'] / 60:.1f} min, measuring "
              f"{s['measuring_seconds'] / 60:.1f} min"
              + (f" ({ratio:.2f} of training)" if ratio is not None else ""),
              f"on {', '.join(s['cpus'])}"]
    return "\n".join(lines)


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else STAGE_TIMINGS
    found = read_all(folder)
    if not found:
        sys.exit(f"error: {folder}: no stage timings; run `dvc repro` first.")
    print(table(found))


if __name__ == "__main__":
    main()
