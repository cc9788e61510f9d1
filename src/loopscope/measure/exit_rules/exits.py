"""The exit rules (depth policies, paper B): one small class per rule with one
interface, chosen by name (`make`), as Huginn's exit evaluators are
(recpre/raven_modeling_minimal.py):
    begin(idx, h0): the tokens' initial states, before loop 1
    check(loop, h, logits, idx) -> bool mask of the tokens that exit after this loop
    needs_logits: whether the check reads the coda and head or the state alone
    default, defaults: the rule's default threshold(s), from loopscope.measure.exit_rules.rules
Rules (RULES): uniform (A0, no checks), kl (A1, paper B's KL(p_i || p_prev)), probe
(A2), and Huginn's rules by Huginn's names and defaults: kl-huginn (KL(p_prev || p_i),
first check against uniform), minp-kl, entropy-diff, latent-diff (relative state
change), cosine, latent-acceleration (second order, with a two-hit variant) and
argmax-stability; and, on a model that has one, its own exit score (exit-score, NATIVE).
The masked forward (loopscope.measure.exit_rules.masked),
the runtime (loopscope.measure.bench.runtime) and the policies stage call them alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from loopscope.measure.exit_rules.rules import RULES as RULE_DATA
from loopscope.measure.exit_rules.signals import kl_divergence, minp_log_probs, relative_change
from loopscope.weights.model import row_chunks


class Policy:
    """An exit rule. Checks run at loops first, first + every, ...; a rule comparing
    two loops compares the current check with the token's previous one.

    begin() hands the rule each token's initial state H_0 (Huginn's evaluators start
    from it). check() sees the tokens being checked as flat rows: the loop each has run
    (N,), their states (N, d), their next-token logits (N, V) when the rule reads them,
    and their positions idx in the flattened batch (B * T), so the masked forward
    (every token), the runtime (only the active ones) and decoding (streams at different
    loops) call it alike.

    A rule's default threshold(s) are data (loopscope.measure.exit_rules.rules, by `name`): the
    first of `defaults` is its `default` (Huginn's, for the rules Huginn has).
    """

    name = "uniform"
    needs_logits = False
    default: float = 0.0
    defaults: tuple[float, ...] = ()

    def __init_subclass__(cls, **kwargs: object) -> None:
        """A rule's defaults are its data's (loopscope.measure.exit_rules.rules), by its name."""
        super().__init_subclass__(**kwargs)
        if (rule := RULE_DATA.get(cls.name)) is not None:
            cls.defaults, cls.default = rule.defaults, rule.defaults[0]

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

    @staticmethod
    def signal(h: torch.Tensor, logits: torch.Tensor | None) -> torch.Tensor:
        return minp_log_probs(logits)


class EntropyDiff(_Compare):
    """Huginn's entropy-diff: exit once |H(p_i) - H(p_prev)| < threshold, H the entropy
    of the next-token distribution. Huginn starts from an entropy of 100, which no first
    check comes near (H <= ln V), so the first check only records."""

    name = "entropy-diff"
    needs_logits = True

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
    distance = staticmethod(lambda now, prev: relative_change(now, prev))


class Cosine(_StateCompare):
    """Huginn's cosine: exit once 1 - cos(h_i, h_prev) < threshold (clamped at 0, so a
    threshold of 0 never fires on round-off)."""

    name = "cosine"
    distance = staticmethod(
        lambda now, prev: (1.0 - F.cosine_similarity(now, prev, dim=-1)).clamp_min(0.0))


class LatentAcceleration(Policy):
    """Huginn's latent-acceleration (its sampler's second form): exit once
    ||(h_i - h_prev) - (h_prev - h_prev2)|| / (||h_i|| + 1e-6) < threshold, the change
    of the state's step between checks relative to the state: a second-order rule that
    reads no head. It needs two earlier states of its own (H_0 is not one), so the first
    possible exit is the third check. two_hit: only after two checks in a row below the
    threshold (latent-acceleration-2hit)."""

    name = "latent-acceleration"
    two_hit = False
    EPS = 1e-6  # Huginn's guard against a zero state

    def reset(self, n_tokens: int) -> None:
        super().reset(n_tokens)
        self.prev: torch.Tensor | None = None
        self.prev2: torch.Tensor | None = None

    def can_exit(self, cap: int) -> bool:
        """Exits need a threshold above 0 and, before the cap, a third check (a fourth
        with two hits)."""
        return self.threshold > 0 and self.checks_before(cap) >= 3 + self.two_hit

    def check(self, loops: torch.Tensor, h: torch.Tensor, logits: torch.Tensor | None,
              idx: torch.Tensor) -> torch.Tensor:
        now = h.float()
        if self.prev is None:
            self.prev = now.new_zeros((self.n_tokens, now.shape[-1]))
            self.prev2 = torch.zeros_like(self.prev)
            self.seen = torch.zeros(self.n_tokens, dtype=torch.long, device=now.device)
            self.hits = torch.zeros(self.n_tokens, dtype=torch.long, device=now.device)
        prev, prev2 = self.prev[idx], self.prev2[idx]
        accel = (now - prev) - (prev - prev2)
        below = (accel.norm(dim=-1) / (now.norm(dim=-1) + self.EPS) < self.threshold) \
            & (self.seen[idx] >= 2)
        hits = torch.where(below, self.hits[idx] + 1, 0)
        self.prev2[idx], self.prev[idx] = prev, now
        self.seen[idx] += 1
        self.hits[idx] = hits
        return hits >= (2 if self.two_hit else 1)


class LatentAcceleration2Hit(LatentAcceleration):
    """latent-acceleration with a two-hit check: below the threshold at two consecutive
    checks (the two-scale latent dynamics study's variant)."""

    name = "latent-acceleration-2hit"
    two_hit = True


class ArgmaxStability(Policy):
    """Huginn's argmax-stability: exit once the next-token argmax has equalled the
    previous check's at `threshold` consecutive checks (an integer; the first check has
    no previous argmax, so threshold n exits at the (n + 1)-th check at the earliest)."""

    name = "argmax-stability"
    needs_logits = True

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


class ExitScore(Policy):
    """A model's own exit rule, where it has one (the looped-model interface's
    exit_score: an exit gate's per-token probability p_i of exiting at loop i, from the
    state alone, as Ouro's gate gives it): exit once the probability of having
    continued through every check so far, prod (1 - p_j), falls below threshold, i.e.
    once the model's exit distribution puts at least 1 - threshold of its mass at or
    before this loop. The default 0.5 exits at the median of that distribution. A rule
    of the models that have the score (NATIVE): LoopedLM has none, so params.yaml's
    grids do not name it."""

    name = "exit-score"

    def __init__(self, score: Callable[[torch.Tensor], torch.Tensor], threshold: float = 0.5,
                 first: int = 1, every: int = 1) -> None:
        super().__init__(threshold, first, every)
        self.score = score

    def reset(self, n_tokens: int) -> None:
        super().reset(n_tokens)
        self.survival: torch.Tensor | None = None

    def can_exit(self, cap: int) -> bool:
        """A probability is >= 0, so a threshold of 0 never fires."""
        return self.threshold > 0 and super().can_exit(cap)

    def check(self, loops: torch.Tensor, h: torch.Tensor, logits: torch.Tensor | None,
              idx: torch.Tensor) -> torch.Tensor:
        p = self.score(h).float().clamp(0.0, 1.0)
        if self.survival is None:
            self.survival = torch.ones(self.n_tokens, dtype=torch.float32, device=p.device)
        self.survival[idx] = self.survival[idx] * (1.0 - p)
        return self.survival[idx] < self.threshold


RULES: dict[str, type[Policy]] = {rule.name: rule for rule in (
    Uniform, KL, KLHuginn, MinpKL, EntropyDiff, LatentDiff, Cosine, LatentAcceleration,
    LatentAcceleration2Hit, ArgmaxStability, Probe)}
# Rules that read a model's own exit score: run only on a model whose exit_score is set
NATIVE: dict[str, type[Policy]] = {ExitScore.name: ExitScore}
KNOWN: dict[str, type[Policy]] = {**RULES, **NATIVE}  # every rule by name


def rule_defaults(rule: str) -> tuple[float, ...]:
    """Every default threshold of a rule, the first being its `default`."""
    return KNOWN[rule].defaults


def make(name: str, threshold: float = 0.0, first: int = 1, every: int = 1,
         probe: tuple[torch.Tensor, float] | None = None,
         score: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Policy:
    """The policy `name` (one of RULES, or NATIVE given the model's exit score) at a
    threshold."""
    if name == "probe":
        if probe is None:
            raise ValueError("the probe policy needs its trained weights")
        return Probe(probe[0], probe[1], threshold, first, every)
    if name in NATIVE:
        if score is None:
            raise ValueError(f"the {name} rule reads the model's own exit score, and this "
                             "model has none (its exit_score is None)")
        return NATIVE[name](score, threshold, first, every)
    return RULES[name](threshold, first, every)
