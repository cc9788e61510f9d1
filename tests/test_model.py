"""LoopedLM behaviour: shapes, loop count, and what each readout can see."""

import dataclasses
import math

import pytest
import torch
from conftest import TINY
from conftest import tiny_model as make
from conftest import tiny_tokens as tokens

from loopscope.weights.config import ModelConfig, TrainConfig
from loopscope.weights.model import LoopedLM, StableInjection, param_count, schedule
from loopscope.weights.train import optimizer


def test_shapes_and_loop_count():
    out = make()(tokens())
    assert len(out.states) == 3 and len(out.logits) == 3
    assert out.states[0].shape == (2, 16, 32)
    assert out.logits[-1].shape == (2, 16, 64)


@pytest.mark.parametrize("loops", [1, 2, 5])
def test_loop_count_is_honoured(loops):
    out = make()(tokens(), loops=loops)
    assert len(out.states) == loops


def test_states_do_not_depend_on_later_loops():
    model = make()
    short, long = model(tokens(), loops=2), model(tokens(), loops=4)
    torch.testing.assert_close(short.states[1], long.states[1])


def test_read_last_and_none():
    model = make()
    last = model(tokens(), read="last")
    assert last.logits[:-1] == [None, None] and last.logits[-1] is not None
    assert all(lg is None for lg in model(tokens(), read="none").logits)


def state() -> torch.Tensor:
    """A hidden state of unit rms, well above RMSNorm's eps."""
    return torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(2))


def test_normed_readout_is_scale_invariant():
    model = make(readout="normed")
    h = state()
    torch.testing.assert_close(model.read(7.0 * h, last=False), model.read(h, last=False),
                               rtol=1e-4, atol=1e-4)


def test_raw_readout_sees_scale():
    model = make(readout="raw")
    h = state()
    torch.testing.assert_close(model.read(7.0 * h, last=False), 7.0 * model.read(h, last=False))
    assert not torch.allclose(model.read(7.0 * h, last=False), model.read(h, last=False))


def test_final_norm_readout_is_raw_before_the_last_loop():
    model = make(readout="final_norm")
    h = state()
    torch.testing.assert_close(model.read(3.0 * h, last=True), model.read(h, last=True),
                               rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.read(3.0 * h, last=False), 3.0 * model.read(h, last=False))


def test_hook_changes_what_is_fed_back():
    model = make()
    plain = model(tokens())
    hooked = model(tokens(), hook=lambda k, h: h * 2.0 if k == 1 else h)
    torch.testing.assert_close(hooked.states[0], 2.0 * plain.states[0])
    assert not torch.allclose(hooked.states[1], plain.states[1])


def by_hand(model, x, loops, hook=None):
    """Loop by loop through step and carry, as convergence and the runtime run it."""
    e = model.inputs(x)
    h, states = model.initial_state(e), []
    for k in range(1, loops + 1):
        h = model.step(model.carry(h, first=k == 1), e)
        h = hook(k, h) if hook is not None else h
        states.append(h)
    return states


@pytest.mark.parametrize("inter_loop_norm", [False, True])
def test_forward_equals_step_by_step(inter_loop_norm):
    model = make(inter_loop_norm=inter_loop_norm, inject="add")
    out = model(tokens(), loops=4)
    for a, b in zip(out.states, by_hand(model, tokens(), 4), strict=True):
        assert torch.equal(a, b)


def test_inter_loop_norm_feeds_the_next_loop_only():
    # paper A's reference: each loop's readout, logged norm and penalty use the state
    # before the norm; the norm is applied to what the next loop starts from
    model = make(inter_loop_norm=True)
    x = tokens()
    out = model(x)
    e = model.inputs(x)
    # the stored states are not normed: loop 1's keeps the small scale of gpt2's H_0
    assert out.states[0].pow(2).mean(-1).sqrt().max() < 0.1
    assert not any(torch.allclose(h, model.carry(h), atol=1e-3) for h in out.states)
    for k, h in enumerate(out.states):
        torch.testing.assert_close(out.logits[k], model.read(h, last=k == 2))
        carried = model.carry(h)  # RMSNorm with unit gain: rms 1, ||h|| = sqrt(d_model)
        torch.testing.assert_close(carried.norm(dim=-1), torch.full(h.shape[:2], 32 ** 0.5),
                                   rtol=1e-3, atol=1e-3)
        if k + 1 < len(out.states):
            torch.testing.assert_close(out.states[k + 1], model.step(carried, e))
    # no norm before loop 1: it starts from H_0 itself
    torch.testing.assert_close(out.states[0], model.step(out.initial, e))
    assert torch.equal(model.carry(out.initial, first=True), out.initial)


