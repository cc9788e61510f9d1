"""The exit benchmark's bookkeeping (its speeds are measured, never asserted): every mode
reads against the honest baseline (uniform depth min(R, M)) with depth R beside it, and
is a median over at least 3 rounds, each kept; its timings add up (uniform depth R within
R/B of uniform depth B's time) or are retimed, then flagged (timings injected)."""

import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import BACKBONE

from loopscope.base.errors import ParamsError
from loopscope.measure.bench.bench_exits import (
    DEPTH_SLACK,
    READS,
    decoding,
    depth_bound,
    exits,
    headline,
    matched_policies,
    not_timed,
    scoring,
    timed,
)
from loopscope.measure.exit_rules.exits import make
from loopscope.measure.params import load
from loopscope.measure.runs import Windows
from loopscope.weights.model import LoopedLM

MICRO = Path(__file__).parent / "micro_params.yaml"


def tiny_windows(n: int = 4, t: int = 16) -> tuple[LoopedLM, Windows]:
    torch.manual_seed(0)
    model = LoopedLM(BACKBONE).eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, BACKBONE.vocab_size, (n, t), generator=g)
    h0 = model.initial_state(model.inputs(x), torch.Generator().manual_seed(2))
    return model, Windows(x, torch.roll(x, -1, 1), np.arange(n) * t, np.arange(n), h0)


def assert_reads_against_the_baseline(out: dict, model: LoopedLM, r: int, b: int,
                                      rules: list[str]) -> None:
    seconds, rounds, cost = out["seconds"], out["round_seconds"], model.cost()
    assert set(seconds) >= {f"uniform_{r}", f"uniform_{b}", *rules}
    check = out["depth_check"]
    assert check["rounds"] in (3, 6)  # 6: the rounds spread and were doubled
    assert check["holds"] == (check["ratio"] <= depth_bound(r, b))
    for job, times in rounds.items():  # every job: the kept rounds, the median reported
        assert len(times) == check["rounds"] and seconds[job] == statistics.median(times)
    for n in rules:
        assert out["realized"][n] == pytest.approx(seconds[f"uniform_{b}"] / seconds[n])
        assert out["realized_vs_r"][n] == pytest.approx(seconds[f"uniform_{r}"] / seconds[n])
        assert out["flop_speedup"][n] / out["flop_speedup_vs_r"][n] == pytest.approx(
            cost.uniform(b) / cost.uniform(r))


def test_exit_benchmark_modes_read_against_the_baseline_with_every_round_kept():
    model, w = tiny_windows()
    policies = {"kl": make("kl", 1e-3), "latent-diff": make("latent-diff", 0.3)}
    out = scoring(model, w, policies, r=4, b=2, batch=2, repeats=3)
    assert_reads_against_the_baseline(out, model, 4, 2, list(policies))
    assert len(out["round_seconds"]["kl_masked_forward"]) == out["depth_check"]["rounds"]
    assert out["masked_forward_realized"] == pytest.approx(
        out["seconds"]["uniform_2"] / out["seconds"]["kl_masked_forward"])
    assert set(out["measured_speedup"]) == set(out["measured_speedup_vs_r"]) == set(policies)
    for streams in (1, 3):  # batch 1 and depth-wise batched: both 3 rounds
        out = decoding(model, w, policies, r=4, b=2, streams=streams, tokens=8, repeats=3)
        assert_reads_against_the_baseline(out, model, 4, 2, list(policies))


def test_when_the_baseline_is_depth_r_one_uniform_job_serves_both():
    model, w = tiny_windows(n=2)
    out = decoding(model, w, {"kl": make("kl", 1e-3)}, r=4, b=4, streams=2, tokens=6,
                   repeats=3)
    assert [j for j in out["seconds"] if j.startswith("uniform")] == ["uniform_4"]
    assert out["realized"] == out["realized_vs_r"]


def test_exit_benchmark_refuses_fewer_than_3_rounds():
    with pytest.raises(ParamsError, match=r"--repeats is 2; every mode is a median over at "
                                          r"least 3 interleaved rounds"):
        exits(load(READS, MICRO), "backbone", {}, repeats=2)


