"""Per-token fixed-point convergence (paper B): what happens to each token's state and
prediction as the loop runs past the training depth.

A uniform-depth `trajectory` records, per token and loop i = 1..D: the cross-entropy
of the prediction read at loop i (coda and final readout over every token's loop-i
state), KL(p_i || p_{i-1}) between successive next-token distributions (paper B's
direction), the relative state change ||h_i - h_{i-1}|| / ||h_i||, the angle of the
update, and the argmax. From it: elasticity (CE per depth), the convergence loop of
each token, the useful depth (saturation), and the same by token type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from loopscope.claims import bootstrap, bootstrap_mean
from loopscope.model import LoopedLM
from loopscope.policies import (
    PolicyResult,
    angle,
    kl_divergence,
    relative_change,
    train_probe,
)

# The token types, in the order they are tested (the first that matches wins).
TOKEN_TYPES = ("whitespace", "punctuation", "number", "function word", "content word")
NUMBER = re.compile(r"[\d.,:/-]*\d[\d.,:/-]*")
# A closed list of English function words: articles and determiners, pronouns (with
# Early Modern English forms, for the embedded Shakespeare), prepositions,
# conjunctions, auxiliary and modal verbs, and a few particles.
FUNCTION_WORDS = frozenset("""
a an the this that these those each every either neither some any no none all both
few many much more most several such what which whose whatever whichever
i me my mine myself we us our ours ourselves you your yours yourself yourselves
he him his himself she her hers herself it its itself they them their theirs
themselves thou thee thy thine thyself ye who whom whoever one ones
of in on at by for with about against between into through during before after
above below to from up down out off over under again upon unto till until within
without toward towards among amongst across along beside besides beyond near since
o'er than like ere
and but or nor so yet if then else because although though while whereas whether
unless lest as whence whither wherefore when where why how
be am is are was were been being have has had having do does did done doing
shall should will would may might must can could hath doth dost art wast wert shalt
wilt canst couldst wouldst shouldst hast didst
not no nay yea yes aye o oh ah ay there here now too very just only also even
""".split())


def token_type(text: str) -> str:
    """The type of a decoded token (its text stripped of surrounding whitespace)."""
    s = text.strip()
    if not s:
        return "whitespace"
    if not any(c.isalnum() for c in s):
        return "punctuation"
    if NUMBER.fullmatch(s):
        return "number"
    return "function word" if s.lower() in FUNCTION_WORDS else "content word"


def vocab_types(tok: Tokenizer) -> np.ndarray:
    """The TOKEN_TYPES index of every token id of the tokenizer."""
    names = [token_type(tok.decode([i])) for i in range(tok.get_vocab_size())]
    return np.array([TOKEN_TYPES.index(n) for n in names], dtype=np.int8)


@dataclass
class Trajectory:
    """Per loop i (row i - 1) and token (column, reading order)."""

    ce: np.ndarray  # (D, N) nats, the prediction read at loop i
    kl: np.ndarray  # (D, N) KL(p_i || p_{i-1}); row 0 (no previous) is nan
    change: np.ndarray  # (D, N) ||h_i - h_{i-1}|| / ||h_i|| (h_0: the initial state)
    angle: np.ndarray  # (D, N) radians between h_{i-1} and h_i
    argmax: np.ndarray  # (D, N) predicted token id
    states: np.ndarray | None  # (keep, N, d) h_1..h_keep, float32, if asked for

    @property
    def depth(self) -> int:
        return self.ce.shape[0]

    @classmethod
    def concat(cls, trajs: list[Trajectory]) -> Trajectory:
        """The tokens of several runs (seeds) side by side; states are dropped."""
        fields = ("ce", "kl", "change", "angle", "argmax")
        return cls(*(np.concatenate([getattr(t, f) for t in trajs], axis=1) for f in fields),
                   states=None)


@torch.no_grad()
def trajectory(model: LoopedLM, x: torch.Tensor, y: torch.Tensor, h0: torch.Tensor | None,
               depth: int, batch_size: int, keep_states: int = 0) -> Trajectory:
    """Run every token to uniform depth `depth`, reading out every loop (module doc)."""
    rows: dict[str, list[list[np.ndarray]]] = {
        k: [[] for _ in range(depth)] for k in ("ce", "kl", "change", "angle", "argmax")}
    states: list[list[np.ndarray]] = [[] for _ in range(keep_states)]
    for i in range(0, len(x), batch_size):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size]
        e = model.inputs(xb)
        h = model.initial_state(e) if h0 is None else h0[i:i + batch_size].to(e.dtype)
        prev = None
        for k in range(depth):
            new = model.step(model.carry(h, first=k == 0), e)  # from H_k (loop 1: H_0)
            logp = F.log_softmax(model.read(new, last=True).float(), dim=-1)
            values = {
                "ce": -logp.gather(-1, yb[..., None])[..., 0],
                "kl": (kl_divergence(logp, prev) if prev is not None
                       else torch.full(yb.shape, float("nan"), device=yb.device)),
                "change": relative_change(new.float(), h.float()),
                "angle": angle(h, new),
                "argmax": logp.argmax(-1),
            }
            for key, value in values.items():
                rows[key][k].append(value.flatten().cpu().numpy())
            if k < keep_states:
                states[k].append(new.float().flatten(0, 1).cpu().numpy())
            h, prev = new, logp
    cat = {key: np.stack([np.concatenate(r) for r in per]) for key, per in rows.items()}
    return Trajectory(ce=cat["ce"].astype(np.float64), kl=cat["kl"], change=cat["change"],
                      angle=cat["angle"], argmax=cat["argmax"].astype(np.int32),
                      states=np.stack([np.concatenate(s) for s in states]) if states else None)


def convergence_loop(kl: np.ndarray, eps: float) -> np.ndarray:
    """Per token, the first loop after which KL(p_j || p_{j-1}) stays below eps up to
    the last loop D: 1 + the last j with KL_j >= eps, so the loop that made the last
    large change (1 if none did). D means still changing at the last loop measured."""
    above = kl[1:] >= eps  # rows: loops 2..D
    d = kl.shape[0]
    last_from_end = np.argmax(above[::-1], axis=0)
    return np.where(above.any(axis=0), d - last_from_end, 1).astype(np.int32)


def useful_depth(ce_by_depth: np.ndarray, tolerance: float) -> int:
    """Saturation: the smallest depth whose mean CE is within tolerance of the best."""
    ce_by_depth = np.asarray(ce_by_depth)
    return int(np.argmax(ce_by_depth <= ce_by_depth.min() + tolerance)) + 1


def argmax_changes_later(argmax: np.ndarray, upto: int) -> np.ndarray:
    """A2's oracle labels: for loops i = 1..upto-1 (rows) and tokens, whether the
    token's argmax at some later loop j in (i, upto] differs from its argmax at i."""
    a = argmax[:upto]
    labels = np.zeros((upto - 1, a.shape[1]), dtype=bool)
    for i in range(upto - 1):
        labels[i] = (a[i + 1:] != a[i]).any(axis=0)
    return labels


