"""Depth policies (paper B) and the one definition of what a per-token exit means.

Exit semantics, used by every policy here and matched by the fast runtime
(loopscope.runtime):
- a token that exits at loop i keeps its state H_i;
- at later loops the other tokens' attention sees, in each core block, the keys and
  values the exited token computed at loop i (Huginn's "latest" reuse);
- an exit check at loop i reads the coda and head over every token's current state
  (an exited token's current state is its exit state);
- the final output runs the coda and the readout once over every token's exit state.

`masked_forward` is the reference: it computes every token at every loop and applies
the exits by masking, so it costs as much as uniform depth; the runtime skips the work.

A policy is a small class with one interface, chosen by name (`make`):
    check(loop, h, logits) -> bool mask of the tokens that exit after this loop
    needs_logits: whether the check reads the coda and head (KL) or the state alone
Rules: uniform (A0, no checks), kl (A1), probe (A2), and Huginn's head-free rules
latent (relative state change) and cosine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from loopscope.claims import bootstrap_mean
from loopscope.model import LoopedLM


class MaskedKV:
    """One core block's attention in the masked reference: every token computes its
    keys and values, but an exited token's stay those of its exit loop."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.active: torch.Tensor | None = None  # (B, T) bool, set before each loop

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.k is None:
            self.k, self.v = k, v
        else:
            keep = self.active[:, None, :, None]
            self.k, self.v = torch.where(keep, k, self.k), torch.where(keep, v, self.v)
        return F.scaled_dot_product_attention(q, self.k, self.v, is_causal=True)


class Policy:
    """An exit rule. Checks run at loops first, first + every, ...; a rule comparing
    two loops compares the current check with the previous one.

    check() sees the tokens being checked as flat rows: the loop each has run (N,),
    their states (N, d), their next-token logits (N, V) when the rule reads them, and
    their positions idx in the flattened batch (B * T), so the masked reference (every
    token), the runtime (only the active ones) and decoding (streams at different
    loops) call it alike.
    """

    name = "uniform"
    needs_logits = False

    def __init__(self, threshold: float = 0.0, first: int = 1, every: int = 1) -> None:
        self.threshold, self.first, self.every = threshold, first, every

    def checks_at(self, loop: int) -> bool:
        return loop >= self.first and (loop - self.first) % self.every == 0

    def reset(self, n_tokens: int) -> None:
        """A new batch of n_tokens tokens: forget every previous check."""
        self.n_tokens = n_tokens

    def check(self, loops: torch.Tensor, h: torch.Tensor, logits: torch.Tensor | None,
              idx: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(h), dtype=torch.bool, device=h.device)


class Uniform(Policy):
    """A0: no token exits early; every token runs the cap (uniform depth r)."""

    def checks_at(self, loop: int) -> bool:
        return False


class _Compare(Policy):
    """A rule that measures how much something moved since the token's previous check."""

    def reset(self, n_tokens: int) -> None:
        super().reset(n_tokens)
        self.prev: torch.Tensor | None = None
        self.seen: torch.Tensor | None = None

    def check(self, loops: torch.Tensor, h: torch.Tensor, logits: torch.Tensor | None,
              idx: torch.Tensor) -> torch.Tensor:
        now = self.signal(h, logits)
        if self.prev is None:
            self.prev = now.new_zeros((self.n_tokens, *now.shape[1:]))
            self.seen = torch.zeros(self.n_tokens, dtype=torch.bool, device=now.device)
        leaving = (self.distance(now, self.prev[idx]) < self.threshold) & self.seen[idx]
        self.prev[idx] = now
        self.seen[idx] = True
        return leaving