def test_only_rules_that_exit_before_the_cap_are_timed():
    metrics = {"r": 4,
               "kl": {"matched": True, "threshold": 1e-3, "mean_loops": 2.5},
               "latent-diff": {"matched": True, "threshold": 0.0, "mean_loops": 4.0},
               "cosine": {"matched": False}}
    assert list(matched_policies(metrics, 1, 1)) == ["kl"]


def rounds_of(depth8: list[float], depth5: float = 1.0, kl: float = 1.2) -> list[dict]:
    return [{"uniform_8": v, "uniform_5": depth5, "kl": kl} for v in depth8]


def test_the_depth_bound_is_r_over_b_with_the_declared_slack():
    assert depth_bound(8, 5) == pytest.approx(1.6 * (1 + DEPTH_SLACK))
    assert 0 < DEPTH_SLACK <= 0.25  # a slack for jitter, not a second factor of depth


def test_a_round_where_depth_r_takes_over_r_over_b_is_retimed():
    script = rounds_of([1.6, 2.2, 1.62, 1.58])  # round 1: 2.2x for 1.6x the loops
    out = timed(lambda i: script[i], 8, 5, 3, tokens=100)
    check = out["depth_check"]
    assert out["round_seconds"]["uniform_8"] == [1.6, 1.62, 1.58]
    assert out["retimed_seconds"]["uniform_8"] == [2.2]
    assert check["retimed"] == 1 and check["failed_rounds"] == 0 and check["holds"]
    assert check["ratio"] == pytest.approx(1.6) and out["seconds"]["uniform_8"] == 1.6
    assert out["tokens_per_s"]["kl"] == pytest.approx(100 / 1.2)


def test_a_mode_where_depth_r_stays_too_slow_is_flagged():
    script = rounds_of([2.2] * 6)  # every round and every retime: 2.2x for 1.6x
    out = timed(lambda i: script[i], 8, 5, 3, tokens=100)
    check = out["depth_check"]
    assert [check[k] for k in ("holds", "rounds", "retimed", "failed_rounds", "extended")] \
        == [False, 3, 3, 3, False]
    assert check["ratio"] == pytest.approx(2.2) and check["bound"] == depth_bound(8, 5)
    fine = timed(lambda i: rounds_of([1.6] * 3)[i], 8, 5, 3, tokens=100)
    result = {"cell": "bb", "baseline_depth": 5, "r": 8,
              "scoring": {"realized": {"kl": 0.8}, "flop_speedup": {"kl": 0.9},
                          "realized_vs_r": {"kl": 1.3}, **fine},
              "generation_batch1": out, "generation_batched": fine}
    assert headline(result).endswith("; generation_batch1 fails the depth check (uniform 8 "
                                     "took 2.20x uniform 5, bound 1.76x)")
    result["generation_batch1"] = fine
    assert "depth check" not in headline(result)


def test_when_depth_r_is_the_baseline_the_check_has_nothing_to_break():
    out = timed(lambda i: {"uniform_4": 1.0 + i / 100, "kl": 0.5}, 4, 4, 3, tokens=10)
    assert out["depth_check"]["holds"] and out["depth_check"]["ratio"] == 1.0
    assert out["retimed_seconds"] == {}


def test_every_timed_rule_left_out_says_why():
    metrics = {"r": 4, "kl": {"matched": True, "threshold": 1e-3, "mean_loops": 2.5},
               "latent-diff": {"matched": True, "threshold": 0.0, "mean_loops": 4.0},
               "cosine": {"matched": False}}
    assert not_timed(metrics) == {
        "latent-diff": "matched only by running every token to depth R",
        "cosine": "no setting matched depth R's quality",
        "latent-acceleration": "not swept"}


def test_a_model_that_cannot_gather_is_recorded_not_timed():
    """A layout whose blocks cannot run on a subset of a batch's tokens (Parcae's) gets
    a record saying so, not a failure after the measuring stages ran."""
    from loopscope.released.parcae import ParcaeLM
    assert ParcaeLM.gathers is False and getattr(LoopedLM, "gathers", True)
    line = headline({"cell": "p", "timed": False, "why": "ParcaeLM refuses subsets"})
    assert line == "bench exits p: ParcaeLM refuses subsets"
