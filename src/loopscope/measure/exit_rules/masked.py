"""The one definition of what a per-token exit means: the masked forward.

Exit semantics, used by every policy and matched by the fast runtime
(loopscope.measure.bench.runtime):
- a token that exits at loop i keeps its state H_i;
- at later loops the other tokens' attention sees, in each core block, the keys and
  values the exited token computed at loop i (Huginn's "latest" reuse);
- an exit check at loop i reads the coda and head over every token's current state
  (an exited token's current state is its exit state), and asks the policy about the
  tokens still active;
- the final output runs the coda and the readout once over every token's exit state.

`masked_forward` computes every token at every loop and applies the exits by masking,
so it costs as much as uniform depth; the runtime skips the work. A sweep of settings
shares what they all compute: the loops before a batch's first exit are recorded once,
from a never-exiting run, and replayed (record, replay), bit for bit. It runs on any
model of the looped-model interface (loopscope.looped.interface).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from loopscope.looped.interface import LoopedModel
from loopscope.measure.exit_rules.exit_control import ExitControl, Exits, run
from loopscope.measure.exit_rules.exits import Policy
from loopscope.measure.exit_rules.signals import angle
from loopscope.weights.model import token_ce


class MaskedKV:
    """One core block's attention in the masked forward: every token computes its
    keys and values, but an exited token's stay those of its exit loop. The override
    contract of loopscope.looped.interface: q (B, Hq, T, dh), k and v (B, Hkv, T, dh)
    after the model's rotary embedding, Hq a multiple of Hkv (grouped-query heads: each
    key head serves Hq / Hkv query heads), every token of the batch in the call, so
    the causal mask is the plain one (token t sees positions <= t)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.active: torch.Tensor | None = None  # (B, T) bool, set before each loop

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.shape[2] != k.shape[2] or q.shape[1] % k.shape[1]:
            raise ValueError(f"the masked forward's attention takes every token's queries, "
                             f"keys and values, query heads a multiple of key heads: got q "
                             f"{tuple(q.shape)}, k {tuple(k.shape)}")
        if self.k is None:
            self.k, self.v = k, v
        else:
            keep = self.active[:, None, :, None]
            self.k, self.v = torch.where(keep, k, self.k), torch.where(keep, v, self.v)
        return attend(q, self.k, self.v)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal scaled dot-product attention over every token of the call, with
    grouped-query heads where k and v have fewer heads than q (the override contract
    of loopscope.looped.interface)."""
    if q.shape[1] != k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@dataclass
class ExitRun(Exits):
    """What a policy did on a batch through the masked forward (Exits), and the angle
    of each token's last update (radians)."""

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
def masked_forward(model: LoopedModel, idx: torch.Tensor, policy: Policy, cap: int,
                   h0: torch.Tensor | None = None, replay: list[Loop] | None = None,
                   record: list[Loop] | None = None, freeze: bool = True) -> ExitRun:
    """The exit semantics (module doc): run up to `cap` loops, exiting tokens as
    the policy says (the control loop of loopscope.measure.exit_rules.exit_control); tokens still
    active after loop `cap` exit there.

    record: a list that receives each loop while no token has exited. replay: such a
    list from a run of the same batch: while no token has exited, its loops are taken
    instead of computed (the same tensors bit for bit, since until the first exit a run
    does not depend on its policy); the policy's checks still run on them. freeze=False:
    the published semantics of a model whose own early exit runs every token to the cap
    (Ouro's): nothing is frozen, a token's output is read from its state at its exit
    loop, and since the run never depends on its policy every loop is replayed."""
    e = model.inputs(idx)
    h = model.initial_state(e) if h0 is None else h0.to(e.dtype)
    kvs = [MaskedKV() for _ in range(model.kv_blocks)]
    control = ExitControl(policy, cap, tuple(idx.shape), idx.device)
    last_angle = torch.zeros(idx.shape, dtype=torch.float32, device=idx.device)
    tokens = torch.arange(idx.numel(), device=idx.device)
    control.begin(tokens, h.flatten(0, 1))
    # h: each token's output (exit) state; run: what the loop continues from
    now = {"h": h, "run": h, "angle": last_angle}

    def advance(loop: int) -> None:
        active, h = control.active, now["run"]
        # whether the run depends on the policy yet: once a token has exited, where exits
        # freeze it
        exited = freeze and not bool(active.all())
        if not exited and replay is not None and loop <= len(replay):
            taken = replay[loop - 1]
            for kv, (k, v) in zip(kvs, taken.kv, strict=True):
                kv.k, kv.v = k, v
            new, turned = taken.state, taken.angle
        else:
            for kv in kvs:
                kv.active = active if freeze else torch.ones_like(active)
            new = model.step(model.carry(h, first=loop == 1), e, kvs, k=loop)
            turned = angle(h, new)
            if not exited and record is not None:
                record.append(Loop(new, [(kv.k, kv.v) for kv in kvs], turned))
        now["angle"] = torch.where(active, turned, now["angle"])
        now["h"] = torch.where(active[..., None], new, now["h"])
        now["run"] = now["h"] if freeze else new

    def checked() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        # the coda and head read every token (the coda's attention sees them all); the
        # policy is asked about the active ones alone, as the runtime asks: an exited
        # token cannot exit again, and every rule's state is per token, so this is the
        # every-token answer for the tokens that count, bit for bit, at less cost
        h, rows = now["h"], tokens[control.active.view(-1)]
        logits = (model.read(h, last=True).flatten(0, 1)[rows] if control.needs_logits
                  else None)
        return rows, h.flatten(0, 1)[rows], logits

    run(control, advance, checked)
    h = now["h"]
    return ExitRun(model.read(h, last=True), h, control.exit_loop, control.checks,
                   now["angle"])


