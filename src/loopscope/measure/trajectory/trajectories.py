"""Uniform-depth trajectories (paper B): every token run to one depth, every loop read
out. A trajectory records, per token and loop i = 1..D: the cross-entropy of the
prediction read at loop i (coda and final readout over every token's loop-i state),
KL(p_i || p_{i-1}) between successive next-token distributions (paper B's direction),
the relative state change ||h_i - h_{i-1}|| / ||h_i||, the angle of the update, the
argmax and its lead over the runner-up (top-1 minus top-2 log-probability), the
two-step change ||h_i - h_{i-2}|| / ||h_i|| (a period-2 cycle keeps moving every loop
while it returns every second one), and whether loop i's update
h_i - h_{i-1} points back against loop i-1's (cosine < 0: a cycle's updates alternate,
a monotone approach's do not; one byte a token and loop). It runs on any model of the
looped-model interface (loopscope.looped.interface).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from loopscope.looped.interface import LoopedModel
from loopscope.measure.exit_rules.signals import angle, kl_divergence, relative_change
from loopscope.weights.model import row_chunks


@dataclass
class Trajectory:
    """Per loop i (row i - 1) and token (column, reading order)."""

    ce: np.ndarray  # (D, N) nats, the prediction read at loop i
    kl: np.ndarray  # (D, N) KL(p_i || p_{i-1}); row 0 (no previous) is nan
    change: np.ndarray  # (D, N) ||h_i - h_{i-1}|| / ||h_i|| (h_0: the initial state)
    angle: np.ndarray  # (D, N) radians between h_{i-1} and h_i
    argmax: np.ndarray  # (D, N) predicted token id
    # (D, N) ||h_i - h_{i-2}|| / ||h_i||, the two-step change (row 0: nan): a period-2
    # cycle returns to where it was two loops ago while each loop still moves it
    change2: np.ndarray
    # (D, N) bool: loop i's update h_i - h_{i-1} points back against loop i-1's (their
    # cosine < 0; row 0, with no update before it, False): the late share of these is a
    # token's alternation (loopscope.measure.trajectory.settling)
    backward: np.ndarray
    # (D, N) the argmax's lead over the runner-up, top-1 minus top-2 log-probability
    # (nats): what the settle-depth oracle's margin version reads
    gap: np.ndarray
    states: np.ndarray | None = None  # (keep, N, d) h_1..h_keep, float32, if asked for

    @property
    def depth(self) -> int:
        return self.ce.shape[0]

    @classmethod
    def concat(cls, trajs: list[Trajectory]) -> Trajectory:
        """The tokens of several runs (seeds) side by side; states are dropped."""
        cat = {f: np.concatenate([getattr(t, f) for t in trajs], axis=1) for f in FIELDS}
        return cls(**cat, states=None)


# What a trajectory records per loop
FIELDS = ("ce", "kl", "change", "angle", "argmax", "change2", "backward", "gap")


def _points_back(update: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """Per token, whether an update points back against the previous one (their cosine
    < 0, read off the sign of the dot product: no norms needed), as bool. An update of
    zero points nowhere (False)."""
    return (update.float() * previous.float()).sum(-1) < 0


def _read_out(logits: torch.Tensor, yb: torch.Tensor, prev: torch.Tensor | None,
              cur: torch.Tensor | None, fields: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """One loop's readout (N, V) -> per token CE, KL to the previous loop's
    log-probabilities (prev; nan without), argmax and lead over the runner-up, in row
    chunks; the log-probabilities go to `cur` where KL is asked for."""
    n, dev = len(logits), logits.device
    ce = torch.empty(n, device=dev)
    kl = torch.full((n,), float("nan"), device=dev)
    argmax = torch.empty(n, dtype=torch.long, device=dev)
    gap = torch.empty(n, device=dev)
    for r in row_chunks(n, logits.shape[-1]):
        logp = F.log_softmax(logits[r].float(), dim=-1)
        ce[r] = -logp.gather(-1, yb[r, None])[:, 0]
        if prev is not None and "kl" in fields:
            kl[r] = kl_divergence(logp, prev[r])
        if "argmax" in fields:
            argmax[r] = logp.argmax(-1)
        if "gap" in fields:
            top = logp.topk(2, dim=-1).values
            gap[r] = top[:, 0] - top[:, 1]
        if "kl" in fields:
            cur[r] = logp
    return {"ce": ce, "kl": kl, "argmax": argmax, "gap": gap}


@torch.no_grad()
def _record(model: LoopedModel, x: torch.Tensor, y: torch.Tensor, h0: torch.Tensor | None,
            depth: int, batch_size: int, fields: tuple[str, ...], keep_states: int
            ) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """Run every token to uniform depth `depth`, reading out every loop; per field of
    FIELDS asked for, a (depth, tokens) array, and the states of loops 1..keep_states.

    The vocabulary-wide math (log-softmax, CE, KL, argmax) runs in row chunks
    (model.row_chunks), bit-identical to whole batches and several times faster;
    the previous loop's log-probabilities live in a buffer swapped with the current."""
    rows: dict[str, list[list[np.ndarray]]] = {k: [[] for _ in range(depth)] for k in fields}
    states: list[list[np.ndarray]] = [[] for _ in range(keep_states)]
    logits_needed = bool({"ce", "kl", "argmax", "gap"} & set(fields))
    for i in range(0, len(x), batch_size):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size].flatten()
        e = model.inputs(xb)
        h = model.initial_state(e) if h0 is None else h0[i:i + batch_size].to(e.dtype)
        prev = cur = None  # log-probabilities of the previous and current loop (N, V)
        older = None  # the state two loops before the new one
        for k in range(depth):
            new = model.step(model.carry(h, first=k == 0), e, k=k + 1)  # from H_k (loop 1: H_0)
            values: dict[str, torch.Tensor] = {}
            if logits_needed:
                logits = model.read(new, last=True).flatten(0, 1)
                if "kl" in fields and cur is None:
                    cur = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
                values.update(_read_out(logits, yb, prev, cur, fields))
                prev, cur = cur, prev
            if "change" in fields:
                values["change"] = relative_change(new.float(), h.float())
            if "angle" in fields:
                values["angle"] = angle(h, new)
            if "change2" in fields:
                values["change2"] = (relative_change(new.float(), older.float())
                                     if older is not None else
                                     torch.full(new.shape[:-1], float("nan"), device=new.device))
            if "backward" in fields:
                values["backward"] = (_points_back(new - h, h - older) if older is not None
                                      else torch.zeros(new.shape[:-1], dtype=torch.bool,
                                                       device=new.device))
            for key in fields:
                rows[key][k].append(values[key].flatten().cpu().numpy())
            if k < keep_states:
                states[k].append(new.float().flatten(0, 1).cpu().numpy())
            older, h = h, new
    cat = {key: np.stack([np.concatenate(r) for r in per]) for key, per in rows.items()}
    return cat, (np.stack([np.concatenate(s) for s in states]) if states else None)


def trajectory(model: LoopedModel, x: torch.Tensor, y: torch.Tensor, h0: torch.Tensor | None,
               depth: int, batch_size: int, keep_states: int = 0) -> Trajectory:
    """Run every token to uniform depth `depth`, reading out every loop (module doc)."""
    cat, states = _record(model, x, y, h0, depth, batch_size, FIELDS, keep_states)
    return Trajectory(ce=cat["ce"].astype(np.float64), kl=cat["kl"], change=cat["change"],
                      angle=cat["angle"], argmax=cat["argmax"].astype(np.int32),
                      states=states, change2=cat["change2"], backward=cat["backward"],
                      gap=cat["gap"])


def uniform_ce(model: LoopedModel, x: torch.Tensor, y: torch.Tensor, h0: torch.Tensor | None,
               depth: int, batch_size: int) -> np.ndarray:
    """Per depth 1..depth and token, the CE of the prediction read at that loop:
    trajectory(...).ce, bit for bit, without the KL, argmax and state math no reader
    of the `choose` windows or of depth R's baseline needs. (depth, tokens), float64."""
    return _record(model, x, y, h0, depth, batch_size, ("ce",), 0)[0]["ce"].astype(np.float64)

