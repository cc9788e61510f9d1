"""Measurements on a trained cell: hidden-state scale per loop and quality per depth."""

from __future__ import annotations

import math

import numpy as np
import torch

from loopscope.model import LoopedLM
from loopscope.train import loop_ce

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


@torch.no_grad()
def depth_sweep(model: LoopedLM, x: torch.Tensor, y: torch.Tensor, batch_size: int,
                loops: int | None = None) -> tuple[list[float], np.ndarray]:
    """Cross-entropy at inference depth K = 1..loops, and per-token norms per loop.

    The state after loop K does not depend on later loops, so one pass to the deepest
    loop gives every depth: the depth-K prediction is H_K read out as a last loop.
    Returns (ce per K, norms of shape (loops, tokens)).
    """
    loops = loops or model.cfg.loops
    model.eval()
    ce_sum = torch.zeros(loops, dtype=torch.float64)
    norms: list[list[torch.Tensor]] = [[] for _ in range(loops)]
    for i in range(0, len(x), batch_size):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size]
        out = model(xb, loops=loops, read="none")
        for k, h in enumerate(out.states):
            ce_sum[k] += loop_ce(model.read(h, last=True), yb).double() * yb.numel()
            norms[k].append(h.norm(dim=-1).flatten())
    ce = (ce_sum / y.numel()).tolist()
    return ce, torch.stack([torch.cat(n) for n in norms]).numpy()


def diagnose(model: LoopedLM, x: torch.Tensor, y: torch.Tensor, batch_size: int
             ) -> dict[str, dict[str, float]]:
    """The per-cell metrics JSON: for each loop k, norm statistics, CE and perplexity.

    Keys are flat and named by loop (e.g. norm_mean.k4, ppl.k1) so `dvc metrics show`
    and `dvc exp show` list them as columns.
    """
    ce, norms = depth_sweep(model, x, y, batch_size)
    metrics: dict[str, dict[str, float]] = {"ce": {}, "ppl": {}}
    for k in range(1, len(ce) + 1):
        metrics["ce"][f"k{k}"] = ce[k - 1]
        metrics["ppl"][f"k{k}"] = math.exp(ce[k - 1])
        for name, value in norm_stats(norms[k - 1]).items():
            metrics.setdefault(f"norm_{name}", {})[f"k{k}"] = value
    return metrics
