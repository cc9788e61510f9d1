"""Depth policies (paper B) and the one definition of what a per-token exit means.

Exit semantics, used by every policy here and matched by the fast runtime
(loopscope.runtime):
- a token that exits at loop i keeps its state H_i;
- at later loops the other tokens' attention sees, in each core block, the keys and
  values the exited token computed at loop i (Huginn's "latest" reuse);
- an exit check at loop i reads the coda and head over every token's current state
  (an exited token's current state is its exit state);
- the final output runs the coda and the readout once over every token's exit state.

`masked_forward` is the masked forward, the definition of an exit: it computes every
token at every loop and applies the exits by masking, so it costs as much as uniform
depth; the runtime skips the work.
A sweep of settings shares what they all compute: the loops before a batch's first exit
are recorded once, from a never-exiting run, and replayed (record, replay), bit for bit.

A policy is a small class with one interface, chosen by name (`make`), as Huginn's
exit evaluators are (recpre/raven_modeling_minimal.py):
    begin(idx, h0): the tokens' initial states, before loop 1
    check(loop, h, logits, idx) -> bool mask of the tokens that exit after this loop
    needs_logits: whether the check reads the coda and head or the state alone
    default, defaults: the rule's default threshold(s)
Rules (RULES): uniform (A0, no checks), kl (A1, paper B's KL(p_i || p_prev)), probe
(A2), and Huginn's rules by Huginn's names and defaults: kl-huginn (KL(p_prev || p_i),
first check against uniform), minp-kl, entropy-diff, latent-diff (relative state
change), cosine and argmax-stability.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from loopscope.model import LoopedLM, row_chunks, token_ce
from loopscope.stats import Documents
from loopscope.units import Units


class MaskedKV:
    """One core block's attention in the masked forward: every token computes its
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
    two loops compares the current check with the token's previous one.

    begin() hands the rule each token's initial state H_0 (Huginn's evaluators start
    from it). check() sees the tokens being checked as flat rows: the loop each has run
    (N,), their states (N, d), their next-token logits (N, V) when the rule reads them,
    and their positions idx in the flattened batch (B * T), so the masked forward
    (every token), the runtime (only the active ones) and decoding (streams at different
    loops) call it alike.

    `default` is the rule's default threshold (Huginn's, for the rules Huginn has);
    `defaults` lists more where more than one is worth evaluating.
    """

    name = "uniform"
    needs_logits = False
    default: float = 0.0
    defaults: tuple[float, ...] = ()

    def __init__(self, threshold: float = 0.0, first: int = 1, every: int = 1) -> None:
        self.threshold, self.first, self.every = threshold, first, every

    def checks_at(self, loop: int) -> bool:
        return loop >= self.first and (loop - self.first) % self.every == 0

    def reset(self, n_tokens: int) -> None:
        """A new batch of n_tokens tokens: forget every previous check."""
        self.n_tokens = n_tokens

    def begin(self, idx: torch.Tensor, h0: torch.Tensor) -> None:
        """Tokens idx start from states h0 (N, d), before their first loop."""

    def check(self, loops: torch.Tensor, h: torch.Tensor, logits: torch.Tensor | None,
              idx: torch.Tensor) -> torch.Tensor:
        return torch.zeros(len(h), dtype=torch.bool, device=h.device)

    def checks_before(self, cap: int) -> int:
        """How many checks a token that never exits is part of, under a cap."""
        return sum(self.checks_at(loop) for loop in range(1, cap))

    def can_exit(self, cap: int) -> bool:
        """False only where no token can exit before the cap, whatever the model does:
        such a setting's outcome is that of any other that cannot (never_exits), so it
        need not be run. True where it may (the conservative answer)."""
        return self.checks_before(cap) > 0


def never_exits(first: int = 1, every: int = 1) -> Policy:
    """A policy that checks at a rule's loops and never exits: masked_forward gives it
    the same states, CE, checks and angles as every setting whose can_exit is False
    (tests/test_policies.py shows it bit for bit), without reading the head."""
    return Policy(0.0, first, every)


class Uniform(Policy):
    """A0: no token exits early; every token runs the cap (uniform depth r)."""

    def checks_at(self, loop: int) -> bool:
        return False

    def can_exit(self, cap: int) -> bool:
        return False


class _Compare(Policy):
    """A rule that measures how far a per-token signal moved since the token's previous
    check. Before a token's first check, the previous signal is what begin() recorded
    or start() gives; with neither, the first check only records (it cannot exit)."""

    def reset(self, n_tokens: int) -> None:
        super().reset(n_tokens)
        self.prev: torch.Tensor | None = None
        self.seen: torch.Tensor | None = None

    def remember(self, idx: torch.Tensor, value: torch.Tensor) -> None:
        """Record the tokens' latest signal (the first call sizes the buffers)."""
        if self.prev is None:
            self.prev = value.new_zeros((self.n_tokens, *value.shape[1:]))
            self.seen = torch.zeros(self.n_tokens, dtype=torch.bool, device=value.device)
        self.prev[idx] = value
        self.seen[idx] = True

    def start(self, now: torch.Tensor) -> torch.Tensor | None:
        """The signal a token's first check compares with (None: nothing)."""
        return None

    def can_exit(self, cap: int) -> bool:
        """Every distance is >= 0 (norms, clamped KL and cosine distance), so a
        threshold of 0 never fires."""
        return self.threshold > 0 and super().can_exit(cap)

    def check(self, loops: torch.Tensor, h: torch.Tensor, logits: torch.Tensor | None,
              idx: torch.Tensor) -> torch.Tensor:
        if logits is None:
            return self._check(h, None, idx)
        return torch.cat([self._check(h[rows], logits[rows], idx[rows])
                          for rows in row_chunks(len(logits), logits.shape[-1])])

    def _check(self, h: torch.Tensor, logits: torch.Tensor | None, idx: torch.Tensor
               ) -> torch.Tensor:
        now = self.signal(h, logits)
        if self.prev is None:  # no signal recorded yet: size the buffers
            self.remember(idx[:0], now[:0])
        seen, prev = self.seen[idx], self.prev[idx]
        start = self.start(now)
        if start is not None:
            prev = torch.where(seen.view(-1, *[1] * (now.dim() - 1)), prev, start)
            seen = torch.ones_like(seen)
        leaving = (self.distance(now, prev) < self.threshold) & seen
        self.remember(idx, now)
        return leaving


