"""The training benchmark: a training step against the machine's matmul roof, as JSON.

    python -m loopscope.tools.bench train [--cells a b] [--steps 10] [--repeats 5] [--out FILE]

Run by hand, not a pipeline stage. Timings: every number that matters is a ratio of
medians measured side by side (loopscope.measure.bench.rounds). Not a test: nothing here asserts a
speed.

How fast is a training step, per precision, and how close does it come to this
machine's matrix-multiply speed in that precision? Per cell (from params.yaml alone, no
stage outputs needed; random token ids, since timing does not depend on the data), the
median over `repeats` interleaved rounds of `steps` optimizer steps taken exactly as
loopscope.weights.train takes them (train.forward_loss and train.update: the cell's autocast,
optimizer, loss and heap tuning; the depths its sampler draws first, so the backbone
runs at its sampled depth), in fp32 and in bf16 autocast (bf16 by default only where the
hardware multiplies bf16 natively, loopscope.weights.compute; --precisions forces it). Beside
them, in the same rounds: a size x size matmul in each precision (the roof) and a plain
fp32 torch baseline of the same shapes built from torch.nn.TransformerEncoderLayer (causal
mask, pre-norm LayerNorm, GELU, tied head, the same loops and readouts). --compile adds
torch.compile rows, their compile time measured on the first call. FLOPs per token of a
step at depth r (step_flops), averaged over the steps' depths:
    3 (prelude + G loop + n_read readout) + F loop
with G loops building a graph, F loops run without one (train.backprop_loops), n_read
readouts (every graph loop for a per-loop loss, one for a final one) and loop / readout
the forward FLOPs of LoopedLM.cost; the backward pass costs two forwards. GFLOP/s over the
same-precision matmul's is the step's share of the machine's matmul throughput (like
MFU). A profile of one step (bf16 where timed) splits it into forward, backward and
optimizer and names the operators that take the time.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from loopscope.base import paths
from loopscope.base.errors import ParamsError
from loopscope.base.files import write_json
from loopscope.base.machine import cpu_model
from loopscope.measure.bench.rounds import interleaved_rounds, top_operators
from loopscope.params import Params, load_params
from loopscope.stage import execute
from loopscope.weights import compute
from loopscope.weights.config import READS, CellConfig
from loopscope.weights.depth import sampler
from loopscope.weights.model import LoopedLM, ModelConfig, schedule
from loopscope.weights.model import cost as model_cost
from loopscope.weights.resolve import resolve_cell
from loopscope.weights.train import compiled, forward_loss, optimizer, update

PRECISIONS = ("fp32", "bf16")  # of a training step (loopscope.weights.compute)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class TorchBaseline(nn.Module):
    """The plain baseline of `bench train`: a LoopedLM's shapes (prelude, shared core
    applied per loop, coda, tied head) built from torch.nn.TransformerEncoderLayer with
    a causal mask, and none of loopscope's variants (no adapter, no sandwich)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        def layers(n: int) -> nn.ModuleList:
            return nn.ModuleList(nn.TransformerEncoderLayer(
                cfg.d_model, cfg.n_heads, 4 * cfg.d_model, dropout=0.0, activation="gelu",
                batch_first=True, norm_first=True, bias=False) for _ in range(n))
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.prelude, self.core, self.coda = (layers(cfg.n_prelude), layers(cfg.n_core),
                                              layers(cfg.n_coda))
        self.norm = nn.LayerNorm(cfg.d_model, bias=False)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx: torch.Tensor, loops: int, read: str, grad_loops: int
                ) -> list[torch.Tensor]:
        """The logits of the loops LoopedLM.forward would read out, same schedule."""
        t = idx.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        def run(blocks: nn.ModuleList, h: torch.Tensor) -> torch.Tensor:
            for block in blocks:
                h = block(h, src_mask=mask, is_causal=True)
            return h
        h = run(self.prelude, self.embed(idx) + self.pos(torch.arange(t)))
        sched, logits = schedule(loops, read, grad_loops), []
        for k in range(1, sched.loops + 1):
            with torch.set_grad_enabled(k > sched.frozen):
                h = run(self.core, h)
            if k in sched.read:
                logits.append(self.head(self.norm(run(self.coda, h))))
        return logits


def step_flops(cfg: ModelConfig, read: str, grad_loops: int, loops: int | None = None
               ) -> float:
    """FLOPs per token of one training step at depth `loops` (default: model.loops)."""
    cost = model_cost(cfg)
    sched = schedule(cfg.loops if loops is None else loops, read, grad_loops)
    return (3 * (cost.prelude + sched.graph_loops * cost.loop + len(sched.read) * cost.readout)
            + sched.frozen * cost.loop)