def summarize(traj: Trajectory, docs: np.ndarray, types: np.ndarray, reference: int,
              epsilon: float, tolerance: float, resamples: int) -> dict[str, Any]:
    """metrics/convergence/<cell>.json from a trajectory (tokens of all seeds pooled):
    per-depth and per-loop means, elasticity and saturation, the convergence loop
    overall and by token type; intervals resample documents (docs: one per token)."""
    d, r = traj.depth, reference
    conv = convergence_loop(traj.kl, epsilon)
    mean_ce = traj.ce.mean(axis=1)
    out: dict[str, Any] = {
        "reference_depth": r, "max_depth": d, "tokens": int(traj.ce.shape[1]),
        "ce_at_depth": {f"k{k}": float(v) for k, v in enumerate(mean_ce, 1)},
        "kl": {f"k{k}": float(np.mean(traj.kl[k - 1])) for k in range(2, d + 1)},
        "state_change": {f"k{k}": float(v) for k, v in enumerate(traj.change.mean(1), 1)},
        "angle": {f"k{k}": float(v) for k, v in enumerate(traj.angle.mean(1), 1)},
        "elasticity": {
            "gain": bootstrap_mean(traj.ce[0] - traj.ce[r - 1], docs, resamples).to_dict(),
            "tail": bootstrap_mean(traj.ce[d - 1] - traj.ce[r - 1], docs, resamples).to_dict(),
            "margin": tolerance},
        "saturation": {"useful_depth": useful_depth(mean_ce, tolerance),
                       "tolerance": tolerance},
        "convergence": {
            "epsilon": epsilon, "median_loop": float(np.median(conv)),
            "mean_loop": float(conv.mean()),
            "share_after_reference": bootstrap_mean(conv > r, docs, resamples).to_dict(),
            "share_at_max_depth": float(np.mean(conv == d))},
    }
    by_type: dict[str, Any] = {}
    for i, name in enumerate(TOKEN_TYPES):
        mask = types == i
        if mask.any():
            by_type[name] = {"share": float(mask.mean()), "mean_loop": float(conv[mask].mean()),
                             "median_loop": float(np.median(conv[mask]))}
    ws, content = (types == TOKEN_TYPES.index(t) for t in ("whitespace", "content word"))
    if ws.any() and content.any():
        by_type["content_minus_whitespace"] = bootstrap(
            {"c": conv * content, "nc": content, "w": conv * ws, "nw": ws}, docs,
            lambda s: s["c"] / np.maximum(s["nc"], 1) - s["w"] / np.maximum(s["nw"], 1),
            resamples).to_dict()
    out["types"] = by_type
    return out


def cross_analysis(traj: Trajectory, run: PolicyResult, docs: np.ndarray,
                   resamples: int) -> dict[str, Any]:
    """Paper B's KL exit on a cell (tokens of all seeds pooled): where it fires, the CE
    there against the best uniform depth, and how far the state still turned at the
    exit (a scale-drifting state freezes: a small angle, not a converged one)."""
    mean_ce = traj.ce.mean(axis=1)
    best = int(np.argmin(mean_ce))
    hist = np.bincount(run.exit_loop, minlength=traj.depth + 1)[1:] / len(run.exit_loop)
    return {
        "mean_exit_loop": run.mean_loops,
        "exit_share": {f"k{k}": float(v) for k, v in enumerate(hist, 1)},
        "ce_at_exit": float(run.ce.mean()),
        "best_depth": best + 1,
        "ce_best_depth": float(mean_ce[best]),
        "delta_ce": bootstrap_mean(run.ce - traj.ce[best], docs, resamples).to_dict(),
        "angle_at_exit": float(run.last_angle.mean()),
        "angle_at_best_depth": float(traj.angle[best].mean()),
    }


def fit_probe(traj: Trajectory, reference: int) -> tuple[torch.Tensor, float]:
    """A2's probe from a uniform trajectory to depth R that kept the states of loops
    1..R-1: oracle labels from the argmax path, logistic regression on the states."""
    labels = argmax_changes_later(traj.argmax, reference)
    states = traj.states[: reference - 1]
    return train_probe(torch.from_numpy(states.reshape(-1, states.shape[-1])),
                       torch.from_numpy(labels.reshape(-1)))