@dataclass
class PolicyResult:
    """A policy on a set of windows, per token (flattened, reading order)."""

    ce: np.ndarray  # cross-entropy of the final output, nats
    exit_loop: np.ndarray
    checks: np.ndarray
    last_angle: np.ndarray
    # the final output's argmax, which the settle-depth oracle reads (None: not kept)
    pred: np.ndarray | None = None

    @property
    def mean_loops(self) -> float:
        return float(self.exit_loop.mean())


@torch.no_grad()
def evaluate(model: LoopedModel, x: torch.Tensor, y: torch.Tensor, h0: torch.Tensor | None,
             policy: Policy, cap: int, batch_size: int,
             replay: list[list[Loop]] | None = None,
             record: list[list[Loop]] | None = None, freeze: bool = True) -> PolicyResult:
    """Run masked_forward over windows (x, y) in batches; per-token results. record: a
    list that receives each batch's loops before its first exit; replay: such a list
    (see masked_forward). Recording a never-exiting run (never_exits) and replaying it
    for every setting of a sweep gives every setting its exact result. freeze: the exit
    semantics (masked_forward)."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("ce", "exit", "checks", "angle",
                                                          "pred")}
    for n, i in enumerate(range(0, len(x), batch_size)):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size]
        kept = None if record is None else []
        run = masked_forward(model, xb, policy, cap,
                             None if h0 is None else h0[i:i + batch_size],
                             None if replay is None else replay[n], kept, freeze)
        if record is not None:
            record.append(kept)
        logits = run.logits.flatten(0, 1)
        ce = token_ce(logits, yb.flatten())
        parts["pred"].append(logits.argmax(-1).to(torch.int32).cpu().numpy())
        parts["ce"].append(ce.double().cpu().numpy())
        parts["exit"].append(run.exit_loop.flatten().cpu().numpy())
        parts["checks"].append(run.checks.flatten().cpu().numpy())
        parts["angle"].append(run.last_angle.flatten().cpu().numpy())
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    return PolicyResult(cat["ce"], cat["exit"], cat["checks"], cat["angle"], cat["pred"])


def token_flops(model: LoopedModel, exit_loop: np.ndarray, checks: np.ndarray,
                reads_logits: bool) -> np.ndarray:
    """Forward FLOPs of each token's exit decisions: prelude, each loop it ran, each
    check it was part of (a coda and head pass for a rule that reads logits, a few
    d-sized vector operations for a head-free one), and the final readout. Attention
    counted at the mean query position (see LoopedModel.cost)."""
    cost = model.cost()
    check = cost.readout if reads_logits else 4 * model.d_model
    return (cost.prelude + cost.loop * np.asarray(exit_loop, np.float64)
            + check * np.asarray(checks, np.float64) + cost.readout)


def flops_per_token(model: LoopedModel, exit_loop: np.ndarray, checks: np.ndarray,
                    reads_logits: bool) -> float:
    """Mean forward FLOPs per token of exit decisions (token_flops)."""
    return float(token_flops(model, exit_loop, checks, reads_logits).mean())


def pool(results: list[PolicyResult]) -> PolicyResult:
    """The tokens of several runs (seeds) as one result."""
    preds = [r.pred for r in results]
    return PolicyResult(*(np.concatenate([getattr(r, f) for r in results])
                          for f in ("ce", "exit_loop", "checks", "last_angle")),
                        None if any(p is None for p in preds) else np.concatenate(preds))
