"""Paper B: the exit semantics (masked forward), the policies, convergence measures."""

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import BACKBONE, Scripted, tiny_tokens

from loopscope.measure.exit_rules.exits import (
    KL,
    KNOWN,
    NATIVE,
    RULES,
    ArgmaxStability,
    Cosine,
    EntropyDiff,
    KLHuginn,
    LatentAcceleration,
    LatentAcceleration2Hit,
    LatentDiff,
    MinpKL,
    Uniform,
    make,
    never_exits,
    rule_defaults,
)
from loopscope.measure.exit_rules.masked import PolicyResult, evaluate, masked_forward
from loopscope.measure.exit_rules.policies import (
    SWEPT,
    Sweep,
    headline,
    settings,
    summarize,
    summarize_sweeps,
    sweep_settings,
)
from loopscope.measure.exit_rules.probe import argmax_changes_later
from loopscope.measure.exit_rules.rules import RULES as RULE_DATA
from loopscope.measure.exit_rules.rules import default_grids
from loopscope.measure.exit_rules.signals import minp_log_probs
from loopscope.measure.params import PoliciesConfig
from loopscope.measure.trajectory.convergence import convergence_loop, shares, useful_depth
from loopscope.measure.trajectory.trajectories import trajectory, uniform_ce
from loopscope.stats.intervals import Documents, Sample
from loopscope.weights import model as model_module
from loopscope.weights.config import TrainConfig
from loopscope.weights.depth import sampler
from loopscope.weights.model import LoopedLM
from loopscope.weights.params import ParamsError, build


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
    latent, cosine = LatentDiff(0.05), Cosine(1e-3)
    for rule in (latent, cosine):
        rule.reset(1)
        assert not rule.check(torch.tensor([1]), h1, None, idx)  # nothing to compare with yet
        assert rule.check(torch.tensor([2]), h2, None, idx)
    latent.reset(1)
    latent.check(torch.tensor([1]), h1, None, idx)
    assert not latent.check(torch.tensor([2]), 3 * h1, None, idx)  # relative change 2/3


def test_head_free_rules_compare_the_first_check_with_the_initial_state():
    # Huginn's latent-diff and cosine start from the initial latents: a state that
    # barely moved in loop 1 exits at the first check, one that moved far does not
    h0, idx = torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([0, 1])
    h1 = torch.tensor([[1.0, 0.01], [0.0, 1.0]])
    for rule in (LatentDiff(0.03), Cosine(1e-3)):
        rule.reset(2)
        rule.begin(idx, h0)
        assert rule.check(torch.tensor([1, 1]), h1, None, idx).tolist() == [True, False]


def test_cosine_at_threshold_0_never_fires_on_round_off():
    # 1 - cos(x, x) comes out below 0 in float32 for some x: clamped, it cannot be < 0
    x = torch.randn(1000, 32, generator=torch.Generator().manual_seed(0))
    assert (1 - F.cosine_similarity(x, x, dim=-1) < 0).any()
    rule, idx = Cosine(0.0), torch.arange(1000)
    rule.reset(1000)
    rule.begin(idx, x)
    assert not rule.check(torch.ones(1000, dtype=torch.long), x, None, idx).any()


def test_kl_huginn_reverses_a1s_direction_and_can_exit_at_the_first_check():
    idx, h = torch.tensor([0]), torch.zeros(1, 2)
    flat = torch.zeros(1, 5)  # the uniform distribution: KL to the start is 0
    for rule, exits in ((KLHuginn(1e-3), True), (KL(1e-3), False)):
        rule.reset(1)
        assert bool(rule.check(torch.tensor([1]), h, flat, idx)) == exits
    # two distributions whose KL differs by direction: eps between the two values
    prev, now = torch.tensor([[3.0, 0.0, 0.0]]), torch.tensor([[1.0, 0.0, 0.0]])
    lp, ln = F.log_softmax(prev, -1), F.log_softmax(now, -1)
    forward = float((ln.exp() * (ln - lp)).sum())   # KL(now || prev), A1's
    backward = float((lp.exp() * (lp - ln)).sum())  # KL(prev || now), Huginn's
    eps = (forward + backward) / 2
    assert backward < eps < forward
    for rule, exits in ((KLHuginn(eps), True), (KL(eps), False)):
        rule.reset(1)
        rule.check(torch.tensor([1]), h, prev, idx)
        assert bool(rule.check(torch.tensor([2]), h, now, idx)) == exits


