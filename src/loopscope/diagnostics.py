"""Measurements on a trained cell: paper A's diagnostics.

- hidden-state scale per loop, centre and tail (is drift a mean shift or heavy-tailed?);
- radial gradient fraction of each loop's immediate readout loss (Lemma 1: a normalized
  readout has no radial gradient, so the loss cannot see the scale);
- the residual update split into radial and angular parts, and the angular step of
  the normalized state against 1/s (Lemma 2: a growing scale freezes the direction);
- cross-entropy and tokens/s at inference depth K (the quality/compute frontier);
- the recurrent scale clamp (rescale every H_k to its loop-1 magnitude).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from loopscope.errors import DataError, atomic_write_bytes, require_disk
from loopscope.model import LoopedLM, LoopHook, loop_ce

QUANTILES = {"median": 0.5, "p90": 0.9, "p99": 0.99}
TABLE_ROW_BYTES = 22  # tokens.parquet, one row uncompressed: four int32, an int16, a float


def norm_stats(norms: np.ndarray) -> dict[str, float]:
    """Summary of per-token hidden norms ||H_k||: the centre and the tail.

    p99/median and the share of tokens above 10x the median tell a heavy tail (a few
    tokens drifting) from a mean shift (every token growing alike).
    """
    stats = {"mean": float(norms.mean()), "max": float(norms.max())}
    stats.update({name: float(np.quantile(norms, q)) for name, q in QUANTILES.items()})
    stats["p99_over_median"] = stats["p99"] / stats["median"]
    stats["share_above_10x_median"] = float((norms > 10 * stats["median"]).mean())
    return stats


# ---------------------------------------------------------------------------- extract


def _rows(h0: torch.Tensor | None, i: int, n: int) -> torch.Tensor | None:
    """The initial states of windows i .. i + n, if the model takes them."""
    return None if h0 is None else h0[i:i + n]


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor on any device, in any dtype, as numpy (bf16 widened to float32)."""
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


@dataclass
class Extract:
    """Per-loop hidden states of a fixed validation slice.

    On disk (one folder per cell, written by the extract stage):
        states.npy    float32, shape (loops + 1, tokens, d_model): H_0 (the initial state)
                      then H_1 .. H_K, tokens in reading order (sequence-major)
        tokens.parquet one row per (token, loop k >= 1): seq, position, token_id,
                      target_id, loop, norm (= ||H_k|| of that token)
        meta.json     cell, loops, context, sequences, d_model
    states.npy is written batch by batch through a memmap, so memory stays bounded by
    one batch whatever the slice size.
    """

    states: np.ndarray
    table: pd.DataFrame
    meta: dict


@torch.no_grad()
def write_extract(model: LoopedLM, x: torch.Tensor, y: torch.Tensor, batch_size: int,
                  out: Path, cell: str, h0: torch.Tensor | None = None) -> Extract:
    """Run the model over (x, y) and write the extract folder out/ (see Extract).
    h0: the windows' initial states for a noise state_init (loopscope.runs).

    Checks the free disk space first: the states grow with the params, and a full disk
    under the memmap would end the process with SIGBUS rather than an error.
    """
    cfg = model.cfg
    n, t = x.shape
    out.mkdir(parents=True, exist_ok=True)
    require_disk({out / "states.npy": (cfg.loops + 1) * n * t * cfg.d_model * 4
                  + cfg.loops * n * t * TABLE_ROW_BYTES},
                 f"Free disk space, or lower extract.val_sequences ({n} windows of "
                 f"model.context {t} tokens, each token with model.loops + 1 = {cfg.loops + 1} "
                 f"states of model.d_model {cfg.d_model} floats), then rerun `dvc repro`.")
    tmp = out / ".states.npy.tmp"
    states = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32,
                                       shape=(cfg.loops + 1, n * t, cfg.d_model))
    norms = np.empty((cfg.loops, n * t), dtype=np.float32)  # from each batch, not a reread
    for i in range(0, n, batch_size):
        xb = x[i:i + batch_size]
        rows = slice(i * t, (i + len(xb)) * t)
        out_b = model(xb, read="none", h0=_rows(h0, i, batch_size))
        states[0, rows] = _numpy(out_b.initial.flatten(0, 1))
        for k, h in enumerate(out_b.states, 1):
            states[k, rows] = _numpy(h.flatten(0, 1))
            norms[k - 1, rows] = _numpy(h.float().norm(dim=-1).flatten())
    states.flush()
    seq = np.repeat(np.arange(n), t)
    pos = np.tile(np.arange(t), n)
    table = pd.DataFrame({
        "seq": np.tile(seq, cfg.loops).astype(np.int32),
        "position": np.tile(pos, cfg.loops).astype(np.int32),
        "token_id": np.tile(_numpy(x.flatten()), cfg.loops).astype(np.int32),
        "target_id": np.tile(_numpy(y.flatten()), cfg.loops).astype(np.int32),
        "loop": np.repeat(np.arange(1, cfg.loops + 1), n * t).astype(np.int16),
        "norm": norms.flatten(),
    })
    meta = {"cell": cell, "loops": cfg.loops, "context": t, "sequences": n,
            "d_model": cfg.d_model, "tokens": n * t}
    del states
    tmp_table = out / ".tokens.parquet.tmp"
    table.to_parquet(tmp_table, index=False)
    tmp.replace(out / "states.npy")
    tmp_table.replace(out / "tokens.parquet")
    atomic_write_bytes(out / "meta.json", (json.dumps(meta, indent=2) + "\n").encode())
    return load_extract(out)


