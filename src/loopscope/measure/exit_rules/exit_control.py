"""The exit control loop every per-token exit runs by: the masked forward
(loopscope.measure.exit_rules.masked), the runtime's scoring and its decoding
(loopscope.measure.bench.runtime). Written once, so the three cannot disagree on when a policy
is asked, which tokens count a check, or which loop an exit is recorded at.

ExitControl holds the bookkeeping (which tokens are still active, each token's exit loop
and number of checks) and asks the policy (loopscope.measure.exit_rules.exits): reset and begin
when tokens start, `checks_at` before a check (never at the cap, where every token
still active exits anyway), `check` with the tokens checked. `run` is the loop of a
forward in which every active token is at the same loop (the masked forward, the
runtime's scoring); decoding advances each stream at its own loop and calls
`checks_at` and `check` per step itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from loopscope.measure.exit_rules.exits import Policy

# checked() -> (tokens, states, logits): the flat indices of the tokens to check at
# this loop, their states (N, d) and, where the policy reads them (ExitControl's
# needs_logits), their logits (N, V); else None
Checked = Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]


@dataclass
class Exits:
    """What a forward pass with exits did on a batch, whichever engine ran it (the
    masked forward, the runtime): per-token final logits (B, T, V) of the coda and
    readout over the exit states (B, T, d), the loop each token exited after, and how
    many checks it was part of."""

    logits: torch.Tensor
    state: torch.Tensor
    exit_loop: torch.Tensor
    checks: torch.Tensor


class ExitControl:
    """The exit state of a batch of tokens (shape: the batch's, e.g. (B, T)), flat
    indices in reading order: `active` (bool), `exit_loop` (the loop each token exited
    after; the cap until it does) and `checks` (how many checks it was active at)."""

    def __init__(self, policy: Policy, cap: int, shape: tuple[int, ...],
                 device: torch.device | str) -> None:
        if cap < 1:
            raise ValueError(f"the exit cap must be >= 1 loop, got {cap}")
        self.policy, self.cap = policy, cap
        self.active = torch.ones(shape, dtype=torch.bool, device=device)
        self.exit_loop = torch.full(shape, cap, dtype=torch.long, device=device)
        self.checks = torch.zeros(shape, dtype=torch.long, device=device)
        policy.reset(self.active.numel())

    @property
    def needs_logits(self) -> bool:
        """Whether a check must be given the checked tokens' logits."""
        return self.policy.needs_logits

    def begin(self, tokens: torch.Tensor, h0: torch.Tensor) -> None:
        """Tokens (flat indices) start, from initial states h0 (N, d)."""
        self.policy.begin(tokens, h0)

    def checks_at(self, loop: int) -> bool:
        """Whether the policy checks after `loop`; never at the cap."""
        return loop < self.cap and self.policy.checks_at(loop)

    def check(self, tokens: torch.Tensor, loops: int | torch.Tensor, states: torch.Tensor,
              logits: torch.Tensor | None) -> torch.Tensor:
        """Ask the policy about tokens (flat indices) after loops (one loop, or one per
        token), with their states and logits. Tokens that already exited may be among
        them; only the active ones count the check or can exit. Returns the flat indices
        of the tokens that exit now."""
        if isinstance(loops, int):
            loops = torch.full_like(tokens, loops)
        active = self.active.view(-1)[tokens]
        self.checks.view(-1)[tokens] += active
        leaving = self.policy.check(loops, states, logits, tokens) & active
        out = tokens[leaving]
        self.exit_loop.view(-1)[out] = loops[leaving]
        self.active.view(-1)[out] = False
        return out

    @property
    def done(self) -> bool:
        """Whether every token has exited."""
        return not bool(self.active.any())


def run(control: ExitControl, advance: Callable[[int], None], checked: Checked) -> None:
    """The control loop of a forward whose active tokens share one loop: for loop 1 ..
    cap, advance(loop) runs the loop for the active tokens; where the policy checks,
    checked() gives the tokens to ask about, and the loop stops once none is active."""
    for loop in range(1, control.cap + 1):
        advance(loop)
        if not control.checks_at(loop):
            continue
        tokens, states, logits = checked()
        control.check(tokens, loop, states, logits)
        if control.done:
            return
