"""The settle-depth oracle and an exit rule read against it, on constructed trajectories
whose settle loops are known."""

import numpy as np
import pytest

from loopscope.measure.exit_rules.oracle import (
    AgainstOracle,
    Oracle,
    describe,
    rule_vs_oracle,
    settle_loop,
)
from loopscope.stats.intervals import Documents, Sample


def trajectories() -> tuple[np.ndarray, np.ndarray]:
    """Five tokens over D = 6 loops: settle loops 1, 3, 5, 6 (the last loop changes it)
    and 2; the lead over the runner-up is 2 nats except token 1's at loop 4 (0.5).
    (D, N) arrays, rows loops."""
    per_token = np.array([[1, 1, 1, 1, 1, 1],
                          [7, 2, 3, 3, 3, 3],
                          [4, 4, 4, 4, 5, 5],
                          [7, 8, 8, 8, 8, 9],
                          [6, 7, 7, 7, 7, 7]])
    gap = np.full(per_token.shape, 2.0)
    gap[1, 3] = 0.5  # token 1 leads by less than 1 nat at loop 4: margin settle 5
    return per_token.T.copy(), gap.T.copy()


def test_settle_loop_is_the_first_loop_from_which_the_prediction_never_changes():
    argmax, gap = trajectories()
    np.testing.assert_array_equal(settle_loop(argmax), [1, 3, 5, 6, 2])
    np.testing.assert_array_equal(settle_loop(argmax, gap, 1.0), [1, 5, 5, 6, 2])
    gap[-1, 0] = 0.1  # the last loop itself undecided: never settles, D + 1
    assert settle_loop(argmax, gap, 1.0)[0] == 7


def test_a_rule_read_against_the_oracle():
    """Premature: before the settle loop and a prediction other than depth R's; early
    but right: before it with depth R's; lateness: loops past min(settle, R)."""
    argmax, gap = trajectories()
    oracle = Oracle.of(argmax, gap, r=3, margin=1.0)
    np.testing.assert_array_equal(oracle.pred_r, argmax[2])
    exits = np.array([1, 1, 2, 3, 3])
    pred = np.array([1, 2, 4, 8, 7])  # token 1 exits at 1 with loop 1's own guess, 2
    a = AgainstOracle.of(exits, pred, oracle)
    np.testing.assert_array_equal(a.premature, [False, True, False, False, False])
    np.testing.assert_array_equal(a.early_right, [False, False, True, True, False])
    # capped settle: 1, 3, 3, 3, 2; not premature: 0, -, 2-3 -> 0, 3-3, 3-2
    np.testing.assert_array_equal(a.lateness, [0, 0, 0, 0, 1])


def test_the_oracle_statistics_with_intervals_and_per_seed_meaning():
    """A rule that exits exactly at the oracle's capped loop is never premature, never
    late and runs the oracle's depth; one that always runs to R is late by R - s."""
    rng = np.random.default_rng(0)
    n, r, d = 400, 4, 16
    settle = rng.integers(1, d + 1, n)
    loops = np.arange(1, d + 1)[:, None]
    argmax = np.where(loops >= settle, 5, 100 + loops)  # changes every loop until settled
    gap = np.full(argmax.shape, 3.0)
    oracle = Oracle.of(argmax, gap, r, 1.0)
    np.testing.assert_array_equal(oracle.settle, settle)
    docs = np.repeat(np.arange(40), n // 40)
    sample = Sample(Documents(docs, 200), docs)
    exact = oracle.capped()
    pred_exact = np.where(exact >= settle, 5, 100 + exact)
    got = rule_vs_oracle(exact, pred_exact, oracle, sample)
    assert got["depth_over_oracle"]["value"] == pytest.approx(1.0)
    assert got["lateness"]["value"] == 0
    assert got["premature"]["value"] == 0  # capped at R, its guess is depth R's
    full = np.full(n, r)
    late = rule_vs_oracle(full, argmax[r - 1], oracle, sample)
    assert late["lateness"]["value"] == pytest.approx(np.mean(r - exact))
    assert late["depth_over_oracle"]["value"] == pytest.approx(r / exact.mean())
    assert late["depth_over_oracle"]["lo"] <= late["depth_over_oracle"]["value"] \
        <= late["depth_over_oracle"]["hi"]
    eager = rule_vs_oracle(np.ones(n, int), argmax[0], oracle, sample)  # exits at loop 1
    assert eager["premature"]["value"] == pytest.approx(np.mean(settle > 1))
    assert eager["premature"]["lo"] > 0.5  # it can come out "premature"
    summary = describe(oracle, sample)
    assert summary["settled_by_r"]["value"] == pytest.approx(np.mean(oracle.settle <= r))
    assert sum(summary["by_settle"].values()) == pytest.approx(1.0)


def test_the_policies_read_the_oracle_of_their_own_tokens():
    """The settle loops come from tables/convergence, seed by seed; rows of other tokens
    (another window order, an older table) are refused, not misread."""
    import pandas as pd

    from loopscope.measure.exit_rules.policies import Sweep, attach_oracle
    tokens = np.array([5, 6, 7])
    table = pd.DataFrame({"seed": [1, 1, 1, 2, 2, 2], "token_id": [5, 6, 7, 5, 6, 7],
                          "settle_loop": [1, 2, 3, 3, 2, 1],
                          "settle_loop_margin": [2, 2, 3, 4, 2, 1],
                          "pred_r": [9, 9, 9, 8, 8, 8]})
    sweeps = [Sweep(None, 4, np.zeros(3), "document", seed=s, tokens=tokens) for s in (1, 2)]
    attach_oracle(sweeps, table, 16)
    np.testing.assert_array_equal(sweeps[1].oracle.settle, [3, 2, 1])
    np.testing.assert_array_equal(sweeps[0].oracle.pred_r, [9, 9, 9])
    assert (sweeps[0].oracle.r, sweeps[0].oracle.depth) == (4, 16)
    sweeps[1].tokens = np.array([5, 7, 6])
    with pytest.raises(ValueError, match="seed 2"):
        attach_oracle(sweeps, table, 16)
    with pytest.raises(ValueError, match="older convergence stage"):
        attach_oracle(sweeps, table.drop(columns="pred_r"), 16)