def test_minp_kl_ignores_the_tail_below_a_tenth_of_the_top_probability():
    # min-p: tokens below 0.1 x the top probability count as 1/V, then renormalized
    p = torch.tensor([[0.6, 0.3, 0.05, 0.05]])
    expected = torch.tensor([0.6, 0.3, 0.25, 0.25]) / 1.4
    torch.testing.assert_close(minp_log_probs(p.log()).exp()[0], expected)
    # the tail moves below 0.07 while the head stays: minp-kl sees nothing, Huginn's
    # plain KL does
    before = torch.tensor([[0.7, 0.2, 0.025, 0.025, 0.025, 0.025]]).log()
    after = torch.tensor([[0.7, 0.2, 0.06, 0.02, 0.01, 0.01]]).log()
    h, idx = torch.zeros(1, 2), torch.tensor([0])
    for rule, exits in ((MinpKL(1e-5), True), (KLHuginn(1e-3), False)):
        rule.reset(1)
        assert not rule.check(torch.tensor([1]), h, before, idx)  # far from uniform
        assert bool(rule.check(torch.tensor([2]), h, after, idx)) == exits


def test_entropy_diff_exits_when_the_entropy_stops_changing_not_the_distribution():
    h, idx = torch.zeros(1, 2), torch.tensor([0])
    a = torch.tensor([[2.0, 1.0, 0.0]])
    rule = EntropyDiff(1e-3)
    rule.reset(1)
    assert not rule.check(torch.tensor([1]), h, a, idx)  # Huginn's start: entropy 100
    # the same probabilities on other tokens: the argmax moved, the entropy did not
    assert rule.check(torch.tensor([2]), h, a[:, [2, 0, 1]], idx)
    rule.reset(1)
    rule.check(torch.tensor([1]), h, a, idx)
    assert not rule.check(torch.tensor([2]), h, 2 * a, idx)  # sharper: entropy dropped


def test_argmax_stability_exits_after_n_stable_checks_not_n_minus_1():
    h, idx = torch.zeros(1, 2), torch.tensor([0])
    top = [0, 2, 2, 2, 2, 1, 1, 1]  # the argmax at checks 1..8
    logits = [F.one_hot(torch.tensor([k]), 3).float() for k in top]
    rule = ArgmaxStability(2)
    rule.reset(1)
    exits = [bool(rule.check(torch.tensor([i]), h, lg, idx)) for i, lg in enumerate(logits, 1)]
    # stable for 1 check at check 3, for 2 at check 4; reset by the change at check 6
    assert exits == [False, False, False, True, True, False, False, True]


@pytest.mark.parametrize("rule", [r for r in RULES if r != "uniform"])
def test_each_rules_conservative_end_is_uniform_depth_r(rule):
    # threshold 0 (a count of R stable checks): nothing exits before the cap, so the
    # grid always holds a setting that matches depth R
    model = backbone()
    x = tiny_tokens(2, 16)
    h0 = model.initial_state(model.inputs(x), torch.Generator().manual_seed(0))
    w = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    cap = 5
    policy = make(rule, cap if rule == "argmax-stability" else 0.0, probe=(w, 0.0))
    run = masked_forward(model, x, policy, cap=cap, h0=h0)
    assert (run.exit_loop == cap).all()
    plain = model(x, loops=cap, read="last", h0=h0)
    torch.testing.assert_close(run.logits, plain.logits[-1], rtol=1e-5, atol=1e-5)
    # one step less aggressive than the end does exit, so the test can fail
    loose = make(rule, 1 if rule == "argmax-stability" else 10.0, probe=(w, 0.0))
    assert (masked_forward(model, x, loose, cap=cap, h0=h0).exit_loop < cap).any()


@pytest.mark.parametrize("rule", [r for r in RULES if r != "uniform"])
def test_a_setting_that_cannot_exit_is_the_never_exiting_run_bit_for_bit(rule):
    """The policies stage runs every setting whose can_exit is False once, as
    never_exits: that is exact only if such a setting's run is that run, bit for bit."""
    model = backbone()
    x, y = tiny_tokens(2, 16), tiny_tokens(2, 16).roll(1, 1)
    h0 = model.initial_state(model.inputs(x), torch.Generator().manual_seed(0))
    w = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    cap = 5
    end = make(rule, cap if rule == "argmax-stability" else 0.0, probe=(w, 0.0))
    assert not end.can_exit(cap)
    got, never = (evaluate(model, x, y, h0, p, cap, 1) for p in (end, never_exits()))
    for field in ("ce", "exit_loop", "checks", "last_angle"):
        np.testing.assert_array_equal(getattr(got, field), getattr(never, field))
    assert (never.checks == cap - 1).all()  # it did check, at every loop before the cap
    loose = make(rule, 1 if rule == "argmax-stability" else 10.0, probe=(w, 0.0))
    assert loose.can_exit(cap)  # so the shortcut can be wrong, and the test fail
    assert (evaluate(model, x, y, h0, loose, cap, 1).exit_loop < cap).any()