class KL(_Compare):
    """A1: exit once KL(p_i || p_prev) < threshold (paper B's direction), p the
    next-token distribution read at each check; the first check has nothing to compare
    with. Huginn's own KL is kl-huginn."""

    name = "kl"
    needs_logits = True
    default = 1e-3

    @staticmethod
    def signal(h: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        return F.log_softmax(logits.float(), dim=-1)

    @staticmethod
    def distance(now: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        return kl_divergence(now, prev)


class KLHuginn(KL):
    """Huginn's kl: exit once KL(p_prev || p_i) < threshold (the reverse of A1's), the
    first check compared with the uniform distribution, so it can already exit.
    Huginn's default is 1e-3; its first release used 5e-4, so both are evaluated."""

    name = "kl-huginn"
    default, defaults = 1e-3, (1e-3, 5e-4)

    @staticmethod
    def start(now: torch.Tensor) -> torch.Tensor:
        return torch.full_like(now, -math.log(now.shape[-1]))

    @staticmethod
    def distance(now: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        return kl_divergence(prev, now)


class MinpKL(KLHuginn):
    """Huginn's minp-kl: kl-huginn between min-p filtered distributions (minp_log_probs),
    so the long tail of unlikely tokens cannot move the KL."""

    name = "minp-kl"
    default, defaults = 1e-5, ()

    @staticmethod
    def signal(h: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        return minp_log_probs(logits)


class EntropyDiff(_Compare):
    """Huginn's entropy-diff: exit once |H(p_i) - H(p_prev)| < threshold, H the entropy
    of the next-token distribution. Huginn starts from an entropy of 100, which no first
    check comes near (H <= ln V), so the first check only records."""

    name = "entropy-diff"
    needs_logits = True
    default = 1e-3

    @staticmethod
    def signal(h: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        logp = F.log_softmax(logits.float(), dim=-1)
        return -(logp.exp() * logp).sum(-1)

    @staticmethod
    def distance(now: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        return (now - prev).abs()


class _StateCompare(_Compare):
    """A head-free rule: compares the state itself, so a check costs no readout. As in
    Huginn, a token's first check compares with its initial state H_0."""

    def begin(self, idx: torch.Tensor, h0: torch.Tensor) -> None:
        self.remember(idx, h0.float())

    @staticmethod
    def signal(h: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        return h.float()


class LatentDiff(_StateCompare):
    """Huginn's latent-diff: exit once ||h_i - h_prev|| / ||h_i|| < threshold."""

    name = "latent-diff"
    default = 0.03
    distance = staticmethod(lambda now, prev: relative_change(now, prev))


class Cosine(_StateCompare):
    """Huginn's cosine: exit once 1 - cos(h_i, h_prev) < threshold (clamped at 0, so a
    threshold of 0 never fires on round-off)."""

    name = "cosine"
    default = 1e-3
    distance = staticmethod(
        lambda now, prev: (1.0 - F.cosine_similarity(now, prev, dim=-1)).clamp_min(0.0))


class ArgmaxStability(Policy):
    """Huginn's argmax-stability: exit once the next-token argmax has equalled the
    previous check's at `threshold` consecutive checks (an integer; the first check has
    no previous argmax, so threshold n exits at the (n + 1)-th check at the earliest)."""

    name = "argmax-stability"
    needs_logits = True
    default = 5

    def reset(self, n_tokens: int) -> None:
        super().reset(n_tokens)
        self.last: torch.Tensor | None = None
        self.stable: torch.Tensor | None = None

    def can_exit(self, cap: int) -> bool:
        """The first check has no previous argmax, so after n checks a token has been
        stable at most n - 1 times."""
        n = self.checks_before(cap)
        return n > 0 and n - 1 >= self.threshold

    def check(self, loops: torch.Tensor, h: torch.Tensor, logits: torch.Tensor | None,
              idx: torch.Tensor) -> torch.Tensor:
        now = logits.argmax(-1)
        if self.last is None:
            self.last = torch.full((self.n_tokens,), -1, dtype=torch.long, device=now.device)
            self.stable = torch.zeros(self.n_tokens, dtype=torch.long, device=now.device)
        stable = torch.where(now == self.last[idx], self.stable[idx] + 1, 0)
        self.last[idx], self.stable[idx] = now, stable
        return stable >= self.threshold


class Probe(Policy):
    """A2: a linear probe on the state predicts whether the token's argmax will still
    change at a later loop; exit once its probability is below threshold. The default
    0.5 is the classifier's own decision boundary (Huginn has no probe)."""

    name = "probe"
    default = 0.5

    def __init__(self, weight: torch.Tensor, bias: float, threshold: float = 0.5,
                 first: int = 1, every: int = 1) -> None:
        super().__init__(threshold, first, every)
        self.weight, self.bias = weight, bias

    def can_exit(self, cap: int) -> bool:
        """A probability is >= 0, so a threshold of 0 never fires."""
        return self.threshold > 0 and super().can_exit(cap)

    def check(self, loops: torch.Tensor, h: torch.Tensor, logits: torch.Tensor | None,
              idx: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(h.float() @ self.weight.to(h.device) + self.bias) < self.threshold


RULES: dict[str, type[Policy]] = {rule.name: rule for rule in (
    Uniform, KL, KLHuginn, MinpKL, EntropyDiff, LatentDiff, Cosine, ArgmaxStability, Probe)}


def rule_defaults(rule: str) -> tuple[float, ...]:
    """Every default threshold of a rule, the first being its `default`."""
    cls = RULES[rule]
    return cls.defaults or (cls.default,)


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


@dataclass
class Loop:
    """One loop of a run in which no token has exited yet: the new states (B, T, d),
    each core block's keys and values as MaskedKV holds them after the loop, and the
    angle of every token's update. Until a batch's first exit, every setting of every
    rule computes exactly these, so they are computed once (record) and replayed."""

    state: torch.Tensor
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    angle: torch.Tensor


@torch.no_grad()
def masked_forward(model: LoopedLM, idx: torch.Tensor, policy: Policy, cap: int,
                   h0: torch.Tensor | None = None, replay: list[Loop] | None = None,
                   record: list[Loop] | None = None) -> ExitRun:
    """The exit semantics (module doc): run up to `cap` loops, exiting tokens as
    the policy says; tokens still active after loop `cap` exit there.

    record: a list that receives each loop while no token has exited. replay: such a
    list from a run of the same batch: while no token has exited, its loops are taken
    instead of computed (the same tensors bit for bit, since until the first exit a run
    does not depend on its policy); the policy's checks still run on them."""
    e = model.inputs(idx)
    h = model.initial_state(e) if h0 is None else h0.to(e.dtype)
    kvs = [MaskedKV() for _ in model.core]
    active = torch.ones(idx.shape, dtype=torch.bool, device=idx.device)
    exit_loop = torch.full(idx.shape, cap, dtype=torch.long, device=idx.device)
    checks = torch.zeros(idx.shape, dtype=torch.long, device=idx.device)
    last_angle = torch.zeros(idx.shape, dtype=torch.float32, device=idx.device)
    tokens = torch.arange(idx.numel(), device=idx.device)
    policy.reset(idx.numel())
    policy.begin(tokens, h.flatten(0, 1))
    exited = False  # whether any token has exited yet
    for loop in range(1, cap + 1):
        if not exited and replay is not None and loop <= len(replay):
            taken = replay[loop - 1]
            for kv, (k, v) in zip(kvs, taken.kv, strict=True):
                kv.k, kv.v = k, v
            new, turned = taken.state, taken.angle
        else:
            for kv in kvs:
                kv.active = active
            new = model.step(model.carry(h, first=loop == 1), e, kvs)
            turned = angle(h, new)
            if not exited and record is not None:
                record.append(Loop(new, [(kv.k, kv.v) for kv in kvs], turned))
        last_angle = torch.where(active, turned, last_angle)
        h = torch.where(active[..., None], new, h)
        if loop == cap or not policy.checks_at(loop):
            continue
        logits = model.read(h, last=True).flatten(0, 1) if policy.needs_logits else None
        checks += active
        loops = torch.full_like(tokens, loop)
        leaving = policy.check(loops, h.flatten(0, 1), logits, tokens).view(idx.shape) & active
        exit_loop[leaving] = loop
        active &= ~leaving
        exited = exited or bool(leaving.any())
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
             policy: Policy, cap: int, batch_size: int,
             replay: list[list[Loop]] | None = None,
             record: list[list[Loop]] | None = None) -> PolicyResult:
    """Run masked_forward over windows (x, y) in batches; per-token results. record: a
    list that receives each batch's loops before its first exit; replay: such a list
    (see masked_forward). Recording a never-exiting run (never_exits) and replaying it
    for every setting of a sweep gives every setting its exact result."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("ce", "exit", "checks", "angle")}
    for n, i in enumerate(range(0, len(x), batch_size)):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size]
        kept = None if record is None else []
        run = masked_forward(model, xb, policy, cap,
                             None if h0 is None else h0[i:i + batch_size],
                             None if replay is None else replay[n], kept)
        if record is not None:
            record.append(kept)
        ce = token_ce(run.logits.flatten(0, 1), yb.flatten())
        parts["ce"].append(ce.double().cpu().numpy())
        parts["exit"].append(run.exit_loop.flatten().cpu().numpy())
        parts["checks"].append(run.checks.flatten().cpu().numpy())
        parts["angle"].append(run.last_angle.flatten().cpu().numpy())
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    return PolicyResult(cat["ce"], cat["exit"], cat["checks"], cat["angle"])


def sweep_settings(model: LoopedLM, x: torch.Tensor, y: torch.Tensor, h0: torch.Tensor | None,
                   cap: int, batch_size: int, grids: dict[str, list[float]], first: int,
                   every: int, probe: tuple[torch.Tensor, float] | None = None,
                   desc: str = "policies") -> dict[tuple[str, float], PolicyResult]:
    """Every (rule, threshold) of the grids (settings) on one window set, capped at
    depth `cap`. A setting that cannot exit before the cap has the never-exiting run's
    outcome; every other one replays that run's loops up to its first exit (evaluate),
    so the sweep costs a fraction of one masked forward per setting, bit for bit."""
    loops: list[list[Loop]] = []
    never = evaluate(model, x, y, h0, never_exits(first, every), cap, batch_size,
                     record=loops)
    out = {}
    for rule, threshold in tqdm(settings(grids), desc=desc, unit="setting", mininterval=5):
        policy = make(rule, threshold, first, every, probe)
        out[(rule, threshold)] = (
            evaluate(model, x, y, h0, policy, cap, batch_size, replay=loops)
            if policy.can_exit(cap) else never)
    return out


def token_flops(model: LoopedLM, exit_loop: np.ndarray, checks: np.ndarray,
                reads_logits: bool) -> np.ndarray:
    """Forward FLOPs of each token's exit decisions: prelude, each loop it ran, each
    check it was part of (a coda and head pass for a rule that reads logits, a few
    d-sized vector operations for a head-free one), and the final readout. Attention
    counted at the mean query position (see LoopedLM.cost)."""
    cost = model.cost()
    check = cost.readout if reads_logits else 4 * model.cfg.d_model
    return (cost.prelude + cost.loop * np.asarray(exit_loop, np.float64)
            + check * np.asarray(checks, np.float64) + cost.readout)


def flops_per_token(model: LoopedLM, exit_loop: np.ndarray, checks: np.ndarray,
                    reads_logits: bool) -> float:
    """Mean forward FLOPs per token of exit decisions (token_flops)."""
    return float(token_flops(model, exit_loop, checks, reads_logits).mean())


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
    checks: np.ndarray | None = None  # per token (None: uniform depth, no checks)

    def token_flops(self, model: LoopedLM) -> np.ndarray:
        """Per-token forward FLOPs (policies.token_flops), for the intervals."""
        checks = np.zeros_like(self.loops) if self.checks is None else self.checks
        return token_flops(model, self.loops, checks, RULES[self.rule].needs_logits)

    @property
    def mean_ce(self) -> float:
        return float(self.ce.mean())

    @property
    def mean_loops(self) -> float:
        return float(self.loops.mean())


def matched(outcomes: list[Outcome], target: float, match: float) -> Outcome | None:
    """The setting with the fewest mean loops whose mean CE is within `match` nats of
    target (uniform depth R's), or None when no setting gets there."""
    ok = [o for o in outcomes if o.mean_ce <= target + match]
    return min(ok, key=lambda o: (o.mean_loops, o.flops)) if ok else None


def pool(results: list[PolicyResult]) -> PolicyResult:
    """The tokens of several runs (seeds) as one result."""
    return PolicyResult(*(np.concatenate([getattr(r, f) for r in results])
                          for f in ("ce", "exit_loop", "checks", "last_angle")))


def settings(grids: dict[str, list[float]]) -> list[tuple[str, float]]:
    """Every (rule, threshold) of the grids, in a fixed order."""
    return [(rule, float(t)) for rule, grid in grids.items() for t in grid]


def is_default(rule: str, threshold: float) -> bool:
    """Whether a setting is one of its rule's defaults (A0's depths never are)."""
    return rule != "uniform" and any(math.isclose(threshold, d, rel_tol=1e-9)
                                     for d in rule_defaults(rule))


def _at(group: list[Outcome], threshold: float) -> Outcome:
    found = [o for o in group if math.isclose(o.threshold, threshold, rel_tol=1e-9)]
    if not found:
        raise ValueError(f"policy {group[0].rule}: threshold {threshold:g} was not swept "
                         "(every default must be in the rule's grid)")
    return found[0]


def outcomes_of(model: LoopedLM, uniform: dict[str, np.ndarray],
                results: dict[tuple[str, float], dict[str, PolicyResult]]
                ) -> dict[str, dict[str, list[Outcome]]]:
    """Per window set and rule, every setting's outcome; A0 ("uniform") at depths 1..R."""
    cost = model.cost()
    outcomes: dict[str, dict[str, list[Outcome]]] = {}
    for s, ce in uniform.items():
        outcomes[s] = {"uniform": [Outcome("uniform", k, ce[k - 1], np.full(ce.shape[1], k),
                                           cost.uniform(k)) for k in range(1, len(ce) + 1)]}
    for (rule, threshold), per_set in results.items():
        for s, res in per_set.items():
            outcomes[s].setdefault(rule, []).append(Outcome(
                rule, threshold, res.ce, res.exit_loop,
                flops_per_token(model, res.exit_loop, res.checks, RULES[rule].needs_logits),
                res.checks))
    return outcomes


SWEPT = ("choose", "report")  # the window sets a sweep runs on (probe: A2's training)


@dataclass
class Sweep:
    """One run's sweep (seed) of a cell at depth R: per window set of SWEPT, the CE per
    token at uniform depths 1..R, (R, tokens), and every setting's result."""

    model: LoopedLM  # what the FLOPs are counted on: the same for every run of a cell
    r: int  # R, the evaluation depth (model.loops)
    docs: np.ndarray  # the resampling unit of each `report` token
    unit: str  # what a unit is (loopscope.units)
    uniform: dict[str, np.ndarray] = field(default_factory=dict)
    results: dict[str, dict[tuple[str, float], PolicyResult]] = field(default_factory=dict)


def summarize_sweeps(sweeps: list[Sweep], match: float, resamples: int
                     ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """metrics/policies/<cell>.json and the frontier rows of a cell: summarize over the
    tokens of every run pooled (per set and setting), so the choice of a threshold and
    every interval pool the cell's seeds; with the seed count and resampling units."""
    cell = sweeps[0]
    uniform = {s: np.concatenate([w.uniform[s] for w in sweeps], axis=1) for s in cell.uniform}
    results = {key: {s: pool([w.results[s][key] for w in sweeps]) for s in cell.results}
               for key in cell.results[SWEPT[0]]}
    docs = np.concatenate([w.docs for w in sweeps])
    metrics, rows = summarize(cell.model, uniform, results, docs, cell.r, match,
                              resamples)
    metrics["seeds"] = len(sweeps)
    metrics.update(Units(docs, cell.unit).describe())
    return metrics, rows


def headline(metrics: dict[str, Any]) -> str:
    """Where each rule matches depth R's quality, in one line, from the metrics."""
    found = ", ".join(f"{rule} {m['mean_loops']:.2f} loops (FLOPs x{m['flops_ratio']:.2f}, "
                      f"x{m['flops_ratio_baseline']:.2f} of the baseline)"
                      if m.get("matched") else f"{rule} unmatched"
                      for rule, m in metrics.items() if isinstance(m, dict) and "matched" in m)
    return (f"depth-{metrics['reference_depth']} quality at: uniform depth "
            f"{metrics['uniform']['matched_depth']}, {found}")


def summarize(model: LoopedLM, uniform: dict[str, np.ndarray],
              results: dict[tuple[str, float], dict[str, PolicyResult]], docs: np.ndarray,
              r: int, match: float, resamples: int
              ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """metrics/policies/<cell>.json and the frontier rows, from pooled per-token results.

    uniform[set]: CE per depth 1..R and token, (R, N). results[(rule, threshold)][set].
    A setting is chosen on the `choose` windows: the fewest mean loops whose mean CE is
    within choose_nats = match / 2 of uniform depth R's there. The margin is half the
    claim's (match_nats), so that the CE difference measured on `report`, where every
    reported number comes from, is not at the claim's margin by construction. The same
    choice gives A0's matched depth M; min(R, M) is the honest baseline a policy's FLOPs
    are also read against. Intervals resample the documents of `report` (docs).
    """
    choose = match / 2
    outcomes = outcomes_of(model, uniform, results)
    base = {s: group["uniform"][r - 1] for s, group in outcomes.items()}
    report_uniform = outcomes["report"]["uniform"]
    m = int(matched(outcomes["choose"]["uniform"], base["choose"].mean_ce, choose).threshold)
    baseline = report_uniform[min(r, m) - 1]

    boot = Documents(docs, resamples)  # one set of resamples: every interval is paired

    def interval(values: np.ndarray) -> dict[str, float]:
        return boot.interval(boot.mean(docs, values)).to_dict()

    def delta(o: Outcome) -> dict[str, float]:
        return interval(o.ce - base["report"].ce)

    def measured(o: Outcome) -> dict[str, Any]:
        flops = boot.mean(docs, o.token_flops(model))  # per draw; depth R's is fixed
        return {"threshold": o.threshold, "mean_loops": o.mean_loops, "ce": o.mean_ce,
                "delta_ce": delta(o), "flops_ratio": o.flops / base["report"].flops,
                "flops_ratio_baseline": o.flops / baseline.flops,
                "flops_ratio_iv": boot.interval(flops / base["report"].flops).to_dict(),
                "flops_ratio_baseline_iv": boot.interval(flops / baseline.flops).to_dict()}

    metrics: dict[str, Any] = {
        "reference_depth": r, "match_nats": match, "choose_nats": choose,
        "uniform": {"ce": {f"k{o.threshold}": o.mean_ce for o in report_uniform},
                    "flops": {f"k{o.threshold}": o.flops for o in report_uniform},
                    "matched_depth": m, "delta_ce": delta(report_uniform[m - 1])},
        "baseline_depth": min(r, m),
    }
    for rule, group in outcomes["choose"].items():
        if rule == "uniform":
            continue
        chosen = matched(group, base["choose"].mean_ce, choose)
        if chosen is None:
            metrics[rule] = {"matched": False}
            continue
        got = _at(outcomes["report"][rule], chosen.threshold)
        defaults = [measured(_at(outcomes["report"][rule], d)) for d in rule_defaults(rule)]
        metrics[rule] = {
            "matched": True, **measured(got),
            "mean_loops_iv": interval(got.loops.astype(np.float64)),
            "loops_ratio_baseline": got.mean_loops / min(r, m),
            "default": defaults[0], "defaults": defaults,
            # the grid's most aggressive setting matched: the grid may stop too early
            "at_grid_edge": chosen is min(group, key=lambda o: (o.mean_loops, o.flops)),
        }
    rows = [{"set": s, "rule": o.rule, "threshold": o.threshold, "mean_loops": o.mean_loops,
             "ce": o.mean_ce, "flops": o.flops, "flops_ratio": o.flops / base[s].flops,
             "default": is_default(o.rule, o.threshold)}
            for s in outcomes for group in outcomes[s].values() for o in group]
    return metrics, rows
