"""The exit benchmark's bookkeeping (its speeds are measured, never asserted): every mode
reads against the honest baseline (uniform depth min(R, M)) with depth R beside it, and
is a median over at least 3 rounds, each kept."""

import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import BACKBONE

from loopscope.base.errors import ParamsError
from loopscope.measure.bench_exits import READS, decoding, exits, matched_policies, scoring
from loopscope.measure.exits import make
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
    assert set(seconds) >= {f"uniform {r}", f"uniform {b}", *rules}
    for job, times in rounds.items():  # every job: 3 rounds kept, the median reported
        assert len(times) == 3 and seconds[job] == statistics.median(times)
    for n in rules:
        assert out["realized"][n] == pytest.approx(seconds[f"uniform {b}"] / seconds[n])
        assert out["realized_vs_r"][n] == pytest.approx(seconds[f"uniform {r}"] / seconds[n])
        assert out["flop_speedup"][n] / out["flop_speedup_vs_r"][n] == pytest.approx(
            cost.uniform(b) / cost.uniform(r))


def test_exit_benchmark_modes_read_against_the_baseline_with_every_round_kept():
    model, w = tiny_windows()
    policies = {"kl": make("kl", 1e-3), "latent-diff": make("latent-diff", 0.3)}
    out = scoring(model, w, policies, r=4, b=2, batch=2, repeats=3)
    assert_reads_against_the_baseline(out, model, 4, 2, list(policies))
    assert len(out["round_seconds"]["kl (masked forward)"]) == 3
    assert out["masked_forward_realized"] == pytest.approx(
        out["seconds"]["uniform 2"] / out["seconds"]["kl (masked forward)"])
    assert set(out["measured_speedup"]) == set(out["measured_speedup_vs_r"]) == set(policies)
    for streams in (1, 3):  # batch 1 and depth-wise batched: both 3 rounds
        out = decoding(model, w, policies, r=4, b=2, streams=streams, tokens=8, repeats=3)
        assert_reads_against_the_baseline(out, model, 4, 2, list(policies))


def test_when_the_baseline_is_depth_r_one_uniform_job_serves_both():
    model, w = tiny_windows(n=2)
    out = decoding(model, w, {"kl": make("kl", 1e-3)}, r=4, b=4, streams=2, tokens=6,
                   repeats=3)
    assert [j for j in out["seconds"] if j.startswith("uniform")] == ["uniform 4"]
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
