"""Paper A's depth sweep on a trained model (the diagnose stage): one pass per run to
L >= K loops, per token: CE through each loop's own readout, the hidden-state scale
(centre and tail: a mean shift or a heavy tail?), Lemma 1's radial gradient fraction
beside the floor RMSNorm's eps leaves, and Lemma 2's angular step of the normalized
state against the scale, as paper A's code checks it. Per-token values keep the unit
they come from: intervals resample documents (loopscope.stats.units).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from statistics import pstdev
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from tqdm import tqdm

from loopscope.looped.interface import LoopedModel, h0_rows, run_loops
from loopscope.stats.units import Units
from loopscope.weights.model import token_ce

QUANTILES = {"median": 0.5, "p90": 0.9, "p99": 0.99}


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


def float64_reader(model: LoopedModel) -> torch.nn.Module:
    """A float64 copy of what the model's read runs (its reader: the coda and the
    readout), for Lemma 1's radial fraction. Only this part is copied: a copy of the
    whole model would cost 8 bytes per weight of the prelude and core too (about 28 GB
    for a 3.5B model); the memory check counts this one (preflight.memory)."""
    return copy.deepcopy(model.reader()).double()


def radial_cosines(reader64: torch.nn.Module, h: torch.Tensor, targets: torch.Tensor,
                   last: bool) -> tuple[torch.Tensor, float]:
    """Lemma 1 on states h (B, T, d): per token |cos| between the gradient of its CE
    through the readout and H itself, and the batch value |<G, H>| / (||G|| ||H||) over
    all tokens together. reader64: a float64 copy of the readout (float64_reader), so
    that a normalized readout's ~0 is not float32 round-off; each token's logits depend
    on its own state only, so row t of the gradient is the gradient of token t's CE."""
    weight = next(reader64.parameters())
    h = h.detach().to(weight.device, torch.float64).requires_grad_(True)
    with torch.enable_grad(), torch.autocast(weight.device.type, enabled=False):
        loss = F.cross_entropy(reader64(h, last=last).flatten(0, 1),
                               targets.to(weight.device).flatten(), reduction="sum")
        (grad,) = torch.autograd.grad(loss, h)
    dot = (grad * h).sum(-1)
    cos = dot.abs() / (grad.norm(dim=-1) * h.norm(dim=-1)).clamp_min(1e-300)
    batch = (dot.sum().abs() / (grad.norm() * h.norm()).clamp_min(1e-300)).item()
    return cos.detach().flatten().cpu(), batch


@torch.no_grad()
def measure(model: LoopedModel, x: torch.Tensor, y: torch.Tensor, docs: np.ndarray,
            batch_size: int, sweep_depth: int, h0: torch.Tensor | None = None) -> Measured:
    """One pass per batch to depth L = max(sweep_depth, K) gives every measurement (see
    Measured); docs: the document of each window. Loops past K read out as the last
    loop does."""
    model.eval()
    k_train, d = model.loops, model.d_model
    depth = max(sweep_depth, k_train)
    eps = model.readout_eps
    reader64 = float64_reader(model)
    tok: dict[str, list[np.ndarray]] = {}
    swp: dict[str, list[np.ndarray]] = {}
    batch_fracs: list[list[float]] = [[] for _ in range(k_train)]

    def put(into: dict[str, list[np.ndarray]], name: str, value: torch.Tensor) -> None:
        into.setdefault(name, []).append(value.detach().double().flatten().cpu().numpy())

    for i in tqdm(range(0, len(x), batch_size), desc="depth sweep", unit="batch",
                  leave=False, disable=len(x) <= batch_size):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size]
        initial, hs = run_loops(model, xb, depth, h0_rows(h0, i, batch_size))
        states = [initial.float(), *(h.float() for h in hs)]
        put(tok, "norm_0", states[0].norm(dim=-1))
        for k in range(1, depth + 1):
            h, prev = states[k], states[k - 1]
            s, s_prev = _rms(h), _rms(prev)
            ce = _token_ce(model.read(hs[k - 1], last=k >= k_train), yb)
            step = (h / s[..., None] - prev / s_prev[..., None]).norm(dim=-1)
            for name, value in (("ce", ce), ("scale", s), ("step", step),
                                ("step_x_scale", step * s_prev), ("radial", s - s_prev)):
                put(swp, f"{name}_{k}", value)
            if k > k_train:
                continue
            norm = h.norm(dim=-1)
            cos, batch = radial_cosines(reader64, hs[k - 1], yb, last=k == k_train)
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
    out["lemma2"] = {"sweep_depth": int(means.index.max()), "slope": lemma2_slope(means),
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
            f"{metrics['radial_floor'][last]:.1e}); over {lemma2['sweep_depth']} loops the scale "
            f"grows x{lemma2['scale_growth']:.2f}, step-vs-scale slope "
            f"{lemma2['slope']:.2f} ({metrics['seeds']} seed"
            f"{'s' if metrics['seeds'] != 1 else ''}, {metrics['units']} units: "
            f"{metrics['unit']})")