@pytest.mark.parametrize("rule", [r for r in RULES if r != "uniform"])
def test_replaying_the_never_exiting_run_gives_every_setting_its_exact_result(rule):
    """The policies stage computes the loops before a batch's first exit once (record)
    and replays them for every setting: each setting's result stays bit for bit that of
    its own masked forward, whether it exits at the first check, later, or never."""
    model = backbone()
    x, y = tiny_tokens(4, 16), tiny_tokens(4, 16).roll(1, 1)
    h0 = model.initial_state(model.inputs(x), torch.Generator().manual_seed(0))
    w = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    cap, loops = 5, []
    evaluate(model, x, y, h0, never_exits(), cap, 2, record=loops)
    assert len(loops) == 2 and all(len(batch) == cap for batch in loops)
    grid = {"argmax-stability": [1, 2, 3], "probe": [1e-30, 1e-8, 0.5]}.get(
        rule, [1e-4, 1e-2, 0.1, 10.0])
    exits = set()
    for t in grid:
        own = evaluate(model, x, y, h0, make(rule, t, probe=(w, 0.0)), cap, 2)
        replayed = evaluate(model, x, y, h0, make(rule, t, probe=(w, 0.0)), cap, 2,
                            replay=loops)
        for field in ("ce", "exit_loop", "checks", "last_angle"):
            np.testing.assert_array_equal(getattr(replayed, field), getattr(own, field))
        exits.add(int(own.exit_loop.min()))
    # some setting exits before the cap, and some only after replayed loops
    assert min(exits) < cap and max(exits) > 1


def huginn_acceleration(states: torch.Tensor, i: int) -> torch.Tensor:
    """Huginn's latent-acceleration-2 criterion at loop i (1-based) of states (L, N, d),
    as its sampler computes it: ||(h_i - h_i-1) - (h_i-1 - h_i-2)|| / (||h_i|| + 1e-6)."""
    cur, prev, prev2 = states[i - 1], states[i - 2], states[i - 3]
    return ((cur - prev) - (prev - prev2)).norm(dim=-1) / (cur.norm(dim=-1) + 1e-6)


@pytest.mark.parametrize("two_hit", [False, True])
def test_latent_acceleration_is_huginns_formula_token_for_token(two_hit):
    """On a synthetic trajectory (each token's state settling at its own rate), the rule's
    exit loop is the first loop i >= 3 whose criterion is below the threshold (with two
    hits: the second of two such loops in a row), computed directly."""
    gen = torch.Generator().manual_seed(0)
    n, d, loops, threshold = 64, 16, 12, 0.05
    rate = torch.rand(n, generator=gen) * 0.8 + 0.1
    target = torch.randn(n, d, generator=gen)
    wobble = torch.randn(loops, n, d, generator=gen) * 0.02
    states = torch.stack([target * (1 - rate ** k)[:, None] + wobble[k - 1] * rate[:, None] ** k
                          for k in range(1, loops + 1)])
    expected = torch.full((n,), loops)
    hits = torch.zeros(n, dtype=torch.long)
    for i in range(3, loops + 1):
        below = huginn_acceleration(states, i) < threshold
        hits = torch.where(below, hits + 1, 0)
        fresh = (hits >= (2 if two_hit else 1)) & (expected == loops)
        expected[fresh] = i
    rule = (LatentAcceleration2Hit if two_hit else LatentAcceleration)(threshold)
    rule.reset(n)
    rule.begin(torch.arange(n), torch.zeros(n, d))  # H_0 is not one of its states
    got = torch.full((n,), loops)
    for i in range(1, loops + 1):
        active = torch.nonzero(got == loops).flatten()  # exited tokens are not checked
        leaving = rule.check(torch.full((len(active),), i), states[i - 1, active], None, active)
        got[active[leaving]] = i
    assert torch.equal(got, expected)
    assert 3 + two_hit <= int(got.min()) < loops  # the test can fail both ways
    assert rule.needs_logits is False
    assert not LatentAcceleration(1.0).can_exit(3) and LatentAcceleration(1.0).can_exit(4)
    assert not LatentAcceleration2Hit(1.0).can_exit(4)


