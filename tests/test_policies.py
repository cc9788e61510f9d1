"""Paper B: the exit semantics (masked reference), the policies, convergence measures."""

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import BACKBONE, Scripted, tiny_tokens

from loopscope.config import TrainConfig
from loopscope.convergence import (
    argmax_changes_later,
    convergence_loop,
    token_type,
    trajectory,
    useful_depth,
)
from loopscope.depth import sampler
from loopscope.model import LoopedLM
from loopscope.policies import KL, Cosine, Latent, Uniform, masked_forward


def backbone(**overrides) -> LoopedLM:
    torch.manual_seed(0)
    return LoopedLM(dataclasses.replace(BACKBONE, **overrides)).eval()


def test_kl_policy_exits_where_the_kl_path_first_drops_below_epsilon():
    # logits whose successive KL is known: p_i = softmax(z / 2^i) flattens geometrically
    z = torch.tensor([[[4.0, 0.0, -4.0]]])
    path = [z / 2 ** i for i in range(6)]
    kls = [float(F.kl_div(F.log_softmax(path[i - 1], -1), F.log_softmax(path[i], -1),
                          log_target=True, reduction="sum")) for i in range(1, 6)]
    eps = (kls[2] + kls[3]) / 2  # below epsilon from the 4th comparison (loop 5) on
    assert kls[3] < eps < kls[2]
    rule, h, idx = KL(eps), torch.zeros(1, 3), torch.tensor([0])
    rule.reset(1)
    exits = [bool(rule.check(torch.tensor([loop]), h, path[loop - 1][0], idx))
             for loop in range(1, 7 - 1)]
    assert exits == [False, False, False, False, True]


def test_head_free_rules_compare_states_with_the_previous_check():
    h1, h2, idx = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.01]]), torch.tensor([0])
    latent, cosine = Latent(0.05), Cosine(1e-3)
    for rule in (latent, cosine):
        rule.reset(1)
        assert not rule.check(torch.tensor([1]), h1, None, idx)  # nothing to compare with yet
        assert rule.check(torch.tensor([2]), h2, None, idx)
    latent.reset(1)
    latent.check(torch.tensor([1]), h1, None, idx)
    assert not latent.check(torch.tensor([2]), 3 * h1, None, idx)  # relative change 2/3


