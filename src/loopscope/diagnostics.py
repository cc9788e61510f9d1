"""Measurements on a trained cell: paper A's diagnostics.

- the extract: H_0..H_K of validation windows saved for later reading;
- one depth sweep per run (measure) to L >= K loops, per token: CE through each loop's
  own readout, the hidden-state scale (centre and tail: a mean shift or a heavy tail?),
  Lemma 1's radial gradient fraction beside the floor RMSNorm's eps leaves, and Lemma 2's
  angular step of the normalized state against the scale, as paper A's code checks it;
- tokens/s at inference depth K, every cell in one process (the frontier's cost axis);
- the recurrent scale clamp in paper A's code's two modes (freeze_loop1, remove_radial).
Per-token values keep the document they come from: intervals resample documents.
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
from statistics import pstdev
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from tqdm import tqdm

from loopscope import paths
from loopscope.errors import DataError, require_disk
from loopscope.model import LoopedLM, token_ce
from loopscope.outputs import atomic_write_bytes
from loopscope.stats import bootstrap_mean
from loopscope.units import Units

ClampMode = Literal["freeze_loop1", "remove_radial"]
CLAMP_MODES: tuple[ClampMode, ...] = ("freeze_loop1", "remove_radial")
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


# ------------------------------------------------------------------ the depth sweep


@dataclass
class Measured:
    """Paper A's per-token measurements of one run on the diagnose windows.

    tokens: one row per token (reading order): doc, and per loop k = 1..K (the
        training depth) ce_k (CE through loop k's own readout: the readout it trained
        with; the final_norm cell reads raw before its last loop, as paper A's code's
        early-exit curve does), norm_k = ||H_k|| (norm_0: H_0), cos_k (Lemma 1's radial
        fraction of that token: |<grad, H_k>| / (||grad|| ||H_k||), float64), floor_k
        (eps / (||H_k||^2 / d + eps): the radial fraction a normalized readout keeps
        because of RMSNorm's eps) and step_k (the angle between H_k-1 and H_k, radians).
    sweep: one row per document, sums over its tokens of the depth sweep to L >= K
        loops (Lemma 2 as paper A's code checks it): tokens, and per loop k = 1..L ce_k,
        scale_k (s_k = RMS of H_k), step_k (||u_k - u_k-1|| with u = H / s), step_x_scale_k
        (step_k * s_k-1, constant across loops if the step shrinks like 1/s) and
        radial_k (the radial increment s_k - s_k-1).
    radial_batch: per loop k = 1..K, the radial fraction of the mean loss over each
        batch of 2048 tokens, averaged over batches (the paper's definition).
    units: the resampling units of the windows (of_run names them; None until then).
    """

    tokens: pd.DataFrame
    sweep: pd.DataFrame
    radial_batch: list[float]
    units: Units | None = None

    def of_run(self, seed: int, units: Units) -> Measured:
        """These measurements as one seed of a cell: a seed column first in both tables,
        so the runs stay apart once pooled, and the units the run's windows fall in."""
        tokens, sweep = self.tokens.copy(), self.sweep.copy()
        tokens.insert(0, "seed", seed)
        sweep.insert(0, "seed", seed)
        return Measured(tokens, sweep, self.radial_batch, units)


def _rms(h: torch.Tensor) -> torch.Tensor:
    return h.pow(2).mean(-1).sqrt()


def _token_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token CE (float32): loop_ce without the mean, in model.token_ce's row
    chunks (bit-identical to the whole batch at once, and faster: no fresh pages for a
    batch-sized temporary on every read)."""
    return token_ce(logits.flatten(0, 1), targets.flatten())


def radial_cosines(model64: LoopedLM, h: torch.Tensor, targets: torch.Tensor, last: bool
                   ) -> tuple[torch.Tensor, float]:
    """Lemma 1 on states h (B, T, d): per token |cos| between the gradient of its CE
    through the readout and H itself, and the batch value |<G, H>| / (||G|| ||H||) over
    all tokens together. model64: a float64 copy, so that a normalized readout's ~0 is
    not float32 round-off; each token's logits depend on its own state only, so row t
    of the gradient is the gradient of token t's CE."""
    weight = next(model64.parameters())
    h = h.detach().to(weight.device, torch.float64).requires_grad_(True)
    with torch.enable_grad(), torch.autocast(weight.device.type, enabled=False):
        loss = F.cross_entropy(model64.read(h, last=last).flatten(0, 1),
                               targets.to(weight.device).flatten(), reduction="sum")
        (grad,) = torch.autograd.grad(loss, h)
    dot = (grad * h).sum(-1)
    cos = dot.abs() / (grad.norm(dim=-1) * h.norm(dim=-1)).clamp_min(1e-300)
    batch = (dot.sum().abs() / (grad.norm() * h.norm()).clamp_min(1e-300)).item()
    return cos.detach().flatten().cpu(), batch


@torch.no_grad()
def measure(model: LoopedLM, x: torch.Tensor, y: torch.Tensor, docs: np.ndarray,
            batch_size: int, loops: int, h0: torch.Tensor | None = None) -> Measured:
    """One pass per batch to depth L = max(loops, K) gives every measurement (see
    Measured); docs: the document of each window. Loops past K read out as the last
    loop does."""
    model.eval()
    k_train, d = model.cfg.loops, model.cfg.d_model
    depth = max(loops, k_train)
    eps = model.norm_out.eps
    model64 = copy.deepcopy(model).double()
    tok: dict[str, list[np.ndarray]] = {}
    swp: dict[str, list[np.ndarray]] = {}
    batch_fracs: list[list[float]] = [[] for _ in range(k_train)]

    def put(into: dict[str, list[np.ndarray]], name: str, value: torch.Tensor) -> None:
        into.setdefault(name, []).append(value.detach().double().flatten().cpu().numpy())

    for i in tqdm(range(0, len(x), batch_size), desc="depth sweep", unit="batch",
                  leave=False, disable=len(x) <= batch_size):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size]
        out = model(xb, loops=depth, read="none", h0=_rows(h0, i, batch_size))
        states = [out.initial.float(), *(h.float() for h in out.states)]
        put(tok, "norm_0", states[0].norm(dim=-1))
        for k in range(1, depth + 1):
            h, prev = states[k], states[k - 1]
            s, s_prev = _rms(h), _rms(prev)
            ce = _token_ce(model.read(out.states[k - 1], last=k >= k_train), yb)
            step = (h / s[..., None] - prev / s_prev[..., None]).norm(dim=-1)
            for name, value in (("ce", ce), ("scale", s), ("step", step),
                                ("step_x_scale", step * s_prev), ("radial", s - s_prev)):
                put(swp, f"{name}_{k}", value)
            if k > k_train:
                continue
            norm = h.norm(dim=-1)
            cos, batch = radial_cosines(model64, out.states[k - 1], yb, last=k == k_train)
            batch_fracs[k - 1].append(batch)
            put(tok, f"norm_{k}", norm)
            put(tok, f"ce_{k}", ce)
            put(tok, f"cos_{k}", cos)
            put(tok, f"floor_{k}", eps / (norm.double().pow(2) / d + eps))
            put(tok, f"step_{k}", angular_step(prev, h))
    token_docs = np.repeat(np.asarray(docs), x.shape[1])
    tokens = pd.DataFrame({"doc": token_docs, **{k: np.concatenate(v) for k, v in tok.items()}})
    ids, g = np.unique(token_docs, return_inverse=True)
    sweep = pd.DataFrame({"doc": ids, "tokens": np.bincount(g).astype(np.float64),
                          **{k: np.bincount(g, weights=np.concatenate(v))
                             for k, v in swp.items()}})
    return Measured(tokens, sweep, [float(np.mean(b)) for b in batch_fracs])


def angular_step(h_prev: torch.Tensor, h_next: torch.Tensor) -> torch.Tensor:
    """Angle (radians) between H_k-1 and H_k per token: how far the normalized state,
    the only thing a normalized readout sees, moves in one loop."""
    cos = F.cosine_similarity(h_prev.double(), h_next.double(), dim=-1)
    return torch.arccos(cos.clamp(-1.0, 1.0))


def loglog_slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of log y on log x (nan where x does not vary or < 3 points)."""
    ok = (x > 0) & (y > 0)
    if ok.sum() < 3 or np.ptp(np.log(x[ok])) == 0:
        return float("nan")
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


def sweep_means(sweep: pd.DataFrame) -> pd.DataFrame:
    """The sweep's per-loop means over tokens: one row per loop, one column per
    measurement (ce, scale, step, step_x_scale, radial)."""
    n = sweep["tokens"].sum()
    rows: dict[int, dict[str, float]] = {}
    for col in sweep.columns.drop(["seed", "doc", "tokens"], errors="ignore"):
        name, k = col.rsplit("_", 1)
        rows.setdefault(int(k), {})[name] = sweep[col].sum() / n
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("loop").sort_index()


def lemma2_slope(means: pd.DataFrame) -> float:
    """Across loops 2..L: the log-log slope of the mean angular step on the mean scale
    it starts from (Lemma 2: about -1, i.e. step_x_scale constant across loops).
    Loop 1 is left out: it starts from H_0, the embedding or noise, not a loop's state."""
    scale_prev = means["scale"].shift(1)
    later = means.index >= 2
    return loglog_slope(scale_prev[later].to_numpy(), means["step"][later].to_numpy())


def summarize(m: Measured) -> dict[str, dict[str, float]]:
    """The per-cell metrics JSON from the measurements: for each loop k = 1..K the CE
    and perplexity, norm statistics, radial fraction (batch value, mean per token and
    the eps floor), mean angular step and the across-token log-log slope of the angular
    step on the scale (a figure, not a verdict); and Lemma 2 over the depth sweep.

    Keys are flat and named by loop (e.g. norm_mean.k4, ppl_at_depth.k1) so
    `dvc metrics show` and `dvc exp show` list them as columns; docs/outputs.md lists them all.
    """
    t = m.tokens
    k_train = len(m.radial_batch)
    out: dict[str, dict[str, float]] = {}

    def put(name: str, k: int, value: float) -> None:
        out.setdefault(name, {})[f"k{k}"] = float(value)

    for k in range(1, k_train + 1):
        ce = t[f"ce_{k}"].mean()
        put("ce_at_depth", k, ce)
        put("ppl_at_depth", k, math.exp(ce))
        for name, value in norm_stats(t[f"norm_{k}"].to_numpy(np.float64)).items():
            put(f"norm_{name}", k, value)
        put("radial_fraction", k, m.radial_batch[k - 1])
        put("radial_fraction_token", k, t[f"cos_{k}"].mean())
        put("radial_floor", k, t[f"floor_{k}"].mean())
        put("angular_step", k, t[f"step_{k}"].mean())
        put("angular_vs_scale_slope", k, loglog_slope(t[f"norm_{k - 1}"].to_numpy(),
                                                       t[f"step_{k}"].to_numpy()))
    means = sweep_means(m.sweep)
    ratio = means["step_x_scale"][2:]
    out["lemma2"] = {"loops": int(means.index.max()), "slope": lemma2_slope(means),
                     "scale_growth": float(means["scale"].iloc[-1] / means["scale"].iloc[0]),
                     "step_x_scale_cv": float(ratio.std() / ratio.mean()),
                     "step_cv": float(means["step"][2:].std() / means["step"][2:].mean())}
    return out


def pool_runs(runs: list[Measured]) -> Measured:
    """A cell's runs (seeds) as one: their rows one run after the other, and the batch
    radial fraction of each loop averaged over runs."""
    batch = [sum(v) / len(runs) for v in zip(*(m.radial_batch for m in runs), strict=True)]
    return Measured(pd.concat([m.tokens for m in runs], ignore_index=True),
                    pd.concat([m.sweep for m in runs], ignore_index=True), batch, runs[0].units)


def summarize_runs(runs: list[Measured]) -> tuple[dict[str, Any], Measured]:
    """metrics/diagnose/<cell>.json and the pooled measurements its tables hold.

    Every metric pools the cell's runs (summarize of pool_runs); ppl_at_depth_sd and
    norm_mean_sd give the spread of the runs' own values (0 with one seed), so a pooled
    value that hides seeds disagreeing shows. The runs come from Measured.of_run: every
    run of a cell reads the same windows, so its token count and units are the cell's."""
    pooled = pool_runs(runs)
    if pooled.units is None:
        raise ValueError("summarize_runs wants runs named by Measured.of_run")
    metrics: dict[str, Any] = summarize(pooled)
    each = [summarize(m) for m in runs]
    for key in ("ppl_at_depth", "norm_mean"):
        metrics[f"{key}_sd"] = {k: pstdev(e[key][k] for e in each) for k in metrics[key]}
    metrics["seeds"] = len(runs)
    metrics["val_tokens"] = len(runs[-1].tokens)
    metrics.update(pooled.units.describe())
    return metrics, pooled


def diagnose_headline(metrics: dict[str, Any]) -> str:
    """A cell's diagnosis in one line, from its metrics: at the training depth K,
    perplexity, norm and radial fraction; over the sweep, Lemma 2's scale and slope."""
    loops = len(metrics["ppl_at_depth"])
    last, lemma2 = f"k{loops}", metrics["lemma2"]
    return (f"ppl at K={loops} {metrics['ppl_at_depth'][last]:.1f}, final-loop mean norm "
            f"{metrics['norm_mean'][last]:.1f}, radial fraction per token "
            f"{metrics['radial_fraction_token'][last]:.1e} (eps floor "
            f"{metrics['radial_floor'][last]:.1e}); over {lemma2['loops']} loops the scale "
            f"grows x{lemma2['scale_growth']:.2f}, step-vs-scale slope "
            f"{lemma2['slope']:.2f} ({metrics['seeds']} seed(s), {metrics['units']} units: "
            f"{metrics['unit']})")


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
def clamped_ce(model: LoopedLM, x: torch.Tensor, y: torch.Tensor, batch_size: int,
               mode: ClampMode, h0: torch.Tensor | None = None) -> np.ndarray:
    """Per-token CE through each loop's own readout with the scale clamp: shape
    (K, tokens), tokens in reading order (as Measured.tokens)."""
    model.eval()
    k_train = model.cfg.loops
    rows: list[np.ndarray] = []
    for i in range(0, len(x), batch_size):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size]
        out = model(xb, hook=clamp_hook(mode), read="none", h0=_rows(h0, i, batch_size))
        rows.append(np.stack([_token_ce(model.read(h, last=k == k_train), yb).double()
                              .cpu().numpy() for k, h in enumerate(out.states, 1)]))
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


def clamp_run(model: LoopedLM, x: torch.Tensor, y: torch.Tensor, h0: torch.Tensor | None,
              batch_size: int, unclamped: np.ndarray, seed: int, docs: np.ndarray
              ) -> Clamped:
    """Both clamp modes on one run's windows, against its unclamped CE (unclamped_ce)."""
    return Clamped(seed, docs, {mode: clamped_ce(model, x, y, batch_size, mode, h0) - unclamped
                                for mode in CLAMP_MODES})


def clamp_metrics(runs: list[Clamped], resamples: int) -> dict[str, Any]:
    """metrics/clamp/<cell>.json: per mode, the mean change in CE per loop over the
    tokens of every run, and at the last loop its 95% interval from resampling units
    and seeds."""
    docs = np.concatenate([r.docs for r in runs])
    seeds = np.concatenate([np.full(len(r.docs), r.seed) for r in runs])
    out = {}
    for mode in CLAMP_MODES:
        delta = np.concatenate([r.delta[mode] for r in runs], axis=1)
        out[mode] = {"delta_ce": {f"k{k}": float(v) for k, v in enumerate(delta.mean(axis=1), 1)},
                     "delta_ce_last": bootstrap_mean(delta[-1], docs, resamples,
                                                     runs=seeds).to_dict()}
    return out


def clamp_headline(metrics: dict[str, Any]) -> str:
    """The change in CE at the last loop under each clamp mode, in one line."""
    return "final-loop delta CE " + ", ".join(
        f"{mode} {list(metrics[mode]['delta_ce'].values())[-1]:+.4f}" for mode in CLAMP_MODES)