def test_argmax_stability_can_exit_only_with_enough_checks_before_the_cap():
    # checks at loops 1..cap-1: the first has no previous argmax, so at most cap - 2
    # stable checks in a row
    cap = 6
    assert ArgmaxStability(cap - 2).can_exit(cap)
    assert not ArgmaxStability(cap - 1).can_exit(cap)
    assert not ArgmaxStability(1, first=2, every=4).can_exit(cap)  # one check (loop 2)
    assert ArgmaxStability(1, first=1, every=4).can_exit(cap)  # loops 1 and 5
    assert not Uniform().can_exit(cap) and not KL(1e-3).can_exit(1)


def test_vocabulary_math_in_row_chunks_is_bit_identical_to_whole_batches(monkeypatch):
    """trajectory, uniform_ce, the logit rules and the final CE compute over the
    vocabulary in row chunks (model.CHUNK_BYTES); any chunk size gives the same bits."""
    model = backbone()
    x, y = tiny_tokens(3, 16), tiny_tokens(3, 16).roll(1, 1)
    h0 = model.initial_state(model.inputs(x), torch.Generator().manual_seed(0))
    rules = ("kl", "kl-huginn", "minp-kl", "entropy-diff")

    def measure():
        traj = trajectory(model, x, y, h0, 6, 2, keep_states=2)
        runs = {r: evaluate(model, x, y, h0, make(r, 10 * rule_defaults(r)[0]), 5, 2)
                for r in rules}
        return traj, uniform_ce(model, x, y, h0, 6, 2), runs

    row = model.cfg.vocab_size * 4
    results = []
    for chunk in (1 << 40, 3 * row, row):  # whole batches, 3 rows, 1 row at a time
        monkeypatch.setattr(model_module, "CHUNK_BYTES", chunk)
        results.append(measure())
    for traj, ce, runs in results[1:]:
        whole, whole_ce, whole_runs = results[0]
        for field in ("ce", "kl", "change", "angle", "argmax", "states"):
            np.testing.assert_array_equal(getattr(traj, field), getattr(whole, field))
        np.testing.assert_array_equal(ce, whole.ce)
        for r in rules:
            for field in ("ce", "exit_loop", "checks", "last_angle"):
                np.testing.assert_array_equal(getattr(runs[r], field),
                                              getattr(whole_runs[r], field))
    assert any((results[0][2][r].exit_loop < 5).any() for r in rules)  # some did exit


def test_rule_defaults_are_huginns_and_params_knows_them():
    assert {r: rule_defaults(r) for r in KNOWN if r != "uniform"} == {
        r: rule.defaults for r, rule in RULE_DATA.items()}
    assert {r for r, rule in RULE_DATA.items() if rule.native} == set(NATIVE)
    assert rule_defaults("kl-huginn") == (1e-3, 5e-4)  # its first release used 5e-4
    assert (LatentDiff.default, Cosine.default, MinpKL.default) == (0.03, 1e-3, 1e-5)
    assert (EntropyDiff.default, ArgmaxStability.default, KL.default) == (1e-3, 5, 1e-3)
    for rule, grid in default_grids().items():
        assert set(rule_defaults(rule)) <= set(grid), rule


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


def test_without_exits_the_masked_forward_is_uniform_depth():
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
    # KL stays below eps from loop 4 on for token 0, from 2 (never moved) for token 1,
    # from 3 for token 2; token 3 still moves at the last loop measured (5 -> 6)
    assert convergence_loop(kl, eps).tolist() == [4, 2, 3, 6]


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
    # per draw, as convergence.summarize calls it: one column per resample
    draws = np.array([[3.0, 3.0], [2.5, 2.0], [2.198, 2.3], [2.19, 2.2]])
    assert useful_depth(draws, 0.01).tolist() == [3, 2]


