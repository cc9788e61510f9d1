"""Reading a stage's outputs back, with an error that names the stage to run.

The one reader of metrics and of the claims table: the claims, the reports, the summary
and the tools read through it, so a missing file says which `dvc repro` writes it rather
than ending in a bare traceback. (Writing is loopscope.base.files.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loopscope.base import paths
from loopscope.base.errors import DataError


def require_output(path: Path, stage: str) -> Path:
    """path, or a DataError naming the stage that writes it."""
    if not path.is_file():
        raise DataError(f"{path}: not found; run `dvc repro {stage}` first.")
    return path


def read_json(path: Path, stage: str) -> Any:
    """A stage's JSON output (metrics, tables/claims.json, a benchmark), or a DataError
    naming the stage to run: a report then says what is missing, not a bare traceback."""
    return json.loads(require_output(path, stage).read_text())


def writer(kind: str, cell: str) -> str:
    """The stage that writes metrics/<kind>/<cell>.json (or tables/<kind>/<cell>.parquet):
    throughput times every cell in one stage, the training runs' wall times come from the
    cell's train stage, and the clamp and the depth sweep run in the cell's diagnose
    stage."""
    if kind == "throughput":
        return kind
    if kind in ("clamp", "sweep"):
        return f"diagnose@{cell}"
    return f"train@{cell}" if kind == paths.TRAIN_TIMINGS else f"{kind}@{cell}"


def read_metrics(kind: str, cell: str) -> dict[str, Any]:
    """A cell's metrics file of one kind, or a DataError naming the stage to run."""
    return read_json(paths.metrics_file(kind, cell), writer(kind, cell))


def read_table(kind: str, cell: str) -> Any:
    """A cell's table of one kind (tables/<kind>/<cell>.parquet) as a DataFrame, or a
    DataError naming the stage to run."""
    import pandas as pd  # only the readers of tables pay for pandas
    return pd.read_parquet(require_output(paths.table_file(kind, cell), writer(kind, cell)))


def loop_order(values: Mapping[str, float]) -> tuple[list[int], list[float]]:
    """A per-loop metric {"k1": v1, "k10": v10, "k2": v2, ...} as (loops, values) in
    loop order.

    write_json sorts keys, so the files hold k10..k19 between k1 and k2: a table built
    from a dict as it comes lists loops out of order, and a curve drawn from it folds
    back on itself (and one drawn over arange(1, n + 1) puts values at the wrong depth)."""
    loops = sorted(values, key=lambda k: int(k[1:]))
    return [int(k[1:]) for k in loops], [values[k] for k in loops]
