"""The training benchmark's bookkeeping (its speeds are measured, never asserted): the
FLOPs per step follow the loop schedule, and the JSON relates its numbers."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from conftest import TINY

from loopscope.bench import Reference, step_flops, train
from loopscope.errors import ParamsError
from loopscope.model import LoopedLM
from loopscope.params import load_params

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


def test_train_benchmark_reports_speeds_and_their_ratio():
    params = load_params(MICRO)
    result = train(params, ["perloop_normed", "backbone"], steps=1, repeats=1, matmul=64)
    assert set(result["cells"]) == {"perloop_normed", "backbone"}
    for row in result["cells"].values():
        assert row["ratio_to_matmul"] == pytest.approx(row["gflops"] / row["matmul_gflops"])
        assert all(math.isfinite(row[k]) and row[k] > 0 for k in
                   ("tokens_per_s", "gflops", "reference_tokens_per_s", "reference_gflops"))
    assert result["profile"]["top_ops"] and result["profile"]["cell"] == "perloop_normed"


def test_an_unknown_cell_is_named():
    with pytest.raises(ParamsError, match="unknown cell 'nope'"):
        train(load_params(MICRO), ["nope"], steps=1, repeats=1, matmul=64)
