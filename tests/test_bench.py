"""The benchmarks' bookkeeping (their speeds are measured, never asserted). Training:
the FLOPs per step follow the loop schedule and the sampled depth, each precision is read
against its own roof. Exits: every mode reads against the honest baseline (uniform depth
min(R, M)) with depth R beside it, and is a median over at least 3 rounds, each kept."""

import dataclasses
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import BACKBONE, TINY

from loopscope.bench import (
    Reference,
    decoding,
    exits,
    interleaved_rounds,
    matched_policies,
    scoring,
    step_flops,
    train,
)
from loopscope.depth import sampler
from loopscope.errors import ParamsError
from loopscope.model import LoopedLM
from loopscope.params import load_params, resolve_cell
from loopscope.policies import make
from loopscope.runs import Windows

MICRO = Path(__file__).parent / "micro_params.yaml"


def test_step_flops_counts_three_passes_through_graph_loops_and_one_through_frozen():
    cost = LoopedLM(TINY).cost()
    per_loop = step_flops(TINY, "all", 0)
    assert per_loop == pytest.approx(3 * TINY.loops * (cost.loop + cost.readout))
    assert step_flops(TINY, "last", 0) == pytest.approx(3 * (TINY.loops * cost.loop
                                                              + cost.readout))
    deep = dataclasses.replace(TINY, loops=6)
    truncated = step_flops(deep, "last", 2)  # 4 loops without a graph, 2 with one
    assert truncated == pytest.approx(4 * cost.loop + 3 * (2 * cost.loop + cost.readout))


def test_reference_reads_out_the_same_loops_as_looped_lm():
    x = torch.randint(0, TINY.vocab_size, (2, TINY.context))
    ref = Reference(TINY)
    assert len(ref(x, TINY.loops, "all", 0)) == TINY.loops
    assert len(ref(x, TINY.loops, "last", 0)) == 1
    assert ref(x, TINY.loops, "last", 0)[0].shape == (2, TINY.context, TINY.vocab_size)


def test_train_benchmark_reports_each_precision_against_its_own_roof():
    params = load_params(MICRO)
    result = train(params, ["perloop_normed", "backbone"], steps=3, repeats=2, matmul=64,
                   precisions=["fp32", "bf16"])
    assert set(result["cells"]) == {"perloop_normed", "backbone"}
    for row in result["cells"].values():
        for p in ("fp32", "bf16"):
            assert row[p]["ratio_to_matmul"] == pytest.approx(
                row[p]["gflops"] / row["matmul_gflops"][p])
            assert all(math.isfinite(row[p][k]) and row[p][k] > 0 for k in
                       ("tokens_per_s", "gflops", "speedup_vs_fp32"))
            assert len(row["round_seconds"][p]) == 2  # per-round times kept
        assert row["fp32"]["speedup_vs_fp32"] == 1.0
        assert row["reference_fp32"]["tokens_per_s"] > 0
    # the backbone steps at the depths its sampler draws, as training does
    backbone = result["cells"]["backbone"]
    cell = resolve_cell(params, "backbone")
    drawn = sampler(cell.train, cell.model.loops)
    assert backbone["depths"] == [drawn.sample() for _ in range(3)]
    assert backbone["flops_per_token"] == pytest.approx(sum(
        step_flops(cell.model, "last", cell.train.backprop_loops, r)
        for r in backbone["depths"]) / 3)
    prof = result["profile"]
    assert prof["precision"] == "bf16" and prof["top_ops"]
    assert set(prof["phases"]) == {"forward", "backward", "optimizer"}
    assert 0.5 < sum(prof["phases"].values()) <= 1.05  # the phases make up the step


def test_train_benchmark_times_the_precisions_it_is_given():
    result = train(load_params(MICRO), ["perloop_normed"], steps=1, repeats=1, matmul=64,
                   precisions=["fp32"])
    row = result["cells"]["perloop_normed"]
    assert "bf16" not in row and set(row["matmul_gflops"]) == {"fp32"}
    assert result["profile"]["precision"] == "fp32"
    with pytest.raises(ParamsError, match="--precisions: 'fp16'"):
        train(load_params(MICRO), ["perloop_normed"], steps=1, repeats=1, matmul=64,
              precisions=["fp16"])


def test_an_unknown_cell_is_named():
    with pytest.raises(ParamsError, match="unknown cell 'nope'"):
        train(load_params(MICRO), ["nope"], steps=1, repeats=1, matmul=64)


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
    assert len(out["round_seconds"]["kl (masked reference)"]) == 3
    assert out["masked_reference_realized"] == pytest.approx(
        out["seconds"]["uniform 2"] / out["seconds"]["kl (masked reference)"])
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


def test_interleaved_rounds_warm_up_unless_the_caller_did():
    calls = {"a": 0, "b": 0}
    jobs = {n: (lambda n=n: calls.__setitem__(n, calls[n] + 1)) for n in calls}
    rounds = interleaved_rounds(jobs, 3)
    assert calls == {"a": 4, "b": 4} and all(len(v) == 3 for v in rounds.values())
    interleaved_rounds(jobs, 3, warm=False)
    assert calls == {"a": 7, "b": 7}


def test_exit_benchmark_refuses_fewer_than_3_rounds():
    with pytest.raises(ParamsError, match=r"--repeats is 2; every mode is a median over at "
                                          r"least 3 interleaved rounds"):
        exits(load_params(MICRO), "backbone", repeats=2)


def test_only_rules_that_exit_before_the_cap_are_timed():
    metrics = {"reference_depth": 4,
               "kl": {"matched": True, "threshold": 1e-3, "mean_loops": 2.5},
               "latent-diff": {"matched": True, "threshold": 0.0, "mean_loops": 4.0},
               "cosine": {"matched": False}}
    assert list(matched_policies(metrics, 1, 1)) == ["kl"]