@dataclass
class StepJob:
    """`steps` optimizer steps of one cell in one precision, as training takes them
    (train.forward_loss, train.update), on a fixed random batch at fixed depths."""

    cell: CellConfig
    precision: str
    depths: list[int]
    compile: bool = False

    def __post_init__(self) -> None:
        m, cfg = self.cell.model, dataclasses.replace(self.cell.train, compile=self.compile)
        torch.manual_seed(cfg.seed)
        self.x, self.y = (torch.randint(0, m.vocab_size, (cfg.batch_size, m.context))
                          for _ in range(2))
        self.cfg, self.model = cfg, LoopedLM(m).train()
        self.opt, self.forward = optimizer(self.model, cfg), compiled(self.model, cfg)
        self.run_on = compute.Compute(torch.device("cpu"), self.precision == "bf16")

    def step(self, loops: int) -> None:
        loss, _, _ = forward_loss(self.forward, self.x, self.y, loops, self.cfg, self.run_on)
        update(self.model, self.opt, loss, self.cfg.grad_clip)

    def __call__(self) -> None:
        for loops in self.depths:
            self.step(loops)


def baseline_job(cell: CellConfig, depths: list[int]) -> Callable[[], None]:
    """The cell's TorchBaseline (fp32, plain AdamW) stepped at the same depths."""
    m, cfg = cell.model, cell.train
    torch.manual_seed(cfg.seed)
    x, y = (torch.randint(0, m.vocab_size, (cfg.batch_size, m.context)) for _ in range(2))
    read, ref = READS[cfg.loss], TorchBaseline(m).train()
    opt = torch.optim.AdamW(ref.parameters(), lr=cfg.lr)

    def job() -> None:
        for loops in depths:
            logits = ref(x, loops, read, cfg.backprop_loops)
            loss = torch.stack([F.cross_entropy(lg.flatten(0, 1), y.flatten()) for lg in logits])
            update(ref, opt, loss.mean(), cfg.grad_clip)
    return job


def step_profile(job: StepJob, n: int = 12) -> dict[str, Any]:
    """Where one step of job spends its time: the share of the step's wall time in each
    phase (train.update's and forward_loss's labels) and the top operators by self
    time, each with its share of all operator time."""
    loops = job.depths[0]
    job.step(loops)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        job.step(loops)
        wall_us = (time.perf_counter() - start) * 1e6
    events = prof.key_averages()
    phases = {e.key.removeprefix("step: "): e.cpu_time_total / wall_us
              for e in events if e.key.startswith("step: ")}
    return {"cell": job.cell.cell, "precision": job.precision, "loops": loops,
            "phases": phases,
            "top_ops": top_operators([e for e in events if not e.key.startswith("step: ")], n)}


def default_precisions() -> list[str]:
    """fp32, and bf16 where this CPU multiplies it natively (elsewhere a bf16 step is
    emulated, 10-20x slower: pass --precisions fp32 bf16 to time it anyway)."""
    return ["fp32", "bf16"] if compute.native_bf16_cpu() else ["fp32"]


