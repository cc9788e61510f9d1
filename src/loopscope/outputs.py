"""Stage outputs: written so that a killed stage leaves nothing DVC could cache as
finished, and read back with an error that names the stage to run.

Every output is written under a hidden temporary name and renamed into place, so a
killed or failed stage never leaves a half-written file under the real name. JSON is
written with sorted keys: the same values give the same bytes, and DVC sees no change.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loopscope import paths
from loopscope.errors import require_output

if TYPE_CHECKING:
    import pandas as pd


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


def read_json(path: Path, stage: str) -> Any:
    """A stage's JSON output (metrics, tables/claims.json, a benchmark), or a DataError
    naming the stage to run: a report then says what is missing, not a bare traceback."""
    return json.loads(require_output(path, stage).read_text())


def _writer(kind: str, cell: str) -> str:
    """The stage that writes metrics/<kind>/<cell>.json: throughput times every cell in
    one stage, the training runs' wall times come from the cell's train stage, and the
    clamp runs in the cell's diagnose stage."""
    if kind == "throughput":
        return kind
    if kind == "clamp":
        return f"diagnose@{cell}"
    return f"train@{cell}" if kind == paths.TRAIN_TIMINGS else f"{kind}@{cell}"


def write_outputs(kind: str, cell: str, metrics: dict[str, Any],
                  tables: dict[str, pd.DataFrame] | None = None) -> None:
    """A measuring stage's outputs for one cell: each table (by its kind) to
    tables/<kind>/<cell>.parquet, then the metrics to metrics/<kind>/<cell>.json, each
    written atomically (atomic_output, write_json)."""
    for table_kind, table in (tables or {}).items():
        with atomic_output(paths.table_file(table_kind, cell)) as tmp:
            table.to_parquet(tmp, index=False)
    write_json(paths.metrics_file(kind, cell), metrics)


def read_metrics(kind: str, cell: str) -> dict[str, Any]:
    """A cell's metrics file of one kind, or a DataError naming the stage to run."""
    return read_json(paths.metrics_file(kind, cell), _writer(kind, cell))


def loop_order(values: Mapping[str, float]) -> tuple[list[int], list[float]]:
    """A per-loop metric {"k1": v1, "k10": v10, "k2": v2, ...} as (loops, values) in
    loop order.

    write_json sorts keys, so the files hold k10..k19 between k1 and k2: a table built
    from a dict as it comes lists loops out of order, and a curve drawn from it folds
    back on itself (and one drawn over arange(1, n + 1) puts values at the wrong depth)."""
    loops = sorted(values, key=lambda k: int(k[1:]))
    return [int(k[1:]) for k in loops], [values[k] for k in loops]
