"""The looped-model interface (loopscope.looped.interface): the measuring code needs nothing
of a model beyond it. A second looped model, written here against the interface alone
(no LoopedLM part), runs through the extract, paper A's depth sweep and clamp, paper B's
trajectories and convergence summary, the masked forward of the exit rules and the exit
runtime's scoring and decoding. It has
what a released model brings and LoopedLM lacks: grouped-query heads with a rotary
embedding (the attention override's contract), a core that depends on the loop index, a
random initial state drawn from a generator, and a native exit score."""

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import Scripted

from loopscope.looped.interface import LoopedModel, run_loops
from loopscope.measure.bench.runtime import generate, score
from loopscope.measure.exit_rules.exits import KL, ExitScore, LatentDiff, make
from loopscope.measure.exit_rules.masked import MaskedKV, evaluate, masked_forward
from loopscope.measure.exit_rules.policies import sweep_settings
from loopscope.measure.params import ConvergenceConfig
from loopscope.measure.per_loop.clamp import clamp_metrics, clamp_run
from loopscope.measure.per_loop.extract import load_extract, write_extract
from loopscope.measure.per_loop.sweep import float64_reader, measure, summarize
from loopscope.measure.runs import initial_states
from loopscope.measure.trajectory.convergence import summarize as convergence_summary
from loopscope.measure.trajectory.trajectories import trajectory
from loopscope.stats.intervals import Documents, Sample
from loopscope.stats.units import Units
from loopscope.weights.model import Cost, LoopedLM, ModelConfig


def rotate_half(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """A rotary embedding (the halves of each head turned by position * 100^(-i/h))."""
    half = x.shape[-1] // 2
    freq = 100.0 ** (-torch.arange(half, dtype=x.dtype) / half)
    angle = positions.to(x.dtype)[..., None] * freq  # (T, half) or (B, 1, T, half)
    if angle.dim() == 3:  # positions (B, T): one row per batch row, over the heads
        angle = angle[:, None]
    cos, sin = angle.cos(), angle.sin()
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


class GatedLoop(nn.Module):
    """A looped LM of another family: token embedding as the loop's input, a random
    initial state, and per loop one causal attention with grouped-query heads (4 query
    heads over 2 key/value heads, the rotary embedding on queries and keys) over the
    state plus the input and a learned vector of the loop index, mixed into the state
    by a learned gate (a GRU-like update, no residual stream, no pre-norm block); an
    RMS-normalized readout and an exit gate. It implements the interface's attributes
    and methods and nothing else."""

    def __init__(self, vocab: int = 64, d: int = 16, heads: int = 4, kv_heads: int = 2,
                 context: int = 16, loops: int = 3) -> None:
        super().__init__()
        self.loops, self.d_model, self.context = loops, d, context
        self.heads, self.kv_heads, self.dh = heads, kv_heads, d // heads
        self.kv_blocks, self.readout_eps, self.random_state = 1, 1e-6, True
        self.prelude_blocks = self.coda_blocks = 0  # no attention before or after the loop
        self.nominal_mean = self.sampler_mean = float(loops)
        self.embed = nn.Embedding(vocab, d)
        self.loop_vector = nn.Embedding(16, d)  # the loop index's own vector
        self.qkv = nn.Linear(d, d + 2 * kv_heads * self.dh, bias=False)
        self.mix = nn.Linear(2 * d, 2 * d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.gate = nn.Linear(d, 1)

    def exit_score(self, h: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.gate(h)).squeeze(-1)

    def inputs(self, idx: torch.Tensor, positions: torch.Tensor | None = None,
               kvs=None) -> torch.Tensor:
        return self.embed(idx)

    def initial_state(self, e: torch.Tensor, generator: torch.Generator | None = None
                      ) -> torch.Tensor:
        noise = torch.empty(e.shape, dtype=torch.float32, device=e.device)
        return noise.normal_(0.0, 0.1, generator=generator).to(e.dtype)

    def carry(self, h: torch.Tensor, first: bool | torch.Tensor = False) -> torch.Tensor:
        return h

    def attention_inputs(self, x: torch.Tensor, positions: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, 4, T, dh), k and v (B, 2, T, dh), q and k after the rotary embedding."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split([self.d_model, self.kv_heads * self.dh,
                                     self.kv_heads * self.dh], dim=2)
        q = q.view(b, t, self.heads, self.dh).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.dh).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.dh).transpose(1, 2)
        return rotate_half(q, positions), rotate_half(k, positions), v

    def step(self, h: torch.Tensor, e: torch.Tensor, kvs=None,
             k: int | torch.Tensor | None = None, positions: torch.Tensor | None = None
             ) -> torch.Tensor:
        if k is None:
            raise ValueError("this core needs the loop index")
        b, t, d = h.shape
        positions = torch.arange(t) if positions is None else positions
        # k: one loop for the call, or one per row (the runtime's decoding)
        loop = self.loop_vector.weight[torch.as_tensor(k).clamp(max=16) - 1]
        x = h + e + (loop[:, None] if loop.dim() == 2 else loop)
        q, keys, v = self.attention_inputs(x, positions)
        y = (kvs[0](q, keys, v) if kvs is not None
             else F.scaled_dot_product_attention(q, keys, v, is_causal=True, enable_gqa=True))
        y = y.transpose(1, 2).reshape(b, t, d)
        gate, cand = self.mix(torch.cat([h, y], dim=-1)).chunk(2, dim=-1)
        return torch.sigmoid(gate) * h + (1 - torch.sigmoid(gate)) * torch.tanh(cand + e)

    def read(self, h: torch.Tensor, last: bool, positions: torch.Tensor | None = None,
             kvs=None) -> torch.Tensor:
        return self.head(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.readout_eps))

    def reader(self) -> nn.Module:
        return GatedReader(self)

    def cost(self) -> Cost:
        d, v = self.d_model, self.head.out_features
        return Cost(prelude=0.0, loop=2 * (2 * d * d + 4 * d * d) + 2 * d * (self.context + 1),
                    readout=2 * d * v)