def test_useful_depth_by_share_of_the_gain_holds_backbones_to_one_standard():
    # the same curve shape at two scales of gain: 0.01 nats calls them different, 2% of
    # each one's gain CE(1) - CE(best) does not
    shape = np.array([1.0, 0.4, 0.1, 0.03, 0.012, 0.0])
    big, small = 2.0 + shape, 2.0 + shape / 4
    assert useful_depth(big, 0.01) == 6 and useful_depth(small, 0.01) == 4
    assert useful_depth(big, share=0.02) == useful_depth(small, share=0.02) == 5
    draws = np.stack([big, small], axis=1)
    assert useful_depth(draws, share=0.02).tolist() == [5, 5]


def test_an_integer_statistic_reports_the_share_of_resamples_at_each_value():
    # draw 0 is the sample itself, not a resample
    assert shares(np.array([5, 4, 5, 5, 4])) == {"k4": 0.5, "k5": 0.5}
    assert shares(np.array([3.0, 3.0, 3.0])) == {"k3": 1.0}


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
    from loopscope.measure.runs import initial_states

    model = backbone()
    both = initial_states(model, np.array([0, 16]), seed=42)
    torch.testing.assert_close(initial_states(model, np.array([16]), seed=42)[0], both[1])
    assert not torch.equal(initial_states(model, np.array([16]), seed=43)[0], both[1])
    assert not torch.equal(both[0], both[1])
    rms = both.pow(2).mean().sqrt()  # drawn like the embeddings: N(0, 0.02) under gpt2
    assert 0.015 < rms < 0.025
    huginn = initial_states(backbone(init="huginn"), np.array([0, 16]), seed=42)
    rms = huginn.pow(2).mean().sqrt()  # Huginn's: sqrt(2 / 5d) times sqrt(d), about 0.6
    assert 0.5 < rms < 0.7
    assert initial_states(backbone(state_init="embed"), np.array([0]), seed=42) is None


def _result(ce: np.ndarray, loops: float, checks: int = 1) -> PolicyResult:
    """Per-token results whose tokens all ran `loops` loops (a mean; rounded per token)."""
    n = len(ce)
    exit_loop = np.where(np.arange(n) < round((loops % 1) * n), int(loops) + 1, int(loops))
    return PolicyResult(ce, exit_loop, np.full(n, checks), np.zeros(n))


def constructed(report_shift=0.0):
    """Per-token CEs of a constructed sweep: R = 4, 40 tokens in 8 documents. Uniform
    depth 2 is within match_nats of depth 4 but not within half of it; depth 3 within
    half. kl at 0.01 likewise matches only at the full margin; at 1e-3 within half.
    probe never matches."""
    model, n = backbone(), 40
    docs = np.repeat(np.arange(8), 5)
    base = 3.0 + 0.1 * np.sin(np.arange(n))
    sets = {"choose": base, "report": base + report_shift}
    uniform = {s: np.stack([ce + d for d in (0.5, 0.007, 0.002, 0.0)]) for s, ce in sets.items()}
    rows = {("kl", 0.0): (0.0, 4.0), ("kl", 1e-3): (0.003, 2.5), ("kl", 1e-2): (0.008, 1.5),
            ("kl-huginn", 0.0): (0.0, 4.0), ("kl-huginn", 5e-4): (0.002, 3.0),
            ("kl-huginn", 1e-3): (0.006, 2.0), ("probe", 0.5): (0.1, 1.0)}
    results = {key: {s: _result(ce + d, loops) for s, ce in sets.items()}
               for key, (d, loops) in rows.items()}
    return model, uniform, results, docs


def summarized(match=0.01, report_shift=0.0):
    """summarize() on the constructed sweep (constructed)."""
    model, uniform, results, docs = constructed(report_shift)
    metrics, table = summarize(model, uniform, results, Sample(Documents(docs, 200), docs), 4,
                               match)
    return model, metrics, table


def test_summarize_chooses_within_half_the_margin_and_reads_against_the_baseline():
    model, metrics, _ = summarized()
    assert metrics["choose_nats"] == metrics["match_nats"] / 2 == 0.005
    # depth 2 (+0.007) matches only at the full margin: M is 3, the baseline min(R, M)
    assert metrics["uniform"]["matched_depth"] == 3 and metrics["baseline_depth"] == 3
    assert metrics["uniform"]["delta_ce"]["value"] == pytest.approx(0.002)
    kl = metrics["kl"]
    assert kl["matched"] and kl["threshold"] == 1e-3  # not 1e-2 (+0.008, fewer loops)
    assert kl["mean_loops"] == pytest.approx(2.5)
    assert kl["delta_ce"]["value"] == pytest.approx(0.003)
    assert kl["mean_loops_iv"]["lo"] <= 2.5 <= kl["mean_loops_iv"]["hi"]
    cost = model.cost()
    assert kl["flops_ratio"] == pytest.approx(kl["flops_ratio_baseline"] * cost.uniform(3)
                                              / cost.uniform(4))
    assert kl["loops_ratio_baseline"] == pytest.approx(2.5 / 3)
    # the FLOP ratios' intervals: the point is the ratio itself, the bounds around it
    for key in ("flops_ratio", "flops_ratio_baseline"):
        found = kl[f"{key}_iv"]
        assert found["value"] == pytest.approx(kl[key])
        assert found["lo"] <= found["value"] <= found["hi"]
    assert metrics["probe"] == {"matched": False}  # no numbers where nothing matched


