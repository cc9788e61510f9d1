"""A2's probe (paper B): oracle labels from the argmax path of a uniform trajectory
(whether a token's argmax still changes at a later loop), and a linear probe on the
state fit to them by logistic regression."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from loopscope.measure.trajectory.trajectories import Trajectory


def argmax_changes_later(argmax: np.ndarray, upto: int) -> np.ndarray:
    """A2's oracle labels: for loops i = 1..upto-1 (rows) and tokens, whether the
    token's argmax at some later loop j in (i, upto] differs from its argmax at i."""
    a = argmax[:upto]
    labels = np.zeros((upto - 1, a.shape[1]), dtype=bool)
    for i in range(upto - 1):
        labels[i] = (a[i + 1:] != a[i]).any(axis=0)
    return labels


def fit_probe(traj: Trajectory, r: int) -> tuple[torch.Tensor, float]:
    """A2's probe from a uniform trajectory to depth R that kept the states of loops
    1..R-1: oracle labels from the argmax path, logistic regression on the states."""
    labels = argmax_changes_later(traj.argmax, r)
    states = traj.states[: r - 1]
    return train_probe(torch.from_numpy(states.reshape(-1, states.shape[-1])),
                       torch.from_numpy(labels.reshape(-1)))


def train_probe(states: torch.Tensor, labels: torch.Tensor, steps: int = 200,
                l2: float = 1e-4) -> tuple[torch.Tensor, float]:
    """Fit A2's linear probe: logistic regression of labels (N,) on states (N, d),
    standardized inside (the weights returned act on raw states); L-BFGS, float64."""
    x = states.double()
    mu, sd = x.mean(0), x.std(0).clamp_min(1e-6)
    z = (x - mu) / sd
    yv = labels.double()
    w = torch.zeros(z.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

    def loss_fn() -> torch.Tensor:
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(z @ w + b, yv) + l2 * w.pow(2).sum()
        loss.backward()
        return loss

    opt.step(loss_fn)
    weight = (w / sd).detach()
    bias = float((b - (mu / sd) @ w).detach())
    if not math.isfinite(bias):
        raise ValueError("the probe did not converge (non-finite weights)")
    return weight.float(), bias