def load_extract(path: Path) -> Extract:
    """Read an extract folder, checking that its parts agree."""
    files = {name: path / name for name in ("states.npy", "tokens.parquet", "meta.json")}
    for file in files.values():
        if not file.is_file():
            raise DataError(f"{file}: missing; rerun the extract stage (`dvc repro`).")
    meta = json.loads(files["meta.json"].read_text())
    states = np.load(files["states.npy"], mmap_mode="r")
    table = pd.read_parquet(files["tokens.parquet"])
    want = (meta["loops"] + 1, meta["tokens"], meta["d_model"])
    if states.shape != want or len(table) != meta["loops"] * meta["tokens"]:
        raise DataError(f"{path}/: states {states.shape} or table ({len(table)} rows) do not "
                        f"match meta.json {want}; rerun `dvc repro -f extract@{meta['cell']}`.")
    return Extract(states=states, table=table, meta=meta)


# ------------------------------------------------------------------------ Lemma 1


def radial_fraction(model: LoopedLM, h: torch.Tensor, targets: torch.Tensor, last: bool
                    ) -> float:
    """|<grad_H L, H>| / (||grad_H L|| ||H||) for L = CE of the readout of state H.

    Computed in the model's dtype, outside any autocast; pass a float64 copy (as
    radial_fractions does) so that a normalized readout's ~0 is not float32 round-off.
    """
    weight = next(model.parameters())
    h = h.detach().to(weight.device, weight.dtype).requires_grad_(True)
    with torch.autocast(weight.device.type, enabled=False):
        loss = loop_ce(model.read(h, last=last), targets.to(weight.device))
    (grad,) = torch.autograd.grad(loss, h)
    return (grad * h).sum().abs().item() / (grad.norm() * h.norm()).item()