def test_summarize_reports_on_the_report_windows_and_at_the_defaults():
    _, metrics, table = summarized(report_shift=0.05)
    kl = metrics["kl"]
    assert kl["ce"] == pytest.approx(3.05 + 0.003 + 0.1 * np.sin(np.arange(40)).mean())
    assert kl["default"]["threshold"] == 1e-3 and kl["defaults"] == [kl["default"]]
    huginn = metrics["kl-huginn"]  # chooses 5e-4 (+0.002); 1e-3 (+0.006) is its default too
    assert huginn["threshold"] == 5e-4
    assert [d["threshold"] for d in huginn["defaults"]] == [1e-3, 5e-4]
    assert huginn["default"]["mean_loops"] == pytest.approx(2.0)
    assert huginn["default"]["delta_ce"]["value"] == pytest.approx(0.006)
    assert set(huginn["default"]) == {"threshold", "mean_loops", "ce", "delta_ce",
                                      "flops_ratio", "flops_ratio_baseline",
                                      "flops_ratio_iv", "flops_ratio_baseline_iv",
                                      "flops_ratio_unchecked_iv",
                                      "flops_ratio_baseline_unchecked_iv"}
    marked = {(row["rule"], row["threshold"]) for row in table if row["default"]}
    assert marked == {("kl", 1e-3), ("kl-huginn", 1e-3), ("kl-huginn", 5e-4), ("probe", 0.5)}
    assert {row["set"] for row in table} == {"choose", "report"}


def test_a1s_curve_is_read_against_uniform_depth_at_equal_mean_loops():
    """kl 1e-2 runs 1.5 loops at +0.008 nats over depth R; uniform depth there is the
    mix of depths 1 and 2, +0.2535: A1 is 0.2455 nats better. kl 1e-3, 2.5 loops at
    +0.003 against +0.0045. kl 0 runs every token to R, uniform depth itself: no point."""
    _, metrics, _ = summarized()
    curve = metrics["kl_curve"]
    assert [e["mean_loops"] for e in curve] == pytest.approx([1.5, 2.5])
    assert [e["delta_ce_uniform"]["value"] for e in curve] == pytest.approx([-0.2455, -0.0015])
    assert all(e["delta_ce_uniform"]["lo"] <= e["delta_ce_uniform"]["value"]
               <= e["delta_ce_uniform"]["hi"] for e in curve)


def test_a1_and_a2_are_paired_on_the_same_tokens_at_their_chosen_settings():
    model, uniform, results, docs = constructed()
    assert "vs_probe" not in summarized()[1]["kl"]  # A2 matched nothing: no pair
    results[("probe", 0.0)] = {s: _result(uniform[s][3], 4.0) for s in SWEPT}  # depth R
    metrics, _ = summarize(model, uniform, results, Sample(Documents(docs, 200), docs), 4,
                           0.01)
    pair = metrics["kl"]["vs_probe"]
    assert metrics["probe"]["threshold"] == 0.0
    assert pair["loops_diff"]["value"] == pytest.approx(2.5 - 4.0)
    assert pair["loops_diff_ratio"]["value"] == pytest.approx(-1.5 / 4)
    assert pair["ce_diff"]["value"] == pytest.approx(0.003)


def test_summarize_with_a_wider_margin_takes_the_cheaper_settings():
    # the same data at match_nats 0.02: depth 2 and kl 1e-2 are now within half of it
    _, metrics, _ = summarized(match=0.02)
    assert metrics["uniform"]["matched_depth"] == 2 == metrics["baseline_depth"]
    assert metrics["kl"]["threshold"] == 1e-2
    # 1e-2 is kl's most aggressive setting: the grid may stop too early, and says so
    assert metrics["kl"]["at_grid_edge"]
    assert not summarized()[1]["kl"]["at_grid_edge"]


