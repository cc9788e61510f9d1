"""Constructed run outputs the report-table tests read: configs, metrics, tables/claims.json
written into a temporary working directory."""

import dataclasses
import json
from pathlib import Path

from conftest import TINY, tiny_cell

from loopscope.base import paths
from loopscope.weights.config import CellConfig


def write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def iv(value: float, lo: float | None = None, hi: float | None = None) -> dict:
    return {"value": value, "lo": value if lo is None else lo,
            "hi": value if hi is None else hi, "units": 40}


def per_loop(k: int, f) -> dict[str, float]:
    """{"k1": f(1), ..., "kK": f(K)}, written in sorted-key order as the stages do."""
    return {f"k{i}": f(i) for i in sorted(range(1, k + 1), key=str)}


def cell(loops: int, **train) -> CellConfig:
    """A cell config at training depth `loops` (depth="lognormal": a paper B backbone)."""
    return tiny_cell(dataclasses.replace(TINY, loops=loops), **train)


def write_config(name: str, config: CellConfig) -> None:
    paths.config_file(name).parent.mkdir(parents=True, exist_ok=True)
    paths.config_file(name).write_text(config.to_json())


def diagnose(k: int, scale: float) -> dict:
    """metrics/diagnose of a cell trained at depth k: norms grow with the loop."""
    out = {"seeds": 1, "units": 40, "unit": "document", "val_tokens": 1000,
           "ppl_at_depth": per_loop(k, lambda i: 100.0 / i),
           "lemma2": {"slope": -1.0 * scale, "scale_ratio": 2.0}}
    for name in ("mean", "median", "p99", "p99_over_median", "share_above_10x_median"):
        out[f"norm_{name}"] = per_loop(k, lambda i: scale * i)
    for name in ("radial_fraction", "radial_fraction_token", "radial_floor", "angular_step",
                 "angular_vs_scale_slope"):
        out[name] = per_loop(k, lambda i: 0.1 * i)
    return out


def estimate(value: float = 1.0, lo: float = 0.5, hi: float = 1.5, band=(0.0, None),
             unit: str = "nats", level: float = 0.95, paper: float | None = None) -> dict:
    """A row's decisive comparison as the claims stage writes it (Comparison.record)."""
    return {"statistic": "x", "unit": unit, "value": value, "lo": lo, "hi": hi,
            "level": level, "resampling_units": 40, "paper": paper, "band": list(band)}


PAPERS = {"paper_a": {"title": "Paper A's title", "topic": "the readout blind spot"},
          "paper_b": {"title": "Paper B's title", "topic": "per-token fixed-point convergence"}}
PROVENANCE = {"stage": "claims", "commit": "0123456789abcdef0123456789abcdef01234567",
              "inputs": {"configs": "0" * 32 + ".dir", "stages/claims.py": "1" * 32},
              "params": {"keys": ["cells"], "sha256": "2" * 16}, "date": "2025-01-01",
              "packages": {"python": "3.11.0", "torch": "2.13.0"}, "cpu": "CPU X",
              "precision": {"training": "fp32", "measuring": "fp32"}}


def claim_row(key: str, verdict: str = "holds", kind: str = "finding", group: str = "ours",
              paper: str = "A", **fields) -> dict:
    """A row of tables/claims.json as the claims stage writes it."""
    return {"id": f"{paper}.{key}.{group}", "paper": paper, "group": group, "kind": kind,
            "key": key, "claim": f"{key} claim", "paper_says": "the paper", "source": "where",
            "criterion": "criterion", "value": "ours", "direction": verdict,
            "magnitude": "n/a", "verdict": verdict, "regime": "", "recipe": "",
            "resampled": "40 units", "comparisons": 1, "reads": [f"{key}'s statistic"],
            "estimate": estimate(),
            "magnitude_estimate": None,
            "robustness": {"mark": "robust", "swept": {"margin_nats": [0.005, 0.025]},
                           "turns": []}, **fields}


PARAMETERS = [{"name": "margin_nats", "value": 0.01, "meaning": "a margin", "source": "ours",
               "range": [0.005, 0.01, 0.025]},
              {"name": "regime", "value": 0.75, "meaning": "the regime", "source": "paper B",
               "range": [0.625, 0.75, 0.875]}]


def claims_json(paper_a: list[dict], paper_b: list[dict] | None = None, **extra) -> dict:
    def counts(rows):
        found = [r for r in rows if r["kind"] == "finding"]
        return {v: sum(r["verdict"] == v for r in found)
                for v in ("holds", "contradicted", "inconclusive", "not shown")}
    paper_b = paper_b or []
    return {"$schema": "claims.schema.json", "schema_version": 3, "papers": PAPERS,
            "provenance": PROVENANCE, "paper_a": paper_a, "paper_b": paper_b,
            "mechanism_checks": [], "judged_with": {"criteria": "0" * 16, "cells": "1" * 16},
            "counts": {"paper_a": counts(paper_a), "paper_b": counts(paper_b)},
            "parameters": PARAMETERS,
            "rules": {"family": "Bonferroni", "seeds": "each seed", "verdict": "both"},
            "cells": {}, "init_effect": "",
            "scale": {"cells": {
                "short": {"parameters": 700000, "seeds": 2, "training_tokens": 800000,
                          "recipe_group": "ours", "paper_b_backbone": False},
                "bb": {"parameters": 800000, "seeds": 1, "training_tokens": 900000,
                       "recipe_group": "ours", "paper_b_backbone": True}},
                "corpus": {"documents": 13, "train_tokens": 1000000, "val_tokens": 50000},
                "papers": {"paper_a": {"parameters": "44M", "corpus": "WikiText-103",
                                       "training": "4 epochs", "seeds": "3"},
                           "paper_b": {"parameters": "~135M", "corpus": "TinyStories",
                                       "training": "100 GPU-hours", "seeds": "1"}},
                "reference_recipe": "paper A's architecture and init with our schedule"},
            "paper_b_recipe": {}, **extra}


def write_paper_a_cells() -> None:
    """Two paper A cells in the working directory, `short` trained at K = 2 and `long` at
    K = 3 (10x its norms): configs and the metrics the report tables read."""
    for name, k, scale in (("short", 2, 1.0), ("long", 3, 10.0)):
        write_config(name, cell(k))
        write(paths.metrics_file("diagnose", name), diagnose(k, scale))
        write(paths.metrics_file("throughput", name),
              {"tokens_per_s": per_loop(k, lambda i: 1000.0 / i)})
        write(paths.metrics_file("clamp", name),
              {"freeze_loop1": {"delta_ce": per_loop(k, lambda i: 0.01 * i)}})
        write(paths.metrics_file("train", name), {"params": 1234})
        write(paths.metrics_file(paths.TRAIN_TIMINGS, name), {"train_seconds": 5.0})
