"""The recurrent scale clamp of paper A's code, in its two modes (freeze_loop1,
remove_radial), on a trained model: the change in CE per loop through each loop's own
readout, token by token, against the unclamped CE of the depth sweep. It runs in the
diagnose stage, on the sweep's windows and models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch

from loopscope.base import paths
from loopscope.base.errors import DataError
from loopscope.looped.interface import LoopedModel, h0_rows, run_loops
from loopscope.stats.intervals import bootstrap_mean
from loopscope.weights.model import token_ce

ClampMode = Literal["freeze_loop1", "remove_radial"]


CLAMP_MODES: tuple[ClampMode, ...] = ("freeze_loop1", "remove_radial")


def clamp_hook(mode: ClampMode = "freeze_loop1"):
    """The recurrent scale clamp, in paper A's code's two modes, applied to every H_k
    for k >= 2 (loop 1's state is the reference point):
    freeze_loop1  rescale H_k to the per-token magnitude it had after loop 1, keeping
                  its direction;
    remove_radial subtract from the update H_k - H_k-1 its component along H_k-1, so the
                  loop turns the state but cannot change its scale (to first order)."""
    memory: dict[str, torch.Tensor] = {}

    def hook(k: int, h: torch.Tensor) -> torch.Tensor:
        if k == 1:
            memory["s1"], memory["prev"] = h.norm(dim=-1, keepdim=True), h
            return h
        prev = memory["prev"]
        if mode == "freeze_loop1":
            h = h * (memory["s1"] / h.norm(dim=-1, keepdim=True).clamp_min(1e-12))
        else:
            u = prev / prev.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            update = h - prev
            h = prev + update - (update * u).sum(-1, keepdim=True) * u
        memory["prev"] = h
        return h
    return hook


@torch.no_grad()
def clamped_ce(model: LoopedModel, x: torch.Tensor, y: torch.Tensor, batch_size: int,
               mode: ClampMode, h0: torch.Tensor | None = None) -> np.ndarray:
    """Per-token CE through each loop's own readout with the scale clamp: shape
    (K, tokens), tokens in reading order (as Measured.tokens)."""
    model.eval()
    k_train = model.loops
    rows: list[np.ndarray] = []
    for i in range(0, len(x), batch_size):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size]
        _, states = run_loops(model, xb, k_train, h0_rows(h0, i, batch_size),
                              clamp_hook(mode))
        rows.append(np.stack([token_ce(model.read(h, last=k == k_train).flatten(0, 1),
                                       yb.flatten()).double().cpu().numpy()
                              for k, h in enumerate(states, 1)]))
    return np.concatenate(rows, axis=1)


def unclamped_ce(tokens: pd.DataFrame, seed: int, docs: np.ndarray, loops: int, cell: str
                 ) -> np.ndarray:
    """The unclamped CE the clamp is read against: per loop 1..loops (rows) and token,
    from diagnose@<cell>'s token table (tokens), the rows of this seed. A DataError if
    those rows are not the tokens of the windows measured here (docs: the unit of each
    token, in reading order), since a delta of mismatched tokens would mean nothing."""
    mine = tokens[tokens["seed"] == seed]
    if len(mine) != len(docs) or not np.array_equal(mine["doc"], docs):
        raise DataError(f"{paths.table_file('diagnose', cell)}: its seed {seed} tokens are "
                        f"not this stage's windows; rerun `dvc repro diagnose@{cell}`.")
    return np.stack([mine[f"ce_{k}"].to_numpy() for k in range(1, loops + 1)])


@dataclass
class Clamped:
    """One run's clamp: per mode, the change in CE per loop and token (clamped minus
    unclamped, (K, tokens)), with each token's unit and the run's seed."""

    seed: int
    docs: np.ndarray
    delta: dict[ClampMode, np.ndarray]


def clamp_run(model: LoopedModel, x: torch.Tensor, y: torch.Tensor, h0: torch.Tensor | None,
              batch_size: int, unclamped: np.ndarray, seed: int, docs: np.ndarray
              ) -> Clamped:
    """Both clamp modes on one run's windows, against its unclamped CE (unclamped_ce)."""
    return Clamped(seed, docs, {mode: clamped_ce(model, x, y, batch_size, mode, h0) - unclamped
                                for mode in CLAMP_MODES})


def clamp_metrics(runs: list[Clamped], resamples: int) -> dict[str, Any]:
    """metrics/clamp/<cell>.json: per mode, the mean change in CE per loop over the
    tokens of every run, at the last loop its 95% interval from resampling units and
    seeds, and the same interval of each seed alone (`delta_ce_last_by_seed`: with two
    seeds a verdict must hold on each)."""
    docs = np.concatenate([r.docs for r in runs])
    seeds = np.concatenate([np.full(len(r.docs), r.seed) for r in runs])
    out = {}
    for mode in CLAMP_MODES:
        delta = np.concatenate([r.delta[mode] for r in runs], axis=1)
        out[mode] = {"delta_ce": {f"k{k}": float(v) for k, v in enumerate(delta.mean(axis=1), 1)},
                     "delta_ce_last": bootstrap_mean(delta[-1], docs, resamples,
                                                     runs=seeds).to_dict(),
                     "delta_ce_last_by_seed": {
                         f"seed{r.seed}": bootstrap_mean(r.delta[mode][-1], r.docs,
                                                         resamples).to_dict() for r in runs}}
    return out


def clamp_table(runs: list[Clamped]) -> pd.DataFrame:
    """tables/clamp/<cell>.parquet: one row per token and seed (the rows of
    tables/diagnose, in their order), the change in CE at the last loop under each mode,
    so the claims resample the clamp with the other measurements of the cell, paired,
    and judge each seed alone."""
    return pd.DataFrame({
        "seed": np.concatenate([np.full(len(r.docs), r.seed) for r in runs]),
        "doc": np.concatenate([r.docs for r in runs]),
        **{mode: np.concatenate([r.delta[mode][-1] for r in runs]) for mode in CLAMP_MODES}})


def clamp_headline(metrics: dict[str, Any]) -> str:
    """The change in CE at the last loop under each clamp mode, in one line."""
    return "final-loop delta CE " + ", ".join(
        f"{mode} {list(metrics[mode]['delta_ce'].values())[-1]:+.4f}" for mode in CLAMP_MODES)
