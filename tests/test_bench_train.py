"""The training benchmark's bookkeeping (its speeds are measured, never asserted): the
FLOPs per step follow the loop schedule and the sampled depth, each precision is read
against its own roof."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from conftest import TINY

from loopscope.base.errors import ParamsError
from loopscope.params import load_params
from loopscope.tools.bench_train import TorchBaseline, step_flops, train
from loopscope.weights.depth import sampler
from loopscope.weights.model import LoopedLM
from loopscope.weights.resolve import resolve_cell

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
    ref = TorchBaseline(TINY)
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
        assert row["torch_baseline_fp32"]["tokens_per_s"] > 0
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