class GatedReader(nn.Module):
    """What GatedLoop.read runs: its head and the readout's eps."""

    def __init__(self, model: GatedLoop) -> None:
        super().__init__()
        self.head, self.readout_eps = model.head, model.readout_eps

    forward = GatedLoop.read


def model() -> GatedLoop:
    torch.manual_seed(0)
    return GatedLoop().eval()


def windows(n: int = 6, t: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 64, (n, t + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def h0_of(m: GatedLoop, n: int = 6) -> torch.Tensor:
    return initial_states(m, np.arange(n) * 16, seed=5)


def test_both_models_are_looped_models():
    assert isinstance(model(), LoopedModel)
    assert isinstance(LoopedLM(ModelConfig(vocab_size=64, context=16, d_model=32)), LoopedModel)
    assert not isinstance(nn.Linear(2, 2), LoopedModel)  # the check can fail


def test_the_initial_state_is_drawn_by_the_model_from_the_generator():
    """measure.runs draws a random H_0 through the interface, keyed by seed and window
    start; a model whose H_0 is its input gets none."""
    m = model()
    first, again = h0_of(m), h0_of(m)
    assert first.shape == (6, 16, 16) and torch.equal(first, again)
    assert not torch.equal(first[0], first[1])  # each window its own
    assert not torch.equal(initial_states(m, np.array([0]), seed=6)[0], first[0])
    plain = LoopedLM(ModelConfig(vocab_size=64, context=16, d_model=32))
    assert not plain.random_state and initial_states(plain, np.array([0]), seed=5) is None


def test_the_extract_runs_on_any_looped_model(tmp_path):
    m, (x, y) = model(), windows()
    h0 = h0_of(m)
    write_extract(m, x, y, 4, tmp_path / "seed0", "gated", h0)
    ext = load_extract(tmp_path / "seed0")
    assert ext.states.shape == (m.loops + 1, x.numel(), m.d_model)
    initial, states = run_loops(m, x, m.loops, h0)
    np.testing.assert_array_equal(ext.states[0], initial.flatten(0, 1).detach().numpy())
    np.testing.assert_allclose(ext.states[-1], states[-1].flatten(0, 1).detach().numpy())


def test_the_loop_index_reaches_the_core():
    """run_loops passes k = 1, 2, ...: a core that adds the loop's own vector gives
    other states when every loop is called as loop 1."""
    m, (x, _) = model(), windows(2)
    h0 = h0_of(m, 2)
    _, states = run_loops(m, x, 3, h0)
    e, h = m.inputs(x), h0
    for _ in range(3):
        h = m.step(m.carry(h), e, k=1)
    assert not torch.allclose(states[-1], h)
    with pytest.raises(ValueError, match="loop index"):
        m.step(h0, e)


def test_the_depth_sweep_and_the_clamp_run_on_any_looped_model():
    m, (x, y) = model(), windows()
    docs = np.array([0, 0, 1, 1, 2, 2])
    h0 = h0_of(m)
    got = measure(m, x, y, docs, 4, sweep_depth=6, h0=h0)
    metrics = summarize(got)
    assert set(metrics["ppl_at_depth"]) == {"k1", "k2", "k3"}
    assert all(math.isfinite(v) for v in metrics["radial_fraction_token"].values())
    assert metrics["lemma2"]["sweep_depth"] == 6
    unclamped = np.stack([got.tokens[f"ce_{k}"].to_numpy() for k in range(1, m.loops + 1)])
    token_docs = np.repeat(docs, x.shape[1])
    clamped = clamp_run(m, x, y, h0, 4, unclamped, 0, token_docs)
    clamp = clamp_metrics([clamped], 100)
    assert clamp["freeze_loop1"]["delta_ce"]["k1"] == 0.0  # loop 1 is the reference
    assert set(clamp) == {"freeze_loop1", "remove_radial"}
    assert Units(docs, "document").describe()["units"] == 3


def test_the_float64_copy_holds_the_readout_alone():
    """Lemma 1's float64 copy is the model's reader: its parameters, not the core's,
    and it reads as the model does."""
    m = model()
    wide = float64_reader(m)
    assert {p.dtype for p in wide.parameters()} == {torch.float64}
    assert sum(p.numel() for p in wide.parameters()) == m.head.weight.numel()
    h = torch.randn(2, 16, 16)
    torch.testing.assert_close(wide(h.double(), last=True).float(), m.read(h, last=True))
    plain = LoopedLM(ModelConfig(vocab_size=64, context=16, d_model=32, n_coda=1))
    names = {n for n, _ in float64_reader(plain).named_parameters()}
    assert names and all(n.startswith(("coda.", "norm_out.", "head.")) for n in names)


def test_trajectories_and_convergence_run_on_any_looped_model():
    m, (x, y) = model(), windows()
    h0 = h0_of(m)
    traj = trajectory(m, x, y, h0, depth=2 * m.loops, batch_size=4, keep_states=m.loops)
    assert traj.ce.shape == (2 * m.loops, x.numel()) and np.isnan(traj.kl[0]).all()
    _, states = run_loops(m, x, m.loops, h0)  # the trajectory passes the loop index too
    np.testing.assert_allclose(traj.states[-1], states[-1].flatten(0, 1).detach().numpy(),
                               rtol=1e-5)
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
    h0 = h0_of(m)
    never = masked_forward(m, x, KL(0.0), cap=m.loops, h0=h0)
    _, states = run_loops(m, x, m.loops, h0)
    torch.testing.assert_close(never.state, states[-1])
    assert (never.exit_loop == m.loops).all()
    some = evaluate(m, x, y, h0, LatentDiff(0.9), m.loops, 4)
    assert some.exit_loop.min() < m.loops and np.isfinite(some.ce).all()


class ByHandKV:
    """The override contract written out: frozen keys and values of exited tokens, each
    key head repeated for its group of query heads, an explicit causal mask."""

    def __init__(self) -> None:
        self.k = self.v = self.active = None

    def __call__(self, q, k, v):
        if self.k is None:
            self.k, self.v = k, v
        else:
            keep = self.active[:, None, :, None]
            self.k, self.v = torch.where(keep, k, self.k), torch.where(keep, v, self.v)
        group = q.shape[1] // k.shape[1]
        keys, values = (z.repeat_interleave(group, dim=1) for z in (self.k, self.v))
        t = q.shape[2]
        scores = q @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
        return scores.softmax(-1) @ values


@torch.no_grad()
def test_the_masked_attention_keeps_the_contract_with_grouped_query_heads():
    """MaskedKV against the contract written out by hand (ByHandKV): under any exit
    pattern the masked forward's states are those of running the loops with frozen
    keys and values, every key head serving its group of query heads, causally."""
    m, (x, _) = model(), windows(2)
    h0 = h0_of(m, 2)
    exit_at = torch.randint(1, 4, x.shape, generator=torch.Generator().manual_seed(2))
    run = masked_forward(m, x, Scripted(exit_at), cap=3, h0=h0)
    e, h, kv = m.inputs(x), h0, ByHandKV()
    active = torch.ones(x.shape, dtype=torch.bool)
    for loop in range(1, 4):
        kv.active = active
        new = m.step(m.carry(h, first=loop == 1), e, [kv], k=loop)
        h = torch.where(active[..., None], new, h)
        active = active & (exit_at > loop)
    torch.testing.assert_close(run.state, h, rtol=1e-5, atol=1e-6)
    assert (run.exit_loop == exit_at).all() and (exit_at < 3).any()
    q = torch.zeros(1, 4, 5, 2)
    with pytest.raises(ValueError, match="query heads a multiple of key heads"):
        MaskedKV()(q, torch.zeros(1, 3, 5, 2), torch.zeros(1, 3, 5, 2))


def test_a_native_exit_score_is_one_more_rule_where_the_model_has_one():
    """exit-score exits once prod (1 - p) of the model's gate falls below the threshold;
    0 never exits (uniform depth); a sweep runs it on a model with a score and leaves
    it out on one without."""
    m, (x, y) = model(), windows()
    h0 = h0_of(m)
    never = evaluate(m, x, y, h0, make("exit-score", 0.0, score=m.exit_score), m.loops, 4)
    assert (never.exit_loop == m.loops).all()
    p = m.exit_score(run_loops(m, x, 1, h0)[1][0]).flatten()
    loose = evaluate(m, x, y, h0, ExitScore(m.exit_score, 0.99), m.loops, 4)
    np.testing.assert_array_equal(loose.exit_loop == 1, (1 - p < 0.99).numpy())
    with pytest.raises(ValueError, match="has none"):
        make("exit-score", 0.5)
    grids = {"exit-score": [0.0, 0.5], "latent-diff": [0.0, 0.03]}
    swept = sweep_settings(m, x, y, h0, m.loops, 4, grids, 1, 1)
    assert ("exit-score", 0.5) in swept
    plain = LoopedLM(ModelConfig(vocab_size=64, context=16, d_model=32)).eval()
    assert plain.exit_score is None
    swept = sweep_settings(plain, x, y, None, 3, 4, grids, 1, 1)
    assert set(swept) == {("latent-diff", 0.0), ("latent-diff", 0.03)}


@torch.no_grad()
def test_the_exit_runtime_runs_on_any_looped_model():
    """The runtime reaches a model through the interface alone: on the grouped-query,
    rotary, loop-dependent model, scoring and token-by-token decoding (streams at
    different loops in one core call: k per row, positions per row) equal the masked
    forward for random exits, and the native exit score decides alike in all three."""
    m, (x, _) = model(), windows(3, 12)
    h0 = h0_of(m, 3)[:, :12]
    exit_at = torch.randint(1, 4, x.shape, generator=torch.Generator().manual_seed(5))
    ref = masked_forward(m, x, Scripted(exit_at), cap=3, h0=h0)
    scored = score(m, x, Scripted(exit_at), cap=3, h0=h0)
    decoded = generate(m, x, Scripted(exit_at), cap=3, h0=h0)
    assert (exit_at < 3).any() and (exit_at == 1).any()
    for run in (scored, decoded):
        assert torch.equal(run.exit_loop, exit_at)
        torch.testing.assert_close(run.logits, ref.logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(scored.state, ref.state, rtol=1e-4, atol=1e-5)
    # a threshold in the widest gap of the first loop's 1 - p around its median, so no
    # decision sits within round-off of it: about half the tokens exit at loop 1
    stay = (1 - m.exit_score(run_loops(m, x, 1, h0)[1][0])).flatten().sort().values
    n = len(stay) // 2
    gaps = stay[n - 4:n + 4].diff()
    i = n - 4 + int(gaps.argmax())
    gate = ExitScore(m.exit_score, float(stay[i] + stay[i + 1]) / 2)
    ref = masked_forward(m, x, gate, cap=3, h0=h0)
    assert 1 < len(ref.exit_loop.unique())  # the gate exits some tokens, not all
    for run in (score(m, x, gate, cap=3, h0=h0), generate(m, x, gate, cap=3, h0=h0)):
        assert torch.equal(run.exit_loop, ref.exit_loop)


def test_the_exit_benchmark_runs_on_any_looped_model():
    """bench_exits' modes (uniform depths, the runtime's scoring and decoding, the
    masked forward) reach the model through the interface alone, so an outside model
    gets the benchmark: on the grouped-query model every mode is timed, and uniform
    depth is run_loops read out once."""
    from loopscope.measure.bench.bench_exits import decoding, scoring, uniform_depth
    from loopscope.measure.runs import Windows

    m, (x, y) = model(), windows(4, 12)
    h0 = h0_of(m, 4)[:, :12]
    w = Windows(x, y, np.arange(4) * 12, np.arange(4), h0)
    rules = {"kl": KL(1e-3), "latent-diff": LatentDiff(0.3)}
    out = scoring(m, w, rules, r=3, b=2, batch=2, repeats=3)
    assert set(out["seconds"]) >= {"uniform_3", "uniform_2", "kl", "latent-diff"}
    out = decoding(m, w, rules, r=3, b=2, streams=2, tokens=6, repeats=3)
    assert set(out["seconds"]) >= {"uniform_3", "uniform_2", "kl", "latent-diff"}
    _, states = run_loops(m, x, 3, h0)
    torch.testing.assert_close(uniform_depth(m, x, 3, h0), m.read(states[-1], last=True))
