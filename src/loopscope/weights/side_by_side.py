"""A cell's seeds trained side by side: one process per run, each on its share of the
cell's threads (CellConfig.for_seed), as train.seed_processes asks.

Two small runs on one core each use a 2-core machine better than one run on both (the
matrices are small enough that a second thread gains a step well under 2x: on a 2-core
AMD EPYC, 1.27-1.41x more steps per second in all, docs/benchmarks.md). A run's numerics
depend on its own thread count alone, which its config records, so a run trained side
by side gives the same bytes as the same config trained alone.

Each process trains its run, saves its model file and discards its resume checkpoint
(the paths come from the stage's command); the logged rows come back to the stage,
which replays them into DVCLive in seed order, as a resumed run replays its own.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from loopscope.weights.checkpoint import discard_resume, save_model
from loopscope.weights.config import CellConfig
from loopscope.weights.data import load_tokens
from loopscope.weights.train import train_cell


def train_run(run_cell: str, prepared: str, model_file: str, resume: str) -> dict[str, Any]:
    """Train one run (its config as JSON, CellConfig.to_json) on the prepared training
    tokens; save the model file and discard the resume checkpoint; return the run's
    summary (its logged rows under "history"). Runs in a process of its own."""
    cell = CellConfig.from_json(run_cell)
    tokens = torch.from_numpy(load_tokens(Path(prepared), "train"))
    model, summary = train_cell(cell, tokens, None, Path(resume))
    save_model(Path(model_file), model, cell, {"summary": {
        k: v for k, v in summary.items() if k not in ("timings", "history")}})
    discard_resume(Path(resume))
    return summary


def train_side_by_side(cell: CellConfig, prepared: Path, model: str, resume: str
                       ) -> dict[int, dict[str, Any]]:
    """Every seed of the cell, cell.runs_at_once at a time, each in a fresh process
    (spawned: no thread pool is shared with the parent); model and resume: the stage's
    paths with {seed}. Returns each run's summary by seed; the first failure (a
    divergence, a collapse) is raised, the other runs stopped."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(cell.runs_at_once, mp_context=context) as pool:
        jobs = {seed: pool.submit(train_run, cell.for_seed(seed).to_json(), str(prepared),
                                  model.format(seed=seed), resume.format(seed=seed))
                for seed in cell.seeds}
        try:
            return {seed: job.result() for seed, job in jobs.items()}
        except BaseException:
            for job in jobs.values():
                job.cancel()
            raise
