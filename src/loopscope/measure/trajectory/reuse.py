"""Final-loop key/value reuse (Looped Models Done Right II, arXiv 2610.06833): every
loop attends to the keys and values of the final loop instead of its own. Where the
states have reached a fixed point, the final loop's keys and values are the ones every
late loop computes anyway, and a contraction run against them settles on the same
fixed point: reuse costs nothing. Where they have not, the early loops attend to states
the tokens do not yet hold, and the prediction at the final loop moves. A functional
test of paper B's fixed point beside the settling labels
(loopscope.measure.trajectory.settling).

Two passes per depth D, on any model of the looped-model interface: the model's own
forward to D, keeping each core block's keys and values of loop D (RecordKV), then a
forward in which every loop's core attention reads those (FinalKV). Both passes run
through the same attention (masked.attend), so their difference is the reuse alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from loopscope.looped.interface import LoopedModel
from loopscope.measure.exit_rules.masked import attend
from loopscope.stats.intervals import Sample
from loopscope.weights.model import token_ce


class RecordKV:
    """A core block's own attention that keeps the keys and values of its latest call."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.k, self.v = k, v
        return attend(q, k, v)


class FinalKV:
    """A core block's attention over fixed keys and values (the final loop's), queried
    by the current loop."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v = k, v

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attend(q, self.k, self.v)


@torch.no_grad()
def reuse_ce(model: LoopedModel, x: torch.Tensor, y: torch.Tensor, h0: torch.Tensor | None,
             depths: tuple[int, ...], batch_size: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per depth D of depths: per token (flattened, reading order) the CE read at loop D
    with every loop's own keys and values, and with loop D's at every loop (float64).
    One own pass to the deepest D serves every depth; a reuse pass per depth."""
    if not depths or min(depths) < 1:
        raise ValueError(f"reuse depths must be >= 1; got {depths}")
    own: dict[int, list[np.ndarray]] = {d: [] for d in depths}
    reuse: dict[int, list[np.ndarray]] = {d: [] for d in depths}
    for i in range(0, len(x), batch_size):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size].flatten()
        e = model.inputs(xb)
        start = model.initial_state(e) if h0 is None else h0[i:i + batch_size].to(e.dtype)
        kvs = [RecordKV() for _ in range(model.kv_blocks)]
        final: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        h = start
        for k in range(1, max(depths) + 1):
            h = model.step(model.carry(h, first=k == 1), e, kvs, k=k)
            if k in own:
                final[k] = [(kv.k, kv.v) for kv in kvs]
                own[k].append(_ce(model, h, yb))
        for d in depths:
            fixed = [FinalKV(k, v) for k, v in final[d]]
            h = start
            for k in range(1, d + 1):
                h = model.step(model.carry(h, first=k == 1), e, fixed, k=k)
            reuse[d].append(_ce(model, h, yb))
    return {d: (np.concatenate(own[d]), np.concatenate(reuse[d])) for d in depths}


def _ce(model: LoopedModel, h: torch.Tensor, targets: torch.Tensor) -> np.ndarray:
    return token_ce(model.read(h, last=True).flatten(0, 1), targets).double().cpu().numpy()


def summarize(pairs: dict[int, tuple[np.ndarray, np.ndarray]], sample: Sample, r: int
              ) -> dict[str, dict[str, Any]]:
    """Per depth ("R", "2R", or "D<k>" for another), the mean CE with the model's own
    keys and values and with the final loop's, and what reuse costs: in nats (reuse -
    own) and as a share of the own CE, with intervals over the sample's resamples."""
    out = {}
    for d, (own, reused) in sorted(pairs.items()):
        name = {r: "R", 2 * r: "2R"}.get(d, f"D{d}")
        diff = reused - own
        out[name] = {"depth": d, "ce_own": float(own.mean()), "ce_reuse": float(reused.mean()),
                     "delta_ce": sample.interval(sample.mean(diff)).to_dict(),
                     "share": sample.interval(sample.total(diff) / sample.total(own)).to_dict()}
    return out