def bench_cell(cell: CellConfig, precisions: list[str],
               roofs: dict[str, tuple[torch.Tensor, torch.Tensor]], steps: int, repeats: int,
               compile: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """One cell's row of the benchmark and the jobs it timed: its steps per precision
    (compiled too where asked), the torch baseline and the matmul roofs, interleaved."""
    depth = sampler(cell.train, cell.model.loops)
    depths = [depth.sample() for _ in range(steps)]  # training's first depths
    jobs: dict[str, Callable[[], Any]] = {}
    compile_s: dict[str, float] = {}
    for p in precisions:
        jobs[p] = StepJob(cell, p, depths)
        if compile:
            job = StepJob(cell, p, depths, compile=True)
            start = time.perf_counter()
            job()  # compiles every depth it meets
            compile_s[f"{p} compiled"] = time.perf_counter() - start
            jobs[f"{p} compiled"] = job
    jobs["torch baseline fp32"] = baseline_job(cell, depths)
    for p, (a, b) in roofs.items():
        jobs[f"matmul {p}"] = lambda a=a, b=b: a @ b
    rounds = interleaved_rounds(jobs, repeats)
    seconds = {n: statistics.median(v) for n, v in rounds.items()}
    m, read = cell.model, READS[cell.train.loss]
    tokens = steps * cell.train.batch_size * m.context
    flops = statistics.mean(step_flops(m, read, cell.train.backprop_loops, r) for r in depths)
    ref_flops = statistics.mean(step_flops(dataclasses.replace(m, inject="none", ffn="gelu"),
                                           read, cell.train.backprop_loops, r) for r in depths)
    matmul = next(iter(roofs.values()))[0].shape[0]
    roof = {p: 2 * matmul ** 3 / seconds[f"matmul {p}"] / 1e9 for p in precisions}
    row: dict[str, Any] = {"loops": m.loops, "depths": depths, "loss": cell.train.loss,
                           "flops_per_token": flops, "matmul_gflops": roof,
                           "round_seconds": rounds}
    for name in [n for n in jobs if n in precisions or n.endswith("compiled")]:
        p = name.split()[0]
        gflops = tokens * flops / seconds[name] / 1e9
        row[name] = {"tokens_per_s": tokens / seconds[name], "gflops": gflops,
                     "ratio_to_matmul": gflops / roof[p],
                     "speedup_vs_fp32": (seconds["fp32"] / seconds[name]
                                         if "fp32" in seconds else None)}
        if name in compile_s:  # the first call's time beyond its steps' steady time
            extra, gain = compile_s[name] - seconds[name], seconds[p] - seconds[name]
            row[name]["compile_seconds"] = extra
            row[name]["break_even_steps"] = (extra / gain * steps if gain > 0 else None)
    ref_gflops = tokens * ref_flops / seconds["torch baseline fp32"] / 1e9
    row["torch_baseline_fp32"] = {"tokens_per_s": tokens / seconds["torch baseline fp32"],
                                  "gflops": ref_gflops,
                                  "ratio_to_matmul": ref_gflops / roof.get("fp32", math.nan)}
    return row, jobs


def train(params: Params, cells: list[str] | None, steps: int, repeats: int,
          matmul: int = 2048, precisions: list[str] | None = None,
          compile: bool = False) -> dict[str, Any]:
    """The training benchmark (module doc) on `cells` (default: one paper A cell per loss
    placement and the main backbone, where params.yaml has them)."""
    precisions = precisions or default_precisions()
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad:
        raise ParamsError(f"--precisions: {bad[0]!r} is not one of {', '.join(PRECISIONS)}.")
    default = [c for c in ("terminal_normed", "perloop_normed", "backbone") if c in params.cells]
    cells = cells or default or list(params.cells)[:1]
    resolved = [resolve_cell(params, c) for c in cells]  # unknown names fail here
    torch.set_num_threads(resolved[0].train.threads)
    compute.tune_heap("train")  # as the train stage runs
    roofs = {p: (torch.randn(matmul, matmul, dtype=DTYPES[p]),
                 torch.randn(matmul, matmul, dtype=DTYPES[p])) for p in precisions}
    result: dict[str, Any] = {
        "steps": steps, "repeats": repeats, "matmul_size": matmul, "precisions": precisions,
        "machine": {"cpu": cpu_model(),
                    "threads": torch.get_num_threads(), "torch": torch.__version__,
                    "native_bf16": compute.native_bf16_cpu()},
        "cells": {}}
    profiled: StepJob | None = None
    for cell in resolved:
        row, jobs = bench_cell(cell, precisions, roofs, steps, repeats, compile)
        result["cells"][cell.cell] = row
        timed = ", ".join(f"{n} {row[n]['tokens_per_s']:,.0f} tok/s "
                          f"({row[n]['ratio_to_matmul']:.2f} of the {n.split()[0]} matmul)"
                          for n in jobs if n in row)
        print(f"bench train {cell.cell} (depths {min(row['depths'])}-{max(row['depths'])}): "
              f"{timed}; torch baseline fp32 "
              f"{row['torch_baseline_fp32']['tokens_per_s']:,.0f} tok/s", flush=True)
        if profiled is None or (profiled.precision != "bf16" and "bf16" in jobs):
            profiled = jobs["bf16"] if "bf16" in jobs else jobs["fp32"]
    if profiled is not None:
        result["profile"] = step_profile(profiled)
    return result



def parser(prog: str | None = None) -> argparse.ArgumentParser:
    """`bench train`'s options (prog: the command's name in its usage line, when
    loopscope.tools.bench dispatches here)."""
    out = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    out.add_argument("--cells", nargs="+", help="cells of params.yaml (default: "
                     "terminal_normed, perloop_normed, backbone)")
    out.add_argument("--steps", type=int, default=10, help="optimizer steps per round")
    out.add_argument("--repeats", type=int, default=5, help="timed rounds, interleaved")
    out.add_argument("--precisions", nargs="+", choices=PRECISIONS,
                     help="default: fp32, and bf16 where the CPU multiplies it natively")
    out.add_argument("--compile", action="store_true",
                     help="also time torch.compile'd steps (compile time counted apart)")
    out.add_argument("--matmul", type=int, default=2048, help="size of the roof's matmul")
    out.add_argument("--out", default=str(paths.bench_file("train")))
    return out


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    """`bench train`: the benchmark on --cells, written to --out."""
    args = parser(prog).parse_args(argv)
    params = load_params()
    if args.steps < 1 or args.repeats < 1 or args.matmul < 1:
        raise ParamsError("--steps, --repeats and --matmul must be >= 1.")
    write_json(args.out, train(params, args.cells, args.steps, args.repeats, args.matmul,
                               args.precisions, args.compile))
    print(f"bench train -> {args.out}")


if __name__ == "__main__":
    execute(main)
