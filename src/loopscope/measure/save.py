"""What a measuring stage writes for one cell: its tables and its metrics, atomically."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loopscope.base import paths
from loopscope.base.files import atomic_output, write_json

if TYPE_CHECKING:
    import pandas as pd


def write_outputs(kind: str, cell: str, metrics: dict[str, Any],
                  tables: dict[str, pd.DataFrame] | None = None) -> None:
    """A measuring stage's outputs for one cell: each table (by its kind) to
    tables/<kind>/<cell>.parquet, then the metrics to metrics/<kind>/<cell>.json, each
    written atomically (atomic_output, write_json)."""
    for table_kind, table in (tables or {}).items():
        with atomic_output(paths.table_file(table_kind, cell)) as tmp:
            table.to_parquet(tmp, index=False)
    write_json(paths.metrics_file(kind, cell), metrics)