def test_summarize_refuses_a_default_that_was_not_swept():
    model = backbone()
    ce = np.full(10, 3.0)
    uniform = {s: np.stack([ce, ce]) for s in ("choose", "report")}
    results = {("cosine", 0.0): {s: _result(ce, 2.0) for s in ("choose", "report")}}
    with pytest.raises(ValueError, match="cosine: threshold 0.001 was not swept"):
        docs = np.arange(10)
        summarize(model, uniform, results, Sample(Documents(docs, 100), docs), 2, 0.01)


def test_sweep_settings_gives_every_setting_its_own_masked_forward():
    """The sweep's shortcuts (the never-exiting run for settings that cannot exit,
    replayed loops for the rest) leave each setting its own evaluate, bit for bit."""
    model = backbone()
    x, y = tiny_tokens(4, 16), tiny_tokens(4, 16).roll(1, 1)
    h0 = model.initial_state(model.inputs(x), torch.Generator().manual_seed(0))
    w = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    grids = {"kl": [0.0, 1e-2, 10.0], "argmax-stability": [1, 5], "probe": [1e-8, 0.5]}
    cap = 5
    got = sweep_settings(model, x, y, h0, cap, 2, grids, 1, 1, (w, 0.0))
    assert list(got) == settings(grids)
    for (rule, t), result in got.items():
        own = evaluate(model, x, y, h0, make(rule, t, probe=(w, 0.0)), cap, 2)
        for field in ("ce", "exit_loop", "checks", "last_angle"):
            np.testing.assert_array_equal(getattr(result, field), getattr(own, field))
    assert (got[("kl", 10.0)].exit_loop < cap).any()  # not every setting runs to the cap


def split(model, uniform, results, docs, at: int) -> list[Sweep]:
    """The constructed sweep as two runs of a cell (seeds 1 and 2): tokens before `at`,
    and the rest."""
    def part(cut: slice, seed: int) -> Sweep:
        sweep = Sweep(model, 4, docs[cut], "document", {s: u[:, cut] for s, u in uniform.items()},
                      seed=seed)
        for s in SWEPT:
            sweep.results[s] = {key: PolicyResult(*(getattr(per_set[s], f)[cut] for f in
                                                    ("ce", "exit_loop", "checks", "last_angle")))
                                for key, per_set in results.items()}
        return sweep
    return [part(slice(0, at), 1), part(slice(at, None), 2)]


def test_summarize_sweeps_pools_the_runs_of_a_cell_and_resamples_its_seeds():
    """Two runs pooled: the same choice and point estimates as their tokens taken whole,
    intervals that resample the seeds as well as the documents, and each seed's own
    metrics beside them for the seed rule."""
    model, uniform, results, docs = constructed(report_shift=0.05)
    uniform["report"] = uniform["report"].copy()
    uniform["report"][3, 15:] += 0.004  # the second run's depth R a little worse
    sweeps = split(model, uniform, results, docs, 15)
    metrics, rows = summarize_sweeps(sweeps, 0.01, 200, "cell")
    whole, whole_rows = summarize(model, uniform, results, Sample(Documents(docs, 200), docs),
                                  4, 0.01)
    assert rows == whole_rows and metrics["kl"]["threshold"] == whole["kl"]["threshold"]
    got, alone = metrics["kl"]["delta_ce"], whole["kl"]["delta_ce"]
    assert got["value"] == pytest.approx(alone["value"])
    assert got["hi"] - got["lo"] > alone["hi"] - alone["lo"]  # the seeds resampled too
    assert (metrics["seeds"], metrics["unit"], metrics["units"]) == (2, "document", 8)
    assert set(metrics["per_seed"]) == {"seed1", "seed2"}
    one, _ = summarize_sweeps(sweeps[:1], 0.01, 200, "cell")
    assert metrics["per_seed"]["seed1"]["kl"] == one["kl"] and "per_seed" not in one