class KL(_Compare):
    """A1: exit once KL(p_i || p_prev) < threshold (paper B's direction; Huginn's code
    computes the reverse), p the next-token distribution read at each check."""

    name = "kl"
    needs_logits = True

    @staticmethod
    def signal(h: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        return F.log_softmax(logits.float(), dim=-1)

    @staticmethod
    def distance(now: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        return kl_divergence(now, prev)


class _StateCompare(_Compare):
    """A head-free rule: compares the state itself, so a check costs no readout."""

    @staticmethod
    def signal(h: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        return h.float()


class Latent(_StateCompare):
    """Huginn's latent-diff: exit once ||h_i - h_prev|| / ||h_i|| < threshold."""

    name = "latent"
    distance = staticmethod(lambda now, prev: relative_change(now, prev))


class Cosine(_StateCompare):
    """Huginn's cosine rule: exit once 1 - cos(h_i, h_prev) < threshold."""

    name = "cosine"
    distance = staticmethod(lambda now, prev: 1.0 - F.cosine_similarity(now, prev, dim=-1))


class Probe(Policy):
    """A2: a linear probe on the state predicts whether the token's argmax will still
    change at a later loop; exit once its probability is below threshold."""

    name = "probe"

    def __init__(self, weight: torch.Tensor, bias: float, threshold: float = 0.5,
                 first: int = 1, every: int = 1) -> None:
        super().__init__(threshold, first, every)
        self.weight, self.bias = weight, bias

    def check(self, loops: torch.Tensor, h: torch.Tensor, logits: torch.Tensor | None,
              idx: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(h.float() @ self.weight.to(h.device) + self.bias) < self.threshold


RULES = {"uniform": Uniform, "kl": KL, "latent": Latent, "cosine": Cosine, "probe": Probe}


def kl_divergence(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last axis from log-probabilities, clamped at 0 (round-off)."""
    return (logp.exp() * (logp - logq)).sum(-1).clamp_min(0.0)


def relative_change(now: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """||now - prev|| / ||now|| per token."""
    return (now - prev).norm(dim=-1) / now.norm(dim=-1).clamp_min(1e-12)


@dataclass
class ExitRun:
    """What a policy did on a batch: per-token final logits (B, T, V) of the coda and
    readout over the exit states (B, T, d), the loop each token exited after, how many
    checks it was part of, and the angle of its last update (radians)."""

    logits: torch.Tensor
    state: torch.Tensor
    exit_loop: torch.Tensor
    checks: torch.Tensor
    last_angle: torch.Tensor


@torch.no_grad()
def masked_forward(model: LoopedLM, idx: torch.Tensor, policy: Policy, cap: int,
                   h0: torch.Tensor | None = None) -> ExitRun:
    """The reference semantics (module doc): run up to `cap` loops, exiting tokens as
    the policy says; tokens still active after loop `cap` exit there."""
    e = model.inputs(idx)
    h = model.initial_state(e) if h0 is None else h0.to(e.dtype)
    kvs = [MaskedKV() for _ in model.core]
    active = torch.ones(idx.shape, dtype=torch.bool, device=idx.device)
    exit_loop = torch.full(idx.shape, cap, dtype=torch.long, device=idx.device)
    checks = torch.zeros(idx.shape, dtype=torch.long, device=idx.device)
    last_angle = torch.zeros(idx.shape, dtype=torch.float32, device=idx.device)
    tokens = torch.arange(idx.numel(), device=idx.device)
    policy.reset(idx.numel())
    for loop in range(1, cap + 1):
        for kv in kvs:
            kv.active = active
        new = model.step(model.carry(h, first=loop == 1), e, kvs)
        last_angle = torch.where(active, angle(h, new), last_angle)
        h = torch.where(active[..., None], new, h)
        if loop == cap or not policy.checks_at(loop):
            continue
        logits = model.read(h, last=True).flatten(0, 1) if policy.needs_logits else None
        checks += active
        loops = torch.full_like(tokens, loop)
        leaving = policy.check(loops, h.flatten(0, 1), logits, tokens).view(idx.shape) & active
        exit_loop[leaving] = loop
        active &= ~leaving
        if not active.any():
            break
    return ExitRun(model.read(h, last=True), h, exit_loop, checks, last_angle)


def angle(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Angle (radians) between a and b per token, in float32."""
    cos = F.cosine_similarity(a.float(), b.float(), dim=-1)
    return torch.arccos(cos.clamp(-1.0, 1.0))


@dataclass
class PolicyResult:
    """A policy on a set of windows, per token (flattened, reading order)."""

    ce: np.ndarray  # cross-entropy of the final output, nats
    exit_loop: np.ndarray
    checks: np.ndarray
    last_angle: np.ndarray

    @property
    def mean_loops(self) -> float:
        return float(self.exit_loop.mean())


@torch.no_grad()
def evaluate(model: LoopedLM, x: torch.Tensor, y: torch.Tensor, h0: torch.Tensor | None,
             policy: Policy, cap: int, batch_size: int) -> PolicyResult:
    """Run masked_forward over windows (x, y) in batches; per-token results."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("ce", "exit", "checks", "angle")}
    for i in range(0, len(x), batch_size):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size]
        run = masked_forward(model, xb, policy, cap, None if h0 is None else h0[i:i + batch_size])
        ce = F.cross_entropy(run.logits.flatten(0, 1).float(), yb.flatten(), reduction="none")
        parts["ce"].append(ce.double().cpu().numpy())
        parts["exit"].append(run.exit_loop.flatten().cpu().numpy())
        parts["checks"].append(run.checks.flatten().cpu().numpy())
        parts["angle"].append(run.last_angle.flatten().cpu().numpy())
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    return PolicyResult(cat["ce"], cat["exit"], cat["checks"], cat["angle"])


def flops_per_token(model: LoopedLM, exit_loop: np.ndarray, checks: np.ndarray,
                    reads_logits: bool) -> float:
    """Mean forward FLOPs per token of exit decisions: prelude, each loop a token ran,
    each check it was part of (a coda and head pass for a rule that reads logits, a
    few d-sized vector operations for a head-free one), and the final readout.
    Attention counted at the mean query position (see LoopedLM.cost)."""
    cost = model.cost()
    check = cost.readout if reads_logits else 4 * model.cfg.d_model
    return float(cost.prelude + cost.loop * np.mean(exit_loop) + check * np.mean(checks)
                 + cost.readout)


def make(name: str, threshold: float = 0.0, first: int = 1, every: int = 1,
         probe: tuple[torch.Tensor, float] | None = None) -> Policy:
    """The policy `name` (one of RULES) at a threshold."""
    if name == "probe":
        if probe is None:
            raise ValueError("the probe policy needs its trained weights")
        return Probe(probe[0], probe[1], threshold, first, every)
    return RULES[name](threshold, first, every)


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


@dataclass
class Outcome:
    """A policy setting on one window set, tokens of all seeds pooled."""

    rule: str
    threshold: float
    ce: np.ndarray
    loops: np.ndarray
    flops: float  # mean forward FLOPs per token

    @property
    def mean_ce(self) -> float:
        return float(self.ce.mean())


def matched(outcomes: list[Outcome], target: float, match: float) -> Outcome | None:
    """The setting with the fewest mean loops whose mean CE is within `match` nats of
    target (uniform depth R's), or None when no setting gets there."""
    ok = [o for o in outcomes if o.mean_ce <= target + match]
    return min(ok, key=lambda o: (o.loops.mean(), o.flops)) if ok else None


def pool(results: list[PolicyResult]) -> PolicyResult:
    """The tokens of several runs (seeds) as one result."""
    return PolicyResult(*(np.concatenate([getattr(r, f) for r in results])
                          for f in ("ce", "exit_loop", "checks", "last_angle")))


def settings(grids: dict[str, list[float]]) -> list[tuple[str, float]]:
    """Every (rule, threshold) of the grids, in a fixed order."""
    return [(rule, float(t)) for rule, grid in grids.items() for t in grid]


def summarize(model: LoopedLM, uniform: dict[str, np.ndarray],
              results: dict[tuple[str, float], dict[str, PolicyResult]], docs: np.ndarray,
              reference: int, match: float, resamples: int
              ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """metrics/policies/<cell>.json and the frontier rows, from pooled per-token results.

    uniform[set]: CE per depth 1..R and token, (R, N). results[(rule, threshold)][set].
    Thresholds are chosen on the `choose` windows (matched quality: mean CE within
    `match` nats of uniform depth R); what is reported is measured on `report`.
    """
    cost, r = model.cost(), reference
    outcomes: dict[str, dict[str, list[Outcome]]] = {"choose": {}, "report": {}}
    for s in outcomes:
        outcomes[s]["uniform"] = [
            Outcome("uniform", k, uniform[s][k - 1], np.full(uniform[s].shape[1], k),
                    cost.uniform(k)) for k in range(1, r + 1)]
        for (rule, threshold), per_set in results.items():
            res = per_set[s]
            outcomes[s].setdefault(rule, []).append(Outcome(
                rule, threshold, res.ce, res.exit_loop,
                flops_per_token(model, res.exit_loop, res.checks, RULES[rule].needs_logits)))
    base = {s: outcomes[s]["uniform"][r - 1] for s in outcomes}
    depth = matched(outcomes["choose"]["uniform"], base["choose"].mean_ce, match)
    m = int(depth.threshold)
    report_uniform = outcomes["report"]["uniform"]
    metrics: dict[str, Any] = {
        "reference_depth": r, "match_nats": match,
        "uniform": {
            "ce": {f"k{o.threshold}": o.mean_ce for o in report_uniform},
            "flops": {f"k{o.threshold}": o.flops for o in report_uniform},
            "matched_depth": m,
            "delta_ce": bootstrap_mean(report_uniform[m - 1].ce - base["report"].ce, docs,
                                       resamples).to_dict()},
    }
    for rule in outcomes["choose"]:
        if rule == "uniform":
            continue
        chosen = matched(outcomes["choose"][rule], base["choose"].mean_ce, match)
        if chosen is None:
            metrics[rule] = {"matched": False}
            continue
        got = next(o for o in outcomes["report"][rule] if o.threshold == chosen.threshold)
        metrics[rule] = {
            "matched": True, "threshold": chosen.threshold,
            "mean_loops": float(got.loops.mean()), "ce": got.mean_ce,
            "delta_ce": bootstrap_mean(got.ce - base["report"].ce, docs, resamples).to_dict(),
            "flops_ratio": got.flops / base["report"].flops,
            "flops_ratio_matched_uniform": got.flops / report_uniform[m - 1].flops,
        }
    rows = [{"set": s, "rule": o.rule, "threshold": o.threshold,
             "mean_loops": float(o.loops.mean()), "ce": o.mean_ce, "flops": o.flops,
             "flops_ratio": o.flops / base[s].flops}
            for s in outcomes for group in outcomes[s].values() for o in group]
    return metrics, rows
