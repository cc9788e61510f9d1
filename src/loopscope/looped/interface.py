"""The looped-model interface: everything the measuring code needs from a model.

A looped LM turns token ids into the loop's input e (`inputs`: the embedding and the
prelude), starts from a state H_0 (`initial_state`, drawn from a generator where the
model's H_0 is random), and runs one shared core per loop: loop k starts from
`carry(H_{k-1})` and returns H_k (`step`, which re-injects e, takes the loop index k and
the tokens' positions, and one attention override per core block, `kv_blocks` of them,
for per-token exits). Any loop's state decodes to next-token logits (`read`: the coda
and the readout; `last` marks the final loop, whose readout may differ). The prelude and
the coda take attention overrides too (`prelude_blocks`, `coda_blocks` of them), so that
the fast exit runtime (loopscope.measure.bench.runtime) can run them on a few tokens at a time
against cached keys and values. The extract, paper A's depth sweep and clamp, paper B's
trajectories, the masked forward of the exit rules, the throughput timing and the exit
runtime use these and nothing else, so a model of another family, wrapped to this
interface, gets every one of those measurements (docs/architecture.md shows a wrapper;
tests/test_interface.py runs one with grouped-query heads, a random H_0, a
loop-dependent core and a native exit score; loopscope.released.huginn implements it for
Huginn's released layout). A model whose blocks cannot run on a subset of a batch's
tokens (Parcae's value embeddings read token ids the interface does not pass) sets an
optional class attribute `gathers = False`; the exit benchmark then records "not timed"
instead of failing after the measuring stages have run.

The attention override (KV) contract. A model that takes `kvs` calls, in core block i,
kvs[i](q, k, v) -> y in place of its own attention, with
- q (B, Hq, T, dh), k and v (B, Hkv, T, dh): the queries, keys and values of the T
  tokens of this call, in the model's dtype, *after* everything the model applies to
  them before attending (biases, norms, the rotary embedding at the call's positions);
- grouped-query heads: Hq a multiple of Hkv, query head j reading key/value head
  j // (Hq / Hkv) (Hq == Hkv: one key head per query head);
- y (B, Hq, T, dh) in the same layout, which the model projects as its own attention's
  output; the override applies the causal mask itself (token t attends to the keys of
  tokens at positions <= t) and the scale 1 / sqrt(dh), as scaled_dot_product_attention
  with is_causal=True does.
A call may hold a subset of the tokens (the runtime's gathered active tokens, or one
token per stream when decoding): T is then the tokens of the call, `positions` says
where they sit, and the override, which holds the other tokens' keys and values, masks
by those positions. loopscope.measure.exit_rules.masked.MaskedKV is the reference: it keeps every
token's keys and values and freezes an exited token's at its exit loop; the runtime's
GatherKV and LoopKV do the same on subsets.

loopscope.weights.model.LoopedLM implements it. Its types (KV, LoopHook, Cost) are
loopscope.looped.types', re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from loopscope.looped.types import KV, Cost, LoopHook

__all__ = ["KV", "Cost", "LoopHook", "LoopedModel", "h0_rows", "run_loops"]


@runtime_checkable
class LoopedModel(Protocol):
    """What measuring needs from a looped LM: a torch.nn.Module (for eval()) with these
    attributes and methods."""

    loops: int  # R, the depth it is read at (K for paper A's cells; a backbone's R)
    d_model: int  # the state's width
    context: int  # the longest window it takes
    kv_blocks: int  # attention overrides `step` takes: one per core block
    prelude_blocks: int  # attention overrides `inputs` takes: one per prelude block
    coda_blocks: int  # attention overrides `read` takes: one per coda block
    readout_eps: float  # eps of the readout's normalization (the radial floor); 0: none
    random_state: bool  # whether H_0 is drawn (initial_state reads its generator)
    # The depth it trained at: m, the training sampler's nominal mean (the depth paper
    # B's regime is read against), and E[r], the sampler's mean; both R for a fixed depth
    nominal_mean: float
    sampler_mean: float
    # A native exit score, where the model has one (an exit gate): states (..., d) ->
    # (...) the probability that each token exits at this loop, from its state alone
    # (loopscope.measure.exit_rules.exits.ExitScore reads it); None: the model has none
    exit_score: Callable[[Tensor], Tensor] | None

    def inputs(self, idx: Tensor, positions: Tensor | None = None,
               kvs: list[KV] | None = None) -> Tensor:
        """Token ids (B, T) -> the loop's input e (B, T, d), re-injected every loop.
        positions (T,) or (B, T): the tokens' positions (default 0 .. T - 1). kvs: an
        attention override per prelude block (the module doc's contract)."""

    def initial_state(self, e: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """H_0 (B, T, d) for the input e; a random one (random_state) is drawn from
        generator (torch's RNG if None), so a seeded generator draws the same H_0 in
        every stage."""

    def carry(self, h: Tensor, first: bool | Tensor = False) -> Tensor:
        """What loop k + 1 starts from, given H_k (first: h is H_0)."""

    def step(self, h: Tensor, e: Tensor, kvs: list[KV] | None = None,
             k: int | Tensor | None = None, positions: Tensor | None = None) -> Tensor:
        """One loop from carry(H_{k-1}): H_k. kvs: an attention override per core block
        (the module doc's contract), for tokens whose keys and values stay frozen at
        their exit. k: the loop's index, 1-based, or a (B,) tensor of them where the
        rows run different loops (the runtime's decoding batches streams at their own
        loops); None: the model must not need it. positions: as for inputs."""

    def read(self, h: Tensor, last: bool, positions: Tensor | None = None,
             kvs: list[KV] | None = None) -> Tensor:
        """A loop's state (B, T, d) -> next-token logits (B, T, V). kvs: an attention
        override per coda block (the module doc's contract)."""

    def reader(self) -> nn.Module:
        """The modules `read` runs (the coda and the readout), as one module whose
        forward(h, last) is read(h, last) on the same parameters: what Lemma 1's float64
        copy copies (loopscope.measure.per_loop.sweep), so that the copy costs the readout's
        weights, not the whole model's."""

    def cost(self) -> Cost:
        """Forward FLOPs per token of its parts: before the loop, one loop, one readout."""


def h0_rows(h0: Tensor | None, i: int, n: int) -> Tensor | None:
    """The initial states of windows i .. i + n, if the model takes them."""
    return None if h0 is None else h0[i:i + n]


def run_loops(model: LoopedModel, idx: Tensor, loops: int, h0: Tensor | None = None,
              hook: LoopHook | None = None) -> tuple[Tensor, list[Tensor]]:
    """H_0 and H_1 .. H_loops of token ids idx (B, T), loop by loop through the interface
    (no readout): the same tensors, bit for bit, as LoopedLM's own forward pass.
    h0: the initial state (a random one's, drawn per window: loopscope.measure.runs);
    hook: applied to each state before it is stored and carried."""
    e = model.inputs(idx)
    h = model.initial_state(e) if h0 is None else h0.to(e.dtype)
    initial, states = h, []
    for k in range(1, loops + 1):
        h = model.step(model.carry(h, first=k == 1), e, k=k)
        if hook is not None:
            h = hook(k, h)
        states.append(h)
    return initial, states