def test_each_seed_runs_the_threshold_it_chose_on_its_own_windows():
    """Paper B ran A1 on one model, its threshold chosen on that model. Two seeds: on
    its own `choose` windows the first matches depth R at kl 1e-2 (+0.004 nats, 1.5
    loops), the second only at 1e-3 (1e-2 costs it +0.008). One threshold for both,
    chosen on their tokens pooled (+0.006 at 1e-2), would be 1e-3 and 2.5 loops for
    every token; each seed's own choice, pooled, runs 2.0."""
    model, uniform, results, docs = constructed()
    ce = results[("kl", 1e-2)]["choose"].ce.copy()
    base = uniform["choose"][3]
    ce[:20], ce[20:] = base[:20] + 0.004, base[20:] + 0.008
    alternate = np.tile([2, 1], 20)  # 1.5 loops in each half
    for key, loops in (((("kl", 1e-2)), alternate), (("kl", 1e-3), alternate + 1)):
        for s in SWEPT:
            r = results[key][s]
            results[key][s] = PolicyResult(ce if key == ("kl", 1e-2) and s == "choose"
                                           else r.ce, loops, r.checks, r.last_angle)
    sweeps = split(model, uniform, results, docs, 20)
    pooled, _ = summarize(model, uniform, results, Sample(Documents(docs, 200), docs), 4, 0.01)
    assert (pooled["kl"]["threshold"], pooled["kl"]["mean_loops"]) == (1e-3, 2.5)
    metrics, rows = summarize_sweeps(sweeps, 0.01, 200, "cell")
    kl = metrics["kl"]
    assert kl["thresholds"] == {"seed1": 1e-2, "seed2": 1e-3} and kl["threshold"] == 1e-2
    assert kl["chosen"] == "each seed's own"
    assert kl["mean_loops"] == pytest.approx(2.0)
    assert kl["loops_ratio_iv"]["value"] == pytest.approx(2.0 / 4)
    assert [metrics["per_seed"][f"seed{i}"]["kl"]["mean_loops"] for i in (1, 2)] == \
        pytest.approx([1.5, 2.5])
    assert all(r["threshold"] >= 0 for r in rows)  # the pooled choice is no frontier row
    # a seed that matches no setting leaves the rule unmatched for the cell
    never = {("kl", 1e-2), ("kl", 1e-3), ("kl", 0.0)}
    for w in sweeps[1:]:
        for key in never:
            r = w.results["choose"][key]
            w.results["choose"][key] = PolicyResult(r.ce + 1.0, r.exit_loop, r.checks,
                                                    r.last_angle)
    metrics, _ = summarize_sweeps(sweeps, 0.01, 200, "cell")
    assert metrics["kl"] == {"matched": False, "unmatched_seeds": ["seed2"]}


def test_a_rule_swept_on_the_first_seed_alone_reports_that_seeds_numbers():
    """policies.first_seed_only: the second run skips a rule; the pooled metrics give
    the rule the first seed's own numbers, marked as one seed, its frontier rows too,
    and the rules both runs swept are pooled as before."""
    model, uniform, results, docs = constructed(report_shift=0.05)
    sweeps = split(model, uniform, results, docs, 15)
    rules = {rule for rule, _ in results}
    assert len(rules) > 1
    alone = sorted(rules - {"kl"})[0]
    for s in SWEPT:
        sweeps[1].results[s] = {k: v for k, v in sweeps[1].results[s].items() if k[0] != alone}
    metrics, rows = summarize_sweeps(sweeps, 0.01, 200, "cell")
    first, first_rows = summarize_sweeps(sweeps[:1], 0.01, 200, "cell")
    assert metrics["first_seed_only"] == [alone]
    assert metrics[alone] == {**first[alone], "seeds": 1}
    assert "seeds" not in metrics["kl"] and metrics["kl"] != first["kl"]
    assert ([r for r in rows if r["rule"] == alone]
            == [r for r in first_rows if r["rule"] == alone])


def test_the_rules_the_counted_rows_read_cannot_skip_a_seed():
    grids = {"kl": [0.0, 1e-3], "cosine": [0.0, 1e-3]}
    assert build("policies", PoliciesConfig, {"grids": grids, "first_seed_only": ["cosine"]})
    with pytest.raises(ParamsError, match="policies.first_seed_only"):
        build("policies", PoliciesConfig, {"grids": grids, "first_seed_only": ["kl"]})

def test_the_policies_headline_names_every_rule():
    _, metrics, _ = summarized()
    kl = metrics["kl"]
    line = headline(metrics)
    assert line.startswith("depth-4 quality at: uniform depth 3, ")
    assert (f"kl {kl['mean_loops']:.2f} loops (FLOPs x{kl['flops_ratio']:.2f}, "
            f"x{kl['flops_ratio_baseline']:.2f} of the baseline)") in line
    assert line.endswith("probe unmatched")