def test_a_token_that_exits_keeps_its_state_and_shows_its_exit_loop_keys():
    model = backbone(n_coda=1)
    x = tiny_tokens(1, 3)
    e = model.inputs(x)
    h0 = model.initial_state(e, torch.Generator().manual_seed(3))
    run = masked_forward(model, x, Scripted(torch.tensor([[1, 2, 2]])), cap=2, h0=h0)
    assert run.exit_loop.tolist() == [[1, 2, 2]]

    # by hand: loop 1 for everyone, then loop 2 where position 0 offers its loop-1 k, v
    block = model.core[0]
    n_h, d = model.cfg.n_heads, model.cfg.d_model

    def heads(z):
        return z.view(1, 3, n_h, d // n_h).transpose(1, 2)

    with torch.no_grad():
        h1 = model.step(h0, e)
        x1 = model.adapter(torch.cat([h1, e], -1))
        _, k1, v1 = map(heads, block.attn.qkv(block.n1(model.adapter(torch.cat([h0, e], -1))))
                        .split(d, 2))
        q2, k2, v2 = map(heads, block.attn.qkv(block.n1(x1)).split(d, 2))
        k = torch.cat([k1[:, :, :1], k2[:, :, 1:]], 2)
        v = torch.cat([v1[:, :, :1], v2[:, :, 1:]], 2)
        scores = q2 @ k.transpose(-1, -2) / math.sqrt(d // n_h)
        scores = scores.masked_fill(torch.ones(3, 3).triu(1).bool(), float("-inf"))
        att = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, 3, d)
        y = block.n2(block.attn.proj(att) + x1)
        h2 = block.n4(block.mlp(block.n3(y)) + y)
        expected = torch.cat([h1[:, :1], h2[:, 1:]], 1)
        torch.testing.assert_close(run.state, expected, rtol=1e-5, atol=1e-5)
        # the final output: the coda and readout once over every token's exit state
        torch.testing.assert_close(run.logits, model.read(expected, last=True))
        # and it differs from the uniform run, where position 0 moved on
        uniform = model(x, loops=2, read="last", h0=h0).states[-1]
        assert not torch.allclose(uniform[:, 1:], h2[:, 1:], atol=1e-5)


def test_without_exits_the_masked_reference_is_uniform_depth():
    model = backbone()
    x = tiny_tokens(2, 16)
    h0 = model.initial_state(model.inputs(x), torch.Generator().manual_seed(0))
    run = masked_forward(model, x, Uniform(), cap=5, h0=h0)
    plain = model(x, loops=5, read="last", h0=h0)
    torch.testing.assert_close(run.logits, plain.logits[-1], rtol=1e-5, atol=1e-5)
    assert (run.exit_loop == 5).all() and (run.checks == 0).all()


def test_exited_states_do_not_change_at_later_loops():
    model = backbone()
    x = tiny_tokens(2, 16)
    h0 = model.initial_state(model.inputs(x), torch.Generator().manual_seed(0))
    mask = torch.rand(2, 16, generator=torch.Generator().manual_seed(5)) < 0.5
    exit_at = torch.where(mask, 2, 99)
    short = masked_forward(model, x, Scripted(exit_at), cap=2, h0=h0)
    long = masked_forward(model, x, Scripted(exit_at), cap=6, h0=h0)
    torch.testing.assert_close(long.state[mask], short.state[mask])
    assert not torch.allclose(long.state[~mask], short.state[~mask])


def test_convergence_loop_on_a_constructed_kl_path():
    eps = 1e-3
    kl = np.array([
        [np.nan, np.nan, np.nan, np.nan],
        [1e-1, 1e-4, 1e-1, 1e-4],   # loop 2
        [1e-2, 1e-4, 1e-4, 1e-4],   # loop 3
        [1e-4, 1e-4, 1e-4, 1e-2],   # loop 4
        [1e-4, 1e-4, 1e-4, 1e-2],   # loop 5
    ])
    # token 0 last moved at loop 3; token 1 never; token 2 at loop 2; token 3 still at 5
    assert convergence_loop(kl, eps).tolist() == [3, 1, 2, 5]


def test_probe_labels_are_the_oracle_definition():
    argmax = np.array([[1, 1, 1, 2],
                       [1, 2, 1, 2],
                       [1, 2, 3, 2],
                       [1, 2, 3, 5]])
    labels = argmax_changes_later(argmax, upto=3)  # loops 1, 2; later loops up to 3
    assert labels.tolist() == [[False, True, True, False],
                               [False, False, True, False]]


@pytest.mark.parametrize("convention, mean", [("loops", 8), ("loops_plus_one", 9)])
def test_the_sampler_mean_follows_its_convention(convention, mean):
    draws = sampler(TrainConfig(depth="lognormal", depth_mean=convention, seed=1), 8)
    values = [draws.sample() for _ in range(6000)]
    assert np.mean(values) == pytest.approx(mean, rel=0.03)
    assert draws.mean() == pytest.approx(mean, rel=0.02)


def test_useful_depth_is_the_first_within_tolerance_of_the_best():
    assert useful_depth(np.array([3.0, 2.5, 2.198, 2.195, 2.19, 2.2]), 0.01) == 3
    assert useful_depth(np.array([3.0, 2.0]), 0.01) == 2


@pytest.mark.parametrize("text, kind", [
    ("  \n", "whitespace"), (" ,", "punctuation"), ("--", "punctuation"), (" 1599", "number"),
    ("3.14", "number"), (" the", "function word"), ("Thou", "function word"),
    (" king", "content word"), ("ing", "content word"),
])
def test_token_types(text, kind):
    assert token_type(text) == kind


def test_trajectory_kl_and_ce_agree_with_a_direct_computation():
    model = backbone()
    x = tiny_tokens(2, 16)
    y = torch.roll(x, -1, 1)
    h0 = model.initial_state(model.inputs(x), torch.Generator().manual_seed(0))
    traj = trajectory(model, x, y, h0, depth=4, batch_size=1, keep_states=2)
    out = model(x, loops=4, read="none", h0=h0)
    logp = [F.log_softmax(model.read(h, last=True), -1) for h in out.states]
    ce3 = F.nll_loss(logp[2].flatten(0, 1), y.flatten(), reduction="none")
    np.testing.assert_allclose(traj.ce[2], ce3.detach().numpy(), rtol=1e-4, atol=1e-5)
    kl4 = (logp[3].exp() * (logp[3] - logp[2])).sum(-1).flatten()
    np.testing.assert_allclose(traj.kl[3], kl4.detach().numpy(), rtol=1e-3, atol=1e-6)
    assert np.isnan(traj.kl[0]).all() and traj.states.shape == (2, 32, BACKBONE.d_model)


def test_initial_states_are_keyed_by_seed_and_window_start():
    from loopscope.runs import initial_states

    model = backbone()
    both = initial_states(model, np.array([0, 16]), seed=42)
    torch.testing.assert_close(initial_states(model, np.array([16]), seed=42)[0], both[1])
    assert not torch.equal(initial_states(model, np.array([16]), seed=43)[0], both[1])
    assert not torch.equal(both[0], both[1])
    rms = both.pow(2).mean().sqrt()  # Huginn's: sqrt(2 / 5d) times sqrt(d), about 0.6
    assert 0.5 < rms < 0.7
    assert initial_states(backbone(state_init="embed"), np.array([0]), seed=42) is None