def radial_fractions(model: LoopedLM, ext: Extract, batch_tokens: int = 2048) -> list[float]:
    """Radial gradient fraction of each loop's immediate readout loss (loops 1..K).

    Averaged over slices of batch_tokens tokens of the extract (each slice a batch of
    whole sequences, as in training).
    """
    t = ext.meta["context"]
    per_slice = max(1, batch_tokens // t) * t
    targets = torch.from_numpy(ext.table["target_id"].to_numpy()[: ext.meta["tokens"]]
                               .astype(np.int64))
    loops, d = ext.meta["loops"], ext.meta["d_model"]
    model64 = copy.deepcopy(model).double()
    out = []
    for k in range(1, loops + 1):
        vals = []
        for i in range(0, ext.meta["tokens"], per_slice):
            h = torch.from_numpy(np.array(ext.states[k, i:i + per_slice])).view(-1, t, d)
            vals.append(radial_fraction(model64, h, targets[i:i + per_slice].view(-1, t),
                                        last=k == loops))
        out.append(float(np.mean(vals)))
    return out


# ------------------------------------------------------------------------ Lemma 2


def decompose_update(h_prev: np.ndarray, h_next: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Split the update D = H_{k+1} - H_k of each token into radial and angular parts.

    radial = <D, u> u with u = H_k / ||H_k|| changes the scale; angular = D - radial
    turns the direction. Returns (radial, angular) vectors; they sum to D exactly.
    """
    d = h_next - h_prev
    u = h_prev / np.linalg.norm(h_prev, axis=-1, keepdims=True)
    radial = (d * u).sum(-1, keepdims=True) * u
    return radial, d - radial


def angular_step(h_prev: np.ndarray, h_next: np.ndarray) -> np.ndarray:
    """Angle (radians) between H_k and H_{k+1} per token: how far the normalized state,
    the only thing a normalized readout sees, moves in one loop."""
    a = h_prev / np.linalg.norm(h_prev, axis=-1, keepdims=True)
    b = h_next / np.linalg.norm(h_next, axis=-1, keepdims=True)
    return np.arccos(np.clip((a * b).sum(-1), -1.0, 1.0))


def update_metrics(ext: Extract) -> dict[str, dict[str, float]]:
    """Per loop k (the update from H_{k-1} to H_k): mean radial and angular update sizes,
    mean angular step, mean 1/s_{k-1}, and the log-log slope of angular step on s_{k-1}
    across tokens (Lemma 2 predicts about -1 once the residual branch b(u) is steady)."""
    out: dict[str, dict[str, float]] = {}
    for k in range(1, ext.meta["loops"] + 1):
        prev, nxt = np.asarray(ext.states[k - 1]), np.asarray(ext.states[k])
        radial, angular = decompose_update(prev, nxt)
        s_prev = np.linalg.norm(prev, axis=-1)
        theta = angular_step(prev, nxt)
        ok = (theta > 0) & (s_prev > 0)
        slope = (float(np.polyfit(np.log(s_prev[ok]), np.log(theta[ok]), 1)[0])
                 if ok.sum() > 2 and np.ptp(np.log(s_prev[ok])) > 0 else float("nan"))
        values = {
            "radial_update": float(np.linalg.norm(radial, axis=-1).mean()),
            "radial_update_signed": float((radial * prev).sum(-1).mean()
                                          / max(s_prev.mean(), 1e-12)),
            "angular_update": float(np.linalg.norm(angular, axis=-1).mean()),
            "angular_step": float(theta.mean()),
            "inv_scale": float((1.0 / s_prev).mean()),
            "angular_step_x_scale": float((theta * s_prev).mean()),
            "angular_vs_scale_slope": slope,
        }
        for name, value in values.items():
            out.setdefault(name, {})[f"k{k}"] = value
    return out


# ------------------------------------------------------------------ depth and clamp


@torch.no_grad()
def depth_sweep(model: LoopedLM, x: torch.Tensor, y: torch.Tensor, batch_size: int,
                h0: torch.Tensor | None = None, hook: LoopHook | None = None
                ) -> dict[str, list[float]]:
    """Cross-entropy at every loop k = 1..K (the training depth), read two ways:
    ce_at_depth, H_k read out as a last loop (inference stopped at depth k); and
    ce_readout, H_k through the readout loop k had in training (they differ only for a
    final_norm readout before the last loop). hook: applied to every state (the clamp).

    The state after loop k does not depend on later loops, so one pass to the deepest
    loop gives every depth.
    """
    loops = model.cfg.loops
    own = model.cfg.readout == "final_norm"  # else the two reads are the same logits
    model.eval()
    sums = torch.zeros(2, loops, dtype=torch.float64, device=x.device)
    for i in range(0, len(x), batch_size):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size]
        out = model(xb, hook=hook, read="none", h0=_rows(h0, i, batch_size))
        for k, h in enumerate(out.states):
            as_last = loop_ce(model.read(h, last=True), yb).double()
            in_training = (loop_ce(model.read(h, last=k == loops - 1), yb).double()
                           if own else as_last)
            sums[:, k] += torch.stack([as_last, in_training]) * yb.numel()
    ce = (sums / y.numel()).tolist()
    return {"ce_at_depth": ce[0], "ce_readout": ce[1]}


@dataclass
class Timed:
    """A model to time at inference depths 1..loops over windows x (h0: their initial
    states, None for an embedding state)."""

    model: LoopedLM
    x: torch.Tensor
    loops: int
    h0: torch.Tensor | None = None
    autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext  # the run's


@torch.no_grad()
def throughput(jobs: dict[str, Timed], batch_size: int, rounds: int = 3
               ) -> dict[str, dict[str, float]]:
    """Inference tokens/s of every job at every depth k = 1..loops: {name: {"kK": v}}.

    Every (job, depth) pass over its windows is timed once per round, in the same order
    in every round, and the median over rounds is reported, so all cells are measured
    under the same machine load, close together in time. (Timed in separate processes
    at different moments, identical architectures spread over 36k-46k tokens/s.)
    A timing: compare within one run, not across machines.
    """
    def one_pass(job: Timed, loops: int, n: int) -> None:
        with job.autocast():
            for i in range(0, n, batch_size):
                job.model(job.x[i:i + batch_size], loops=loops, read="last",
                          h0=_rows(job.h0, i, batch_size))

    for job in jobs.values():
        job.model.eval()
        one_pass(job, job.loops, batch_size)  # warm-up
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for name, job in jobs.items():
            for loops in range(1, job.loops + 1):
                _sync(job.x.device)
                start = time.perf_counter()
                one_pass(job, loops, len(job.x))
                _sync(job.x.device)
                times.setdefault((name, loops), []).append(time.perf_counter() - start)
    return {name: {f"k{k}": job.x.numel() / float(np.median(times[name, k]))
                   for k in range(1, job.loops + 1)} for name, job in jobs.items()}


def _sync(device: torch.device) -> None:
    """Wait for queued CUDA work, so a timer measures the work and not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clamp_hook(reference: dict[str, torch.Tensor]):
    """The recurrent scale clamp: rescale every H_k (k >= 2) to the per-token magnitude
    it had after loop 1, keeping its direction."""
    def hook(k: int, h: torch.Tensor) -> torch.Tensor:
        norm = h.norm(dim=-1, keepdim=True)
        if k == 1:
            reference["s1"] = norm
            return h
        return h * (reference["s1"] / norm.clamp_min(1e-12))
    return hook


def clamp_effect(model: LoopedLM, x: torch.Tensor, y: torch.Tensor, batch_size: int,
                 ce_readout: list[float], h0: torch.Tensor | None = None
                 ) -> dict[str, dict[str, float]]:
    """CE of each loop's own readout with the scale clamp, against ce_readout without it
    (depth_sweep's, which diagnose already measured on the same windows), and their
    difference: metrics/clamp's ce_readout, ce_readout_clamped and delta_ce."""
    clamped = depth_sweep(model, x, y, batch_size, h0, clamp_hook({}))["ce_readout"]
    result: dict[str, dict[str, float]] = {
        "ce_readout": {}, "ce_readout_clamped": {}, "delta_ce": {}}
    for k, (ce, ce_clamped) in enumerate(zip(ce_readout, clamped, strict=True), 1):
        result["ce_readout"][f"k{k}"] = ce
        result["ce_readout_clamped"][f"k{k}"] = ce_clamped
        result["delta_ce"][f"k{k}"] = ce_clamped - ce
    return result


def diagnose(model: LoopedLM, x: torch.Tensor, y: torch.Tensor, batch_size: int,
             ext: Extract, h0: torch.Tensor | None = None) -> dict[str, dict[str, float]]:
    """The per-cell metrics JSON: for each loop or depth k, CE and perplexity (on x, y),
    and from the extract the norm statistics, radial fraction and update decomposition.

    Keys are flat and named by loop (e.g. norm_mean.k4, ppl_at_depth.k1) so
    `dvc metrics show` and `dvc exp show` list them as columns; README lists them all.
    """
    metrics: dict[str, dict[str, float]] = {"ppl_at_depth": {}}
    for name, ce in depth_sweep(model, x, y, batch_size, h0).items():
        metrics[name] = {f"k{k}": v for k, v in enumerate(ce, 1)}
    for key, ce in metrics["ce_at_depth"].items():
        metrics["ppl_at_depth"][key] = math.exp(ce)
    norms = ext.table.groupby("loop")["norm"]
    for k, group in norms:
        for name, value in norm_stats(group.to_numpy(np.float64)).items():
            metrics.setdefault(f"norm_{name}", {})[f"k{k}"] = value
    metrics["radial_fraction"] = {f"k{k}": v for k, v in
                                  enumerate(radial_fractions(model, ext), 1)}
    metrics.update(update_metrics(ext))
    return metrics
