"""model.cost, the FLOPs plan and the benchmarks rest on, against torch's own FLOP counter
on a real forward pass.

cost() counts 2 FLOPs per weight of every matrix a token goes through, plus attention's
two products (scores and the weighted sum) at the mean query position of a causal
window, 4 d (T + 1) / 2 per block; norms and elementwise ops are left out.
torch.utils.flop_counter.FlopCounterMode counts 2 m k n per (m, k) x (k, n) product and
nothing for elementwise ops, norms, softmax or embedding lookups, so its matrix FLOPs
are cost()'s convention exactly. Its attention differs in two ways the test converts
explicitly:

- it does not know the CPU's fused attention kernel (_scaled_dot_product_flash_
  attention_for_cpu) and counts it as 0, so the forward runs under the math backend,
  whose two products are plain batched matmuls (aten.bmm), the only ones in the model;
- those products are over the full T x T scores, the masked half included: 4 d T per
  token and block, where cost() counts the causal 4 d (T + 1) / 2. The test checks the
  full count first, then scales it by (T + 1) / (2 T).

Both counts are then exact integers of the same products, so they must agree to float
rounding (rel 1e-12): any real gap (a matrix cost() forgets, a coda it runs once where
forward runs it per readout) is thousands of FLOPs per token, not a rounding.
"""

import dataclasses

import pytest
import torch
from conftest import BACKBONE, TINY
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from loopscope.weights.model import LoopedLM, ModelConfig, cost

MATMUL = {torch.ops.aten.mm, torch.ops.aten.addmm}  # nn.Linear on (B, T, d)
ATTENTION = {torch.ops.aten.bmm, torch.ops.aten.baddbmm}  # math attention's two products

CONFIGS = {
    "gelu_prenorm": TINY,
    # two core blocks, additive injection, inter-loop norm: elementwise, so free
    "gelu_add_norm": dataclasses.replace(TINY, n_core=2, inject="add", inter_loop_norm=True),
    # paper B's backbone shape: prelude, coda, sandwich blocks, concat adapter, noise H_0
    "swiglu_backbone": dataclasses.replace(BACKBONE, ffn="swiglu"),
    "swiglu_adapter_no_coda": dataclasses.replace(TINY, ffn="swiglu", inject="concat_adapter",
                                                  n_prelude=1),
}


def counted(cfg: ModelConfig, batch: int, loops: int, read: str, grad_loops: int
            ) -> tuple[float, float]:
    """(matrix FLOPs, attention FLOPs) per token FlopCounterMode counts in one forward
    pass of `batch` full windows (T = model.context: cost() is per token of a full
    window)."""
    torch.manual_seed(0)
    model = LoopedLM(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (batch, cfg.context))
    with (torch.no_grad(), sdpa_kernel(SDPBackend.MATH),
          FlopCounterMode(display=False) as counter):
        model(idx, loops=loops, read=read, grad_loops=grad_loops)
    ops = counter.get_flop_counts()["Global"]
    unknown = set(ops) - MATMUL - ATTENTION
    assert not unknown, f"FlopCounterMode counted ops this test does not sort: {unknown}"
    tokens = batch * cfg.context
    return (sum(ops.get(op, 0) for op in MATMUL) / tokens,
            sum(ops.get(op, 0) for op in ATTENTION) / tokens)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("loops, read, grad_loops, readouts", [
    (3, "last", 0, 1),  # cost().uniform(3): one readout
    (3, "all", 0, 3),  # per-loop loss: the coda and head run for every loop
    (5, "all", 2, 2),  # truncated backprop reads out only the 2 graph loops
])
def test_cost_matches_torchs_flop_counter(name, loops, read, grad_loops, readouts):
    cfg = CONFIGS[name]
    d, t = cfg.d_model, cfg.context
    matrices, attention = counted(cfg, 2, loops, read, grad_loops)
    blocks = cfg.n_prelude + cfg.n_core * loops + cfg.n_coda * readouts
    # FlopCounterMode's attention: both products over the full T x T window
    assert attention == 4 * d * t * blocks, f"{name}: attention not counted as expected"
    c = cost(cfg)
    predicted = c.prelude + c.loop * loops + c.readout * readouts
    if readouts == 1:
        assert predicted == c.uniform(loops)
    causal = attention * (t + 1) / (2 * t)  # cost()'s mean query position
    assert matrices + causal == pytest.approx(predicted, rel=1e-12), (
        f"{name}: cost() predicts {predicted:,.0f} FLOPs per token for {loops} loops and "
        f"{readouts} readouts; torch counts {matrices:,.0f} in matrices + {causal:,.0f} in "
        f"causal attention = {matrices + causal:,.0f}")
