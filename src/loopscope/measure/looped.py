"""The looped-model interface: everything the measuring code needs from a model.

A looped LM turns token ids into the loop's input e (`inputs`), starts from a state H_0
(`initial_state`), and runs one shared core per loop: loop k starts from
`carry(H_{k-1})` and returns H_k (`step`, which re-injects e and takes one attention
override per core block, `kv_blocks` of them, for per-token exits). Any loop's state
decodes to next-token logits (`read`: the coda and the readout; `last` marks the final
loop, whose readout may differ). The extract, paper A's depth sweep and clamp, paper B's
trajectories and the masked forward of the exit rules use these and nothing else, so a
model of another family, wrapped to this interface, gets every one of those diagnostics
(docs/architecture.md shows a wrapper; tests/test_interface.py runs one).

loopscope.weights.model.LoopedLM implements it. The fast exit runtime
(loopscope.measure.runtime) reaches into LoopedLM's blocks to skip work, and is not
covered by the interface.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from loopscope.weights.model import KV, Cost, LoopHook


@runtime_checkable
class LoopedModel(Protocol):
    """What measuring needs from a looped LM: a torch.nn.Module (for eval() and a
    float64 copy) with these attributes and methods."""

    loops: int  # the depth it was trained at and is read at (K; a backbone's R)
    d_model: int  # the state's width
    context: int  # the longest window it takes
    kv_blocks: int  # attention overrides `step` takes: one per core block
    readout_eps: float  # eps of the readout's normalization (the radial floor); 0: none

    def inputs(self, idx: Tensor) -> Tensor:
        """Token ids (B, T) -> the loop's input e (B, T, d), re-injected every loop."""

    def initial_state(self, e: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """H_0 (B, T, d) for the input e; a noise state draws from generator."""

    def carry(self, h: Tensor, first: bool | Tensor = False) -> Tensor:
        """What loop k + 1 starts from, given H_k (first: h is H_0)."""

    def step(self, h: Tensor, e: Tensor, kvs: list[KV] | None = None) -> Tensor:
        """One loop from carry(H_k): H_{k+1}. kvs: an attention override per core block
        (q, k, v) -> y, for tokens whose keys and values stay frozen at their exit."""

    def read(self, h: Tensor, last: bool) -> Tensor:
        """A loop's state (B, T, d) -> next-token logits (B, T, V)."""

    def cost(self) -> Cost:
        """Forward FLOPs per token of its parts: before the loop, one loop, one readout."""


def h0_rows(h0: Tensor | None, i: int, n: int) -> Tensor | None:
    """The initial states of windows i .. i + n, if the model takes them."""
    return None if h0 is None else h0[i:i + n]


def run_loops(model: LoopedModel, idx: Tensor, loops: int, h0: Tensor | None = None,
              hook: LoopHook | None = None) -> tuple[Tensor, list[Tensor]]:
    """H_0 and H_1 .. H_loops of token ids idx (B, T), loop by loop through the interface
    (no readout): the same tensors, bit for bit, as LoopedLM's own forward pass.
    h0: the initial state (a noise state's, drawn per window: loopscope.measure.runs);
    hook: applied to each state before it is stored and carried."""
    e = model.inputs(idx)
    h = model.initial_state(e) if h0 is None else h0.to(e.dtype)
    initial, states = h, []
    for k in range(1, loops + 1):
        h = model.step(model.carry(h, first=k == 1), e)
        if hook is not None:
            h = hook(k, h)
        states.append(h)
    return initial, states
