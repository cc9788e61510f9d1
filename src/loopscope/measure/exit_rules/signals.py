"""Per-token distances between loops: what a trajectory records and what the exit
rules compare (KL between next-token distributions, the relative state change, the
angle of an update)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def minp_log_probs(logits: torch.Tensor, ratio: float = 0.1) -> torch.Tensor:
    """Huginn's min-p filter: every token below ratio x the top probability gets
    probability 1/V, then the whole is renormalized; log-probabilities (N, V)."""
    p = F.softmax(logits.float(), dim=-1)
    p = torch.where(p < ratio * p.max(-1, keepdim=True).values, 1.0 / p.shape[-1], p)
    return (p / p.sum(-1, keepdim=True)).log()


def kl_divergence(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last axis from log-probabilities, clamped at 0 (round-off)."""
    return (logp.exp() * (logp - logq)).sum(-1).clamp_min(0.0)


def relative_change(now: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """||now - prev|| / ||now|| per token."""
    return (now - prev).norm(dim=-1) / now.norm(dim=-1).clamp_min(1e-12)


def angle(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Angle (radians) between a and b per token, in float32."""
    cos = F.cosine_similarity(a.float(), b.float(), dim=-1)
    return torch.arccos(cos.clamp(-1.0, 1.0))
