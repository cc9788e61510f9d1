"""The looped-model interface (loopscope.measure.looped): the measuring code needs nothing
of a model beyond it. A second looped model, written here against the interface alone
(no LoopedLM part), runs through the extract, paper A's depth sweep and clamp, paper B's
trajectories and convergence summary, and the masked forward of the exit rules."""

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from loopscope.measure.clamp import clamp_metrics, clamp_run
from loopscope.measure.convergence import summarize as convergence_summary
from loopscope.measure.exits import KL, LatentDiff
from loopscope.measure.extract import load_extract, write_extract
from loopscope.measure.intervals import Documents, Sample
from loopscope.measure.looped import LoopedModel, run_loops
from loopscope.measure.masked import evaluate, masked_forward
from loopscope.measure.params import ConvergenceConfig
from loopscope.measure.sweep import measure, summarize
from loopscope.measure.trajectories import trajectory
from loopscope.measure.units import Units
from loopscope.weights.model import Cost, LoopedLM, ModelConfig


class GatedLoop(nn.Module):
    """A looped LM of another family: token embedding as the loop's input, a zero
    initial state, and per loop one causal attention over the state plus the input,
    mixed into the state by a learned gate (a GRU-like update, no residual stream, no
    pre-norm block); an RMS-normalized readout. It implements the interface's
    attributes and methods and nothing else."""

    def __init__(self, vocab: int = 64, d: int = 16, heads: int = 2, context: int = 16,
                 loops: int = 3) -> None:
        super().__init__()
        self.loops, self.d_model, self.context, self.heads = loops, d, context, heads
        self.kv_blocks, self.readout_eps = 1, 1e-6
        self.embed = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.mix = nn.Linear(2 * d, 2 * d)
        self.head = nn.Linear(d, vocab, bias=False)

    def inputs(self, idx: torch.Tensor) -> torch.Tensor:
        return self.embed(idx)

    def initial_state(self, e: torch.Tensor, generator: torch.Generator | None = None
                      ) -> torch.Tensor:
        return torch.zeros_like(e)

    def carry(self, h: torch.Tensor, first: bool | torch.Tensor = False) -> torch.Tensor:
        return h

    def step(self, h: torch.Tensor, e: torch.Tensor, kvs=None) -> torch.Tensor:
        b, t, d = h.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(h + e).split(d, dim=2))
        y = (kvs[0](q, k, v) if kvs is not None
             else F.scaled_dot_product_attention(q, k, v, is_causal=True))
        y = y.transpose(1, 2).reshape(b, t, d)
        gate, cand = self.mix(torch.cat([h, y], dim=-1)).chunk(2, dim=-1)
        return torch.sigmoid(gate) * h + (1 - torch.sigmoid(gate)) * torch.tanh(cand + e)

    def read(self, h: torch.Tensor, last: bool) -> torch.Tensor:
        return self.head(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.readout_eps))

    def cost(self) -> Cost:
        d, v = self.d_model, self.head.out_features
        return Cost(prelude=0.0, loop=2 * (3 * d * d + 4 * d * d) + 2 * d * (self.context + 1),
                    readout=2 * d * v)


def model() -> GatedLoop:
    torch.manual_seed(0)
    return GatedLoop().eval()


def windows(n: int = 6, t: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 64, (n, t + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def test_both_models_are_looped_models():
    assert isinstance(model(), LoopedModel)
    assert isinstance(LoopedLM(ModelConfig(vocab_size=64, context=16, d_model=32)), LoopedModel)
    assert not isinstance(nn.Linear(2, 2), LoopedModel)  # the check can fail


def test_the_extract_runs_on_any_looped_model(tmp_path):
    m, (x, y) = model(), windows()
    write_extract(m, x, y, 4, tmp_path / "seed0", "gated")
    ext = load_extract(tmp_path / "seed0")
    assert ext.states.shape == (m.loops + 1, x.numel(), m.d_model)
    _, states = run_loops(m, x, m.loops)
    np.testing.assert_allclose(ext.states[-1], states[-1].flatten(0, 1).detach().numpy())


def test_the_depth_sweep_and_the_clamp_run_on_any_looped_model():
    m, (x, y) = model(), windows()
    docs = np.array([0, 0, 1, 1, 2, 2])
    got = measure(m, x, y, docs, 4, sweep_depth=6)
    metrics = summarize(got)
    assert set(metrics["ppl_at_depth"]) == {"k1", "k2", "k3"}
    assert all(math.isfinite(v) for v in metrics["radial_fraction_token"].values())
    assert metrics["lemma2"]["sweep_depth"] == 6
    unclamped = np.stack([got.tokens[f"ce_{k}"].to_numpy() for k in range(1, m.loops + 1)])
    token_docs = np.repeat(docs, x.shape[1])
    clamped = clamp_run(m, x, y, None, 4, unclamped, 0, token_docs)
    clamp = clamp_metrics([clamped], 100)
    assert clamp["freeze_loop1"]["delta_ce"]["k1"] == 0.0  # loop 1 is the reference
    assert set(clamp) == {"freeze_loop1", "remove_radial"}
    assert Units(docs, "document").describe()["units"] == 3


def test_trajectories_and_convergence_run_on_any_looped_model():
    m, (x, y) = model(), windows()
    traj = trajectory(m, x, y, None, depth=2 * m.loops, batch_size=4)
    assert traj.ce.shape == (2 * m.loops, x.numel()) and np.isnan(traj.kl[0]).all()
    docs = np.repeat(np.arange(6), x.shape[1])
    types = np.zeros(x.numel(), dtype=np.int64)
    cfg = ConvergenceConfig(depth_factor=2, bootstrap=50, useful_share=0.02)
    metrics = convergence_summary(traj, Sample(Documents(docs, cfg.bootstrap), docs), types,
                                  m.loops, 1e-3, cfg)
    assert metrics["max_depth"] == 2 * m.loops and 1 <= metrics["saturation"]["useful_depth"]


def test_the_masked_forward_runs_on_any_looped_model():
    """An exit freezes a token's state and keys and values; a threshold nothing is
    below exits nobody, and the outcome is then uniform depth's."""
    m, (x, y) = model(), windows()
    never = masked_forward(m, x, KL(0.0), cap=m.loops)
    _, states = run_loops(m, x, m.loops)
    torch.testing.assert_close(never.state, states[-1])
    assert (never.exit_loop == m.loops).all()
    some = evaluate(m, x, y, None, LatentDiff(0.9), m.loops, 4)
    assert some.exit_loop.min() < m.loops and np.isfinite(some.ce).all()
