"""The claims stage's library: both papers' claims judged on this run's outputs.

Reads configs/, the diagnose tables and the metrics of the measuring stages, hands them
to paper A's claims (loopscope.judge.paper_a) and paper B's (loopscope.judge.paper_b), and returns
the claims table as data (tables/claims.json, paths.CLAIMS). Only the claims stage and
the reports import this module and the two claims modules; the measuring stages import
loopscope.measure.stats alone, so rewording a claim reruns no measurement (tests/test_layout.py).
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from loopscope.base import paths
from loopscope.base.outputs import require_output
from loopscope.judge.cells import cell_group, control, paper_b_backbones, recipe
from loopscope.judge.group_a import CellA
from loopscope.judge.paper_a import init_effect, paper_a_claims
from loopscope.judge.paper_b import paper_b_claims, recipe_deviation
from loopscope.judge.verdicts import table
from loopscope.weights.config import load_cell


def paper_a_cells(cells: list[str]) -> dict[str, CellA]:
    """paper_a.CellA of each cell, read from configs/, tables/diagnose, tables/sweep,
    metrics/clamp, metrics/throughput and metrics/diagnose (its resampling unit); a
    missing file names the stage to run."""
    def table(kind: str, cell: str) -> pd.DataFrame:
        return pd.read_parquet(require_output(paths.table_file(kind, cell),
                                              f"diagnose@{cell}"))

    def metrics(kind: str, cell: str) -> dict[str, Any]:
        path = paths.metrics_file(kind, cell)
        stage = kind if kind == "throughput" else f"{kind}@{cell}"
        return json.loads(require_output(path, stage).read_text())

    out = {}
    for c in cells:
        cfg = load_cell(paths.config_file(c))
        speed = metrics("throughput", c)
        out[c] = CellA(cell_group(cfg), cfg.train.loss, cfg.model.readout, recipe(cfg),
                       cfg.model.loops, table("diagnose", c), table("sweep", c),
                       metrics("clamp", c), speed["tokens_per_s"], speed["flops_per_token"],
                       metrics("diagnose", c).get("unit", "document"), control(cfg),
                       cfg.model.d_model)
    return out


def judge(cells: list[str], policy_cells: list[str], margin: float, resamples: int
          ) -> dict[str, Any]:
    """Both papers' claims on this run's outputs (tables/claims.json): each table as
    rows (loopscope.judge.verdicts.table), the verdict counts of the findings, paper A's
    mechanism checks apart (implementation checks, not counted as reproduced findings),
    the sentence on what the recipe does to paper A's drift magnitude, and how paper B's
    backbones differ from its recipe."""
    configs = {c: load_cell(paths.config_file(c)) for c in cells}
    groups = {c: cell_group(configs[c]) for c in cells}
    data = paper_a_cells([c for c in cells if groups[c] != "paper B backbone"])
    main, second = paper_b_backbones({c: configs[c] for c in cells
                                      if groups[c] == "paper B backbone"})

    def read(kind: str, cell: str) -> dict[str, Any]:
        path = paths.metrics_file(kind, cell)
        return json.loads(require_output(path, f"{kind}@{cell}").read_text())

    judged = paper_a_claims(data, margin, resamples)
    found = {"paper_a": [c for c in judged if c.kind == "finding"],
             "paper_b": paper_b_claims({c: read("convergence", c) for c in cells},
                                       {c: read("policies", c) for c in policy_cells},
                                       main, second)}
    out: dict[str, Any] = {k: table(v) for k, v in found.items()}
    out["mechanism_checks"] = table([c for c in judged if c.kind == "check"])
    out["counts"] = {k: {verdict: sum(c.verdict == verdict for c in v)
                         for verdict in ("holds", "contradicted", "inconclusive", "not shown")}
                     for k, v in found.items()}
    out["init_effect"] = init_effect(data, resamples)
    out["paper_b_recipe"] = {c: f"R = {configs[c].model.loops}: {recipe_deviation(configs[c])}"
                             for c in (main, second) if c is not None}
    return out
