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


@dataclass(frozen=True)
class Spec:
    """A model's sizes and flags as the looped-model interface reads them
    (loopscope.looped.interface.LoopedModel), in one record: each model class builds one
    (LoopedLM from its config, a released layout from its config.json and the depth it
    is read at) instead of writing a property for each."""

    loops: int  # R, the depth it is read at (K for paper A's cells; a backbone's R)
    d_model: int  # the state's width
    context: int  # the longest window it takes
    prelude_blocks: int  # attention overrides `inputs` takes: one per prelude block
    kv_blocks: int  # attention overrides `step` takes: one per core block
    coda_blocks: int  # attention overrides `read` takes: one per coda block
    readout_eps: float  # eps of the readout's normalization (the radial floor); 0: none
    random_state: bool  # whether H_0 is drawn (initial_state reads its generator)
    # The depth it trained at: m, the training sampler's nominal mean (the depth paper
    # B's regime is read against), and E[r], the sampler's mean; both R for a fixed depth
    nominal_mean: float
    sampler_mean: float

    def __post_init__(self) -> None:
        if self.loops < 1:
            raise ValueError(f"the depth it is read at must be >= 1, got {self.loops}")


def _from_spec(name: str) -> property:
    return property(lambda self: getattr(self.spec, name),
                    doc=f"The interface's {name}, read from the model's spec (Spec).")


class Specified:
    """The interface's attributes of a model class, each read from its `spec`: a model
    sets `self.spec = Spec(...)` once and inherits these."""

    spec: Spec
    loops = _from_spec("loops")
    d_model = _from_spec("d_model")
    context = _from_spec("context")
    prelude_blocks = _from_spec("prelude_blocks")
    kv_blocks = _from_spec("kv_blocks")
    coda_blocks = _from_spec("coda_blocks")
    readout_eps = _from_spec("readout_eps")
    random_state = _from_spec("random_state")
    nominal_mean = _from_spec("nominal_mean")
    sampler_mean = _from_spec("sampler_mean")


@dataclass(frozen=True)
class Sizing:
    """What the memory checks (loopscope.preflight.memory) and `plan` need of a
    released model, from its config alone (loopscope.released.loader.sizing): the
    parameters (all, and the readout's: what Lemma 1's float64 copy copies), the
    sizes that set the activations, the depth it is read at and its FLOPs by part."""

    params: int
    readout_params: int
    d_model: int
    n_heads: int
    intermediate: int  # the MLP's hidden width
    vocab_size: int
    context: int
    coda_blocks: int
    loops: int
    cost: Cost