def test_inter_loop_norm_hides_the_scale_from_the_next_loop_not_from_the_readout():
    model = make(inter_loop_norm=True, readout="raw")
    plain = model(tokens())
    # loop 2's state (rms ~1, well above RMSNorm's eps) scaled 3x, as the clamp scales
    scaled = model(tokens(), hook=lambda k, h: 3.0 * h if k == 2 else h)
    # the scaled state is what is stored and read: its norm and raw logits change ...
    torch.testing.assert_close(scaled.states[1], 3.0 * plain.states[1])
    torch.testing.assert_close(scaled.logits[1], 3.0 * plain.logits[1])
    # ... while the next loop, which starts from RMSNorm of it, does not see the scale
    torch.testing.assert_close(scaled.states[2], plain.states[2], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(scaled.logits[2], plain.logits[2], rtol=1e-4, atol=1e-5)


def test_carry_takes_a_per_token_first_mask():
    model = make(inter_loop_norm=True)
    h = state()
    first = torch.zeros(2, 16, dtype=torch.bool)
    first[0, :5] = True
    mixed = model.carry(h, first=first)
    assert torch.equal(mixed[first], h[first])
    assert torch.equal(mixed[~first], model.carry(h)[~first])
    assert torch.equal(make().carry(h), h)  # without the norm: h itself


def test_convergence_sweep_runs_the_same_loops_as_forward():
    from loopscope.measure.trajectory.trajectories import trajectory
    model = make(inter_loop_norm=True, inject="add")
    x = tokens()
    traj = trajectory(model, x, x, None, depth=4, batch_size=1, keep_states=4)
    out = model(x, loops=4)
    for k, h in enumerate(out.states):
        torch.testing.assert_close(torch.from_numpy(traj.states[k]), h.flatten(0, 1))


def test_paper_a_init_is_pytorchs_default():
    cfg = dataclasses.replace(TINY, d_model=64, n_heads=4, init="paper_a")
    torch.manual_seed(0)
    model = LoopedLM(cfg)
    gpt2 = LoopedLM(dataclasses.replace(cfg, init="gpt2"))
    assert model.embed_scale == 1.0 and model.head.weight is model.embed.weight
    for emb in (model.embed, model.pos):  # nn.Embedding's N(0, 1)
        assert abs(emb.weight.std().item() - 1.0) < 0.1 and abs(emb.weight.mean()) < 0.1
    block = model.core[0]
    for lin in (block.attn.qkv, block.attn.proj, block.mlp.up, block.mlp.down):
        bound = 1 / lin.in_features ** 0.5  # kaiming-uniform: U(-1/sqrt(fan_in), ...)
        assert lin.weight.abs().max() <= bound
        assert abs(lin.weight.std().item() / (bound / 3 ** 0.5) - 1) < 0.1
    # no scaled residual init: the output projection is drawn like qkv (same fan-in)
    assert abs(block.attn.proj.weight.std() / block.attn.qkv.weight.std() - 1) < 0.1
    assert gpt2.core[0].attn.proj.weight.std() < 0.5 * gpt2.core[0].attn.qkv.weight.std()
    assert all(torch.equal(n.weight, torch.ones(64)) for n in (block.n1, block.n2,
                                                             model.norm_out))
    # ||H_0|| ~ sqrt(2d) (token + position, N(0, 1) each): 50x gpt2's
    x = tokens()
    norm = model.inputs(x).norm(dim=-1).mean().item()
    assert abs(norm / (2 * 64) ** 0.5 - 1) < 0.15
    assert abs(norm / gpt2.inputs(x).norm(dim=-1).mean().item() / 50 - 1) < 0.2


@pytest.mark.parametrize("variant", [
    dict(block="sandwich"), dict(inject="add"), dict(inject="concat_adapter"),
    dict(inject="stable"), dict(inject="stable", readout="raw", n_prelude=1, n_coda=1),
    dict(state_init="noise"), dict(n_prelude=1, n_coda=1, block="sandwich",
                                   inject="concat_adapter", state_init="noise"),
])
def test_variants_run_and_learn(variant):
    model = make(**variant).train()
    out = model(tokens())
    assert all(torch.isfinite(lg).all() for lg in out.logits)
    out.logits[-1].sum().backward()
    assert all(p.grad is not None for p in model.core.parameters())


def test_tied_head():
    model = make()
    assert model.head.weight is model.embed.weight


def test_too_long_sequence_is_rejected():
    with pytest.raises(ValueError, match="model.context"):
        make()(tokens(t=17))


def test_swiglu_ffn_adds_a_gate_matrix_per_block():
    base = dataclasses.replace(TINY, n_core=2, loops=2)
    gelu = LoopedLM(base)
    swiglu = LoopedLM(dataclasses.replace(base, ffn="swiglu"))
    assert swiglu.num_params() - gelu.num_params() == 2 * 4 * 32 * 32
    out = swiglu(torch.randint(0, 64, (2, 16)))
    assert out.logits[-1].shape == (2, 16, 64) and torch.isfinite(out.logits[-1]).all()


@pytest.mark.parametrize("loops, read, grad, frozen, reads", [
    (4, "all", 0, 0, (1, 2, 3, 4)), (4, "last", 0, 0, (4,)), (4, "none", 0, 0, ()),
    (6, "all", 2, 4, (5, 6)), (6, "last", 2, 4, (6,)), (3, "all", 5, 0, (1, 2, 3)),
])
def test_schedule_says_which_loops_build_a_graph_and_are_read(loops, read, grad, frozen,
                                                               reads):
    s = schedule(loops, read, grad)
    assert (s.frozen, s.read, s.graph_loops) == (frozen, reads, loops - frozen)
    out = make().train()(tokens(), loops=loops, read=read, grad_loops=grad)
    assert tuple(k for k, lg in enumerate(out.logits, 1) if lg is not None) == reads
    assert [h.requires_grad for h in out.states] == [k > frozen for k in range(1, loops + 1)]


def test_stable_injection_contracts_the_state_whatever_its_parameters():
    """A_bar = exp(-Delta A) lies in (0, 1) per channel for any parameter values, as
    float32 computes it; Parcae's initialisation gives A_bar = sqrt(1/5), Delta =
    -log(sqrt(1/5)) and B the identity; the injection input is normalised first; the
    option is off by default."""
    assert ModelConfig().inject == "none"
    inj = StableInjection(64)
    a_bar, step = inj.coefficients()
    assert torch.allclose(a_bar, torch.full((64,), 5 ** -0.5), atol=1e-6)
    assert torch.allclose(step, torch.full((64,), -math.log(5 ** -0.5)), atol=1e-6)
    assert torch.equal(inj.b, torch.eye(64)) and inj.b.shape == (64, 64)  # a full B
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for scale in (1.0, 10.0, 100.0, 1e4):
            for p in (inj.a, inj.delta):
                p.copy_(torch.randn(64, generator=gen) * scale)
            a_bar, _ = inj.coefficients()
            assert (a_bar > 0).all() and (a_bar < 1).all(), scale
        inj.a.fill_(-1e4), inj.delta.fill_(-1e4)  # rate -> 0: A_bar would round to 1
        assert (inj.coefficients()[0] < 1).all()
        inj.a.fill_(1e4), inj.delta.fill_(1e4)  # rate -> inf: A_bar would round to 0
        assert (inj.coefficients()[0] > 0).all()
    h, e = torch.randn(2, 3, 64), torch.randn(2, 3, 64)
    a_bar, step = inj.coefficients()
    normed = e / e.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    assert torch.allclose(inj(h, e), a_bar * h + step * normed @ inj.b.T, atol=1e-6)
    assert torch.allclose(inj(h, 1000 * e), inj(h, e), atol=1e-4)  # e's scale never enters


def test_stable_injection_is_counted_gets_gradients_and_no_weight_decay():
    model = make(inject="stable")
    d = TINY.d_model
    assert model.num_params() == param_count(model.cfg) == param_count(TINY) + d * d + 3 * d
    model(tokens()).logits[-1].sum().backward()
    assert all(p.grad is not None for p in model.stable.parameters())
    opt = optimizer(model, TrainConfig(weight_decay=0.1))
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert not decayed & {id(p) for p in model.stable.parameters()}  # as Parcae's
    assert id(model.head.weight) in decayed
    assert make().stable is None
