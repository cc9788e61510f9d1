"""The settle-depth oracle: the bound every exit rule is measured against.

Per token, the oracle's settle loop is the first loop from which the prediction (the
argmax read at that loop) never changes again, up to the last loop measured D
(convergence.depth_factor x R), seen in hindsight (Prediction Dynamics, arXiv
2609.21383). The margin version also asks the prediction to lead the runner-up by at
least `margin` nats (top-1 minus top-2 log-probability) at every loop from there on: a
prediction that is right but undecided has not settled. A token whose last loop fails
the margin never settles: D + 1.

An exit rule's exit at loop e, with final prediction p, is read against the oracle's
settle loop s and depth R's prediction p_R (uniform depth R, where the rules are capped):
- premature: e < s and p != p_R (it stopped before the prediction settled, and it
  shows);
- early but right: e < s and p == p_R;
- lateness: for every exit that is not premature, max(0, e - min(s, R)), loops run past
  the oracle's exit (a rule capped at R cannot exit later than R, nor can the oracle);
- depth over the oracle: the rule's mean exit loop over the oracle's mean min(s, R).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from loopscope.stats.intervals import Sample


def settle_loop(argmax: np.ndarray, gap: np.ndarray | None = None, margin: float = 0.0
                ) -> np.ndarray:
    """Per token (columns of (D, N) arrays, rows loops 1..D), the first loop from which
    the argmax equals the last loop's through loop D, and, given gap (the top-1 minus
    top-2 log-probability per loop), leads by at least `margin` nats there too. D + 1
    where the last loop itself fails (int32)."""
    argmax = np.asarray(argmax)
    ok = argmax == argmax[-1]
    if gap is not None:
        ok &= np.asarray(gap) >= margin
    bad = ~ok
    d = argmax.shape[0]
    last_from_end = np.argmax(bad[::-1], axis=0)  # rows after the last bad loop
    return np.where(bad.any(axis=0), d - last_from_end + 1, 1).astype(np.int32)


@dataclass
class Oracle:
    """The oracle on a set of tokens (flattened, reading order): its settle loop, plain
    and margin version, and depth R's prediction, which a premature exit's differs from."""

    settle: np.ndarray  # (N,) int32, 1 .. D + 1
    settle_margin: np.ndarray  # (N,) int32
    pred_r: np.ndarray  # (N,) the argmax at uniform depth R
    r: int
    depth: int  # D, the last loop the oracle looked at

    @classmethod
    def of(cls, argmax: np.ndarray, gap: np.ndarray, r: int, margin: float) -> Oracle:
        """From (D, N) predictions and leads (trajectories.predictions), D >= R."""
        if argmax.shape[0] < r:
            raise ValueError(f"the oracle needs loops up to R = {r} at least; got "
                             f"{argmax.shape[0]}")
        return cls(settle_loop(argmax), settle_loop(argmax, gap, margin),
                   np.asarray(argmax[r - 1]), r, int(argmax.shape[0]))

    @classmethod
    def concat(cls, parts: list[Oracle]) -> Oracle:
        """The tokens of several runs (seeds) side by side."""
        return cls(*(np.concatenate([getattr(p, f) for p in parts])
                     for f in ("settle", "settle_margin", "pred_r")),
                   parts[0].r, parts[0].depth)

    def capped(self, margin: bool = False) -> np.ndarray:
        """The settle loop at most R: the earliest exit a rule capped at R could make
        without changing its prediction from the oracle's."""
        return np.minimum(self.settle_margin if margin else self.settle, self.r)


@dataclass
class AgainstOracle:
    """Per token, an exit rule's exits read against the oracle (module doc)."""

    premature: np.ndarray  # bool
    early_right: np.ndarray  # bool
    lateness: np.ndarray  # loops past min(s, R); 0 where premature (not counted there)

    @classmethod
    def of(cls, exit_loop: np.ndarray, pred: np.ndarray, oracle: Oracle) -> AgainstOracle:
        exit_loop = np.asarray(exit_loop)
        early = exit_loop < oracle.settle
        same = np.asarray(pred) == oracle.pred_r
        premature = early & ~same
        late = np.maximum(exit_loop - oracle.capped(), 0)
        return cls(premature, early & same, np.where(premature, 0, late).astype(np.float64))


def describe(oracle: Oracle, sample: Sample) -> dict[str, Any]:
    """The oracle's own numbers on a cell's tokens, with intervals over the sample's
    resamples: the mean settle loop capped at R (plain and margin), the share settled
    by R, and the share of tokens per settle loop (1 .. R, and "after R")."""
    iv = sample.interval
    capped, capped_m = oracle.capped(), oracle.capped(margin=True)
    after = f"after{oracle.r}"
    by = {f"k{k}": float(np.mean(oracle.settle == k)) for k in range(1, oracle.r + 1)}
    by[after] = float(np.mean(oracle.settle > oracle.r))
    return {"r": oracle.r, "depth": oracle.depth,
            "settle_capped": iv(sample.mean(capped.astype(np.float64))).to_dict(),
            "settle_margin_capped": iv(sample.mean(capped_m.astype(np.float64))).to_dict(),
            "settled_by_r": iv(sample.mean((oracle.settle <= oracle.r).astype(np.float64)))
            .to_dict(),
            "settled_by_r_margin": iv(sample.mean(
                (oracle.settle_margin <= oracle.r).astype(np.float64))).to_dict(),
            "by_settle": by}


def rule_vs_oracle(exit_loop: np.ndarray, pred: np.ndarray, oracle: Oracle, sample: Sample
                   ) -> dict[str, Any]:
    """One rule's exits against the oracle, with intervals over the sample's resamples
    (paired: every statistic reads the same draws): the premature and early-but-right
    shares, the mean lateness of the exits that are not premature, the rule's mean
    depth over the oracle's (plain and margin version), and the rule's mean exit loop
    per oracle settle loop (the plot's points; "after R" pools the tokens that settle
    later)."""
    a = AgainstOracle.of(exit_loop, pred, oracle)
    iv = sample.interval
    loops = np.asarray(exit_loop, np.float64)
    rest = (~a.premature).astype(np.float64)
    by: dict[str, float] = {}
    for k in range(1, oracle.r + 2):
        at = (oracle.settle == k) if k <= oracle.r else (oracle.settle > oracle.r)
        if at.any():
            by[f"k{k}" if k <= oracle.r else f"after{oracle.r}"] = float(loops[at].mean())
    return {
        "premature": iv(sample.mean(a.premature.astype(np.float64))).to_dict(),
        "early_right": iv(sample.mean(a.early_right.astype(np.float64))).to_dict(),
        "lateness": iv(sample.total(a.lateness) / np.maximum(sample.total(rest), 1e-300))
        .to_dict(),
        "depth_over_oracle": iv(sample.total(loops) / sample.total(
            oracle.capped().astype(np.float64))).to_dict(),
        "depth_over_oracle_margin": iv(sample.total(loops) / sample.total(
            oracle.capped(margin=True).astype(np.float64))).to_dict(),
        "exit_by_settle": by,
    }
