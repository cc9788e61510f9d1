"""The long tables behind dvc.yaml's top-level `plots:`, one row per cell (or policy)
and loop, so that one plot covers every cell and `dvc plots diff` overlays experiments.

    tables/plots/norm.csv         mean hidden-state norm ||H_k|| per loop (diagnose)
    tables/plots/ppl.csv          perplexity at inference depth K = 1..K_train (diagnose)
    tables/plots/radial.csv       radial gradient fraction per loop (diagnose)
    tables/plots/convergence.csv  CE, KL(p_i || p_i-1) and relative state change per
                                  loop, uniform depth up to depth_factor x R (convergence)
    tables/plots/frontier.csv     each depth policy's CE against mean loops and FLOPs,
                                  `report` windows (policies, paper B's backbones)

Every table has a `series` column (the cell, or "<cell> <rule>" for the frontier) that
the templates in .dvc/plots/ colour by; DVC adds `rev`, which they dash by. The values
are copied from the metrics files and tables the stages wrote: nothing is recomputed.
The report notebooks' tables are loopscope.render.report_tables, their figures'
helpers loopscope.render.figures.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from loopscope.base import paths
from loopscope.base.outputs import loop_order, read_metrics, require_output

NAMES = ("norm", "ppl", "radial", "convergence", "frontier")


def _per_loop(cell: str, column: str, values: dict[str, float], x: str = "loop"
              ) -> list[dict[str, Any]]:
    """{"k1": v, ...} as rows {series, <x>: 1, <column>: v}, in loop order."""
    return [{"series": cell, x: k, column: v} for k, v in zip(*loop_order(values), strict=True)]


def tables(cells: list[str], policy_cells: list[str]) -> dict[str, pd.DataFrame]:
    """The five long tables (module doc) from the stages' outputs."""
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in NAMES}
    for cell in cells:
        diag, conv = read_metrics("diagnose", cell), read_metrics("convergence", cell)
        rows["norm"] += _per_loop(cell, "norm", diag["norm_mean"])
        rows["ppl"] += _per_loop(cell, "ppl", diag["ppl_at_depth"], x="depth")
        rows["radial"] += _per_loop(cell, "radial_fraction", diag["radial_fraction"])
        per_loop = pd.DataFrame(_per_loop(cell, "ce", conv["ce_at_depth"])).set_index("loop")
        for key in ("kl", "state_change"):  # kl starts at loop 2
            per_loop[key] = pd.Series(dict(zip(*loop_order(conv[key]), strict=True)))
        rows["convergence"] += per_loop.reset_index().to_dict("records")
    for cell in policy_cells:
        path = require_output(paths.table_file("policies", cell), f"policies@{cell}")
        frontier = pd.read_parquet(path).query("set == 'report'")
        for rec in frontier.to_dict("records"):
            rows["frontier"].append({"series": f"{cell} {rec['rule']}", "rule": rec["rule"],
                                     "threshold": rec["threshold"],
                                     "mean_loops": rec["mean_loops"],
                                     "flops_ratio": rec["flops_ratio"], "ce": rec["ce"]})
    return {n: pd.DataFrame(r) for n, r in rows.items()}
