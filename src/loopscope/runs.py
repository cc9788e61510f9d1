"""The trained runs of a cell, ready to measure, and the mean of their metrics.

A cell trains once per seed; every stage that measures a cell (extract, diagnose,
clamp, ...) measures each run on the same validation windows, on the device the cell
trained on, and reports the mean over runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from loopscope import compute, paths
from loopscope.checkpoint import load_model
from loopscope.config import CellConfig
from loopscope.data import load_tokens, val_windows
from loopscope.errors import CheckpointError
from loopscope.model import LoopedLM


@dataclass
class Run:
    """One trained run of a cell: its tag (seed<N>), the model in eval mode on the run's
    device, its config, and the validation inputs and targets on that device."""

    tag: str
    model: LoopedLM
    cell: CellConfig
    x: Tensor
    y: Tensor
    compute: compute.Compute


def trained_runs(name: str, val_sequences: int) -> Iterator[Run]:
    """Each trained run of cell `name`, with the first val_sequences validation windows
    as data (the same for every cell and seed).

    Seeds torch with the run's seed before yielding, so a noise initial state draws the
    same noise in every stage that reads the model.
    """
    files = paths.run_files(name)
    if not files:
        raise CheckpointError(f"{paths.model_dir(name)}/: no trained runs; run "
                              f"`dvc repro train@{name}`.")
    tokens = torch.from_numpy(load_tokens(paths.PREPARED, "val"))
    for path in files:
        model, cell = load_model(path)
        run_on = compute.resolve(cell.train)
        torch.manual_seed(cell.train.seed)
        torch.set_num_threads(cell.train.threads)
        x, y = val_windows(tokens, cell.model.context, val_sequences)
        yield Run(path.stem, model.to(run_on.device), cell, x.to(run_on.device),
                  y.to(run_on.device), run_on)


def mean_over_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Average metrics dicts of the same shape (one per seed), leaf by leaf."""
    first = runs[0]
    if isinstance(first, dict):
        return {key: mean_over_runs([r[key] for r in runs]) for key in first}
    return sum(runs) / len(runs)
