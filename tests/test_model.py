"""LoopedLM behaviour: shapes, loop count, and what each readout can see."""

import dataclasses

import pytest
import torch
from conftest import TINY
from conftest import tiny_model as make
from conftest import tiny_tokens as tokens

from loopscope.model import LoopedLM, schedule


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


def test_inter_loop_norm_fixes_the_state_scale():
    out = make(inter_loop_norm=True)(tokens())
    for h in out.states:  # RMSNorm with unit gain: rms 1, so ||h|| = sqrt(d_model)
        torch.testing.assert_close(h.norm(dim=-1), torch.full(h.shape[:2], 32 ** 0.5),
                                   rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("variant", [
    dict(block="sandwich"), dict(inject="add"), dict(inject="concat_adapter"),
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
