"""The looped-model interface's types, beside the interface (loopscope.looped.interface,
which re-exports them): the attention override (KV), a loop's hook (LoopHook) and a
model's forward FLOPs by part (Cost). They live in weights/ because the models
(loopscope.weights.model.LoopedLM, loopscope.released.huginn.HuginnLM) implement the
interface with them, and a module imports nothing from a package above its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# hook(k, H_k) -> H_k', called after loop k (1-based) before the state is read out,
# stored and fed back (through the model's carry); used by the scale clamp and other
# interventions.
LoopHook = Callable[[int, torch.Tensor], torch.Tensor]
# kv(q, k, v) -> y: attention of one core block with per-token exits
# (loopscope.measure.exit_rules.masked's MaskedKV in the masked forward,
# loopscope.measure.bench.runtime's GatherKV and LoopKV in the adaptive runtime); the heads'
# queries, keys and values of the tokens computed in this call, (B, H, T, d_head). The contract,
# grouped-query heads and the causal mask included, is loopscope.looped.interface's.
KV = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Cost:
    """Forward FLOPs per token of each part of a looped model (LoopedModel.cost)."""

    prelude: float  # embedding to the prelude's output
    loop: float  # one loop: re-injection and the shared core
    readout: float  # coda and LM head: one readout

    def uniform(self, loops: int) -> float:
        """A forward pass at uniform depth `loops`, read out once."""
        return self.prelude + self.loop * loops + self.readout
