"""Final-loop key/value reuse: free on a model whose loop settles on a fixed point,
costly on one that keeps moving; the trained model's own forward is what the own
pass computes."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from loopscope.measure.trajectory.reuse import reuse_ce, summarize
from loopscope.stats.intervals import Documents, Sample


class OneBlockLoop(nn.Module):
    """A looped LM with one causal attention per loop: h_k = g(h_{k-1}, attention over
    h_{k-1} + e). `gain` < 1 with a tanh makes the loop a contraction, with one fixed
    point that every run reaches whatever it attends to on the way; `gain` = -1 flips
    the state every loop, so it never settles."""

    def __init__(self, gain: float, vocab: int = 32, d: int = 16, loops: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gain, self.loops, self.d_model, self.context = gain, loops, d, 16
        self.kv_blocks, self.prelude_blocks, self.coda_blocks = 1, 0, 0
        self.readout_eps, self.random_state, self.exit_score = 0.0, False, None
        self.nominal_mean = self.sampler_mean = float(loops)
        self.embed = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.head = nn.Linear(d, vocab, bias=False)

    def inputs(self, idx, positions=None, kvs=None):
        return self.embed(idx)

    def initial_state(self, e, generator=None):
        return torch.zeros_like(e)

    def carry(self, h, first=False):
        return h

    def step(self, h, e, kvs=None, k=None, positions=None):
        q, key, v = (t[:, None] for t in self.qkv(h + e).chunk(3, dim=-1))  # one head
        y = (kvs[0](q, key, v) if kvs is not None
             else F.scaled_dot_product_attention(q, key, v, is_causal=True))[:, 0]
        if self.gain < 0:
            return self.gain * h + y + e
        return self.gain * torch.tanh(h + y + e)

    def read(self, h, last=True, positions=None, kvs=None):
        return self.head(h)


def data(n: int = 6, t: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 32, (n, t), generator=g)
    return x, torch.randint(0, 32, (n, t), generator=g)


def test_reuse_costs_nothing_where_the_loop_settles():
    """A contraction run 80 loops has reached its fixed point to float precision; the
    run that attends to the final loop's keys and values everywhere reaches it too."""
    model = OneBlockLoop(gain=0.3).eval()
    x, y = data()
    got = reuse_ce(model, x, y, None, (40, 80), batch_size=4)
    for own, reused in got.values():
        np.testing.assert_allclose(reused, own, atol=1e-5)


def test_reuse_costs_where_the_loop_does_not_settle():
    model = OneBlockLoop(gain=-1.0).eval()
    x, y = data()
    own, reused = reuse_ce(model, x, y, None, (7,), batch_size=4)[7]
    assert np.abs(reused - own).mean() > 1e-2


def test_the_own_pass_is_the_models_own_forward():
    """With its own keys and values the override pass is the plain forward."""
    model = OneBlockLoop(gain=-1.0).eval()
    x, y = data()
    own, _ = reuse_ce(model, x, y, None, (3,), batch_size=6)[3]
    with torch.no_grad():
        h = torch.zeros(*x.shape, model.d_model)
        e = model.inputs(x)
        for k in range(1, 4):
            h = model.step(h, e, k=k)
        plain = F.cross_entropy(model.read(h).flatten(0, 1), y.flatten(), reduction="none")
    np.testing.assert_allclose(own, plain.double().numpy(), rtol=1e-6, atol=1e-6)


def test_summarize_reports_the_cost_in_nats_and_as_a_share():
    own = np.full(100, 2.0)
    docs = np.repeat(np.arange(20), 5)
    sample = Sample(Documents(docs, 200), docs)
    got = summarize({4: (own, own + 0.1), 8: (own, own)}, sample, r=4)
    assert got["R"]["delta_ce"]["value"] == pytest.approx(0.1)
    assert got["R"]["share"]["value"] == pytest.approx(0.05)
    assert got["2R"]["share"]["value"] == 0
    with pytest.raises(ValueError, match="depths"):
        reuse_ce(OneBlockLoop(0.3), *data(), None, (0,), 2)
