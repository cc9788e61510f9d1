"""The adaptive runtime equals the masked forward: scoring and decoding, for random
exit patterns, on models with and without prelude and coda."""

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import BACKBONE, TINY, Scripted

from loopscope.measure.bench import ledger
from loopscope.measure.bench.runtime import Layout, generate, score
from loopscope.measure.exit_rules.exits import RULES, Uniform, make
from loopscope.measure.exit_rules.masked import masked_forward
from loopscope.weights.model import LoopedLM

MODELS = {
    "paper A (no prelude/coda)": TINY,
    "backbone (prelude, coda 1)": BACKBONE,
    "backbone, coda 2, two core blocks": dataclasses.replace(BACKBONE, n_coda=2, n_core=2),
    "inter-loop norm, add inject": dataclasses.replace(TINY, inter_loop_norm=True,
                                                        inject="add", n_prelude=1),
}


def setup(cfg, b=3, t=16, seed=0):
    torch.manual_seed(seed)
    model = LoopedLM(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(0, cfg.vocab_size, (b, t), generator=g)
    h0 = model.initial_state(model.inputs(x), torch.Generator().manual_seed(seed + 2))
    return model, x, h0


def random_exits(b, t, cap, seed):
    return torch.randint(1, cap + 1, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("seed", [0, 1])
def test_scoring_equals_the_masked_forward_for_random_exits(name, seed):
    model, x, h0 = setup(MODELS[name], seed=seed)
    exit_at = random_exits(*x.shape, 6, seed)
    ref = masked_forward(model, x, Scripted(exit_at), cap=6, h0=h0)
    run = score(model, x, Scripted(exit_at), cap=6, h0=h0)
    assert torch.equal(run.exit_loop, ref.exit_loop) and torch.equal(run.exit_loop, exit_at)
    torch.testing.assert_close(run.state, ref.state, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(run.logits, ref.logits, rtol=1e-4, atol=1e-4)
    # the work done shrinks as tokens exit: loop i computes the tokens not yet exited
    assert run.active_per_loop == [int((exit_at >= i).sum()) for i in range(1, 7)]


@pytest.mark.parametrize("name", list(MODELS))
def test_decoding_equals_the_masked_forward_for_random_exits(name):
    model, x, h0 = setup(MODELS[name], b=3, t=12)
    exit_at = random_exits(3, 12, 5, 7)
    ref = masked_forward(model, x, Scripted(exit_at), cap=5, h0=h0)
    run = generate(model, x, Scripted(exit_at), cap=5, h0=h0)
    assert torch.equal(run.exit_loop, exit_at)
    torch.testing.assert_close(run.logits, ref.logits, rtol=1e-4, atol=1e-4)
    # depth-wise batching: streams share steps, so the decode takes about the mean
    # number of loops per stream, not the deepest path of every position
    assert run.steps <= int(exit_at.sum(1).max())


# A threshold per rule at which the random backbone exits some tokens early and no
# decision sits within float round-off of it (checked at +-0.1%).
THRESHOLDS = {"kl": 1e-3, "kl-huginn": 1e-3, "minp-kl": 1e-3, "entropy-diff": 1e-3,
              "latent-diff": 0.3, "cosine": 0.1, "latent-acceleration": 0.3,
              "latent-acceleration-2hit": 0.3, "argmax-stability": 3, "probe": 0.01}


def test_every_rule_is_in_the_agreement_test():
    assert set(THRESHOLDS) == set(RULES) - {"uniform"}


@pytest.mark.parametrize("rule", list(THRESHOLDS))
def test_every_rule_decides_alike_in_the_runtime_and_the_reference(rule):
    # the same policy object through the masked forward, runtime scoring and decoding
    model, x, h0 = setup(BACKBONE, b=2, t=16)
    w = torch.randn(BACKBONE.d_model, generator=torch.Generator().manual_seed(0))
    policy = make(rule, THRESHOLDS[rule], probe=(w, 0.0))
    ref = masked_forward(model, x, policy, cap=8, h0=h0)
    run = score(model, x, policy, cap=8, h0=h0)
    assert torch.equal(run.exit_loop, ref.exit_loop) and torch.equal(run.checks, ref.checks)
    torch.testing.assert_close(run.logits, ref.logits, rtol=1e-4, atol=1e-4)
    decoded = generate(model, x, policy, cap=8, h0=h0)
    assert torch.equal(decoded.exit_loop, ref.exit_loop)
    assert torch.equal(decoded.checks, ref.checks)
    torch.testing.assert_close(decoded.logits, ref.logits, rtol=1e-4, atol=1e-4)
    assert 1 < ref.exit_loop.float().mean() < 8  # the rule did exit some tokens early


@pytest.mark.parametrize("rule", ["latent-diff", "cosine"])
def test_the_first_check_compares_with_h0_in_every_engine(rule):
    # at a threshold of 1 some tokens' loop-1 state is close enough to their H_0 to
    # exit at loop 1, which only the comparison with H_0 (Policy.begin) allows
    model, x, h0 = setup(BACKBONE, b=2, t=16)
    policy = make(rule, 1.0)
    ref = masked_forward(model, x, policy, cap=8, h0=h0)
    assert (ref.exit_loop == 1).any()
    assert torch.equal(score(model, x, policy, cap=8, h0=h0).exit_loop, ref.exit_loop)
    assert torch.equal(generate(model, x, policy, cap=8, h0=h0).exit_loop, ref.exit_loop)


def test_uniform_decoding_is_a_plain_forward_pass():
    model, x, h0 = setup(BACKBONE, b=2, t=10)
    run = generate(model, x, Uniform(), cap=4, h0=h0)
    plain = model(x, loops=4, read="last", h0=h0).logits[-1]
    torch.testing.assert_close(run.logits, plain, rtol=1e-4, atol=1e-4)
    assert run.steps == 10 * 4


@pytest.mark.parametrize("name", list(MODELS))
def test_uniform_runtime_runs_the_loops_of_forward(name):
    # every path loops alike: with an inter-loop norm, loop k + 1 starts from the normed
    # H_k while H_k itself is the state kept and read out (LoopedLM.carry)
    model, x, h0 = setup(MODELS[name], b=2, t=10)
    plain = model(x, loops=4, read="last", h0=h0)
    scored = score(model, x, Uniform(), cap=4, h0=h0)
    torch.testing.assert_close(scored.state, plain.states[-1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(scored.logits, plain.logits[-1], rtol=1e-4, atol=1e-4)
    decoded = generate(model, x, Uniform(), cap=4, h0=h0)
    torch.testing.assert_close(decoded.logits, plain.logits[-1], rtol=1e-4, atol=1e-4)


def test_layout_pads_each_rows_active_queries():
    active = torch.tensor([[True, False, True, True], [False, False, False, False],
                           [False, True, False, False]])
    lay = Layout.of(active)
    assert lay.idx.tolist() == [0, 2, 3, 9]
    assert lay.rows.tolist() == [0, 2] and lay.slots == 3
    assert lay.row_of.tolist() == [0, 0, 0, 1] and lay.slot_of.tolist() == [0, 1, 2, 0]
    # row 0's second query sits at position 2: it sees keys 0..2
    assert lay.mask[0, 0, 1].tolist() == [True, True, True, False]


def test_the_ledger_gives_each_part_its_exclusive_time():
    """Marked stretches, one nested in another: each part counts its own time only, and
    the rest is the wall time outside every mark."""
    import time

    def call() -> None:
        with ledger.part("loop"):
            time.sleep(0.03)
            with ledger.part("kv"):
                time.sleep(0.02)
        with ledger.part("gather"):
            time.sleep(0.01)
        time.sleep(0.01)

    found = ledger.measure(call)
    assert found["loop"] == pytest.approx(0.03, abs=0.01)
    assert found["kv"] == pytest.approx(0.02, abs=0.01)
    assert found["gather"] == pytest.approx(0.01, abs=0.01)
    assert found["rest"] == pytest.approx(0.01, abs=0.01)
    parts = sum(found[k] for k in (*ledger.PARTS, "rest"))
    assert parts == pytest.approx(found["wall"])
    assert not ledger.ACTIVE  # the marks are off again


def quietest(call: Callable[[], Any], times: int = 5) -> dict[str, float]:
    """The least disturbed of a few ledger measurements (the smallest wall): one call on
    a toy model takes milliseconds, so one page fault or collection can fill its rest."""
    return min((ledger.measure(call) for _ in range(times)), key=lambda found: found["wall"])


def test_the_runtime_marks_every_kind_of_work():
    model, x, h0 = setup(BACKBONE, b=2, t=16)
    policy = make("kl", 1e-3)
    for call in (lambda: score(model, x, policy, cap=8, h0=h0),
                 lambda: generate(model, x, policy, cap=8, h0=h0)):
        found = quietest(call)
        assert all(found[k] > 0 for k in ledger.PARTS), found
        assert found["rest"] >= 0 and found["loop"] > found["rest"]
    uniform = ledger.measure(lambda: score(model, x, make("uniform"), cap=8, h0=h0))
    assert uniform["check"] == 0.0
