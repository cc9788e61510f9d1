"""Benchmarks, measured side by side in one process and written as JSON.

    python -m loopscope.bench exits [--cell backbone] [--repeats 5] [--out FILE]
    python -m loopscope.bench train [--cells a b] [--steps 10] [--repeats 5] [--out FILE]

Timings on a shared machine are noisy, so every number that matters here is a ratio of
medians measured in the same run, configurations interleaved. Not a test: nothing here
asserts a speed.

exits: does the adaptive runtime (loopscope.runtime) turn a policy's saved loops into
wall-clock time? On the cell's first trained run, with each policy at the threshold the
policies stage chose on the `choose` windows (timed on the disjoint `report` windows),
for teacher-forced scoring (policies.batch_size windows per call) and for decoding (one
stream, and policies.batch_size streams decoded together, depth-wise batched), every
mode a median over bench.repeats (>= 3) interleaved rounds, each round's seconds kept.
Every ratio reads against the honest baseline, uniform depth B = min(R, M) with M the
smallest uniform depth that matches depth R's quality (metrics/policies' baseline_depth):
a per-token policy saves nothing unless it beats the depth a uniform model needs anyway.
The same ratio against depth R sits beside it (`_vs_r`).
    realized        time of uniform depth B / time of the policy (the headline)
    flop_speedup    FLOPs of uniform depth B / FLOPs of the same exit decisions, checks
                    included (LoopedLM.cost: attention at the mean query position). Not a
                    ceiling on `realized`: time is not proportional to FLOPs at this size
                    (at batch 1 a KL check costs less time than its FLOPs say, and A1
                    realizes more than its FLOP speedup)
    measured_speedup  the FLOP speedup with each loop and check costed at its measured
                    time for its number of active tokens (scoring only): what skipping
                    can give on this machine once per-call overheads are counted
    masked_reference_realized  time of uniform depth B / time of A1 through the masked
                    reference (scoring; paper B's setting, which skips no work)

train: how fast is a training step, per precision, and how close does it come to this
machine's matrix-multiply speed in that precision? Per cell (from params.yaml alone, no
stage outputs needed; random token ids, since timing does not depend on the data), the
median over `repeats` interleaved rounds of `steps` optimizer steps taken exactly as
loopscope.train takes them (train.forward_loss and train.update: the cell's autocast,
optimizer, loss and heap tuning; the depths its sampler draws first, so the backbone
runs at its sampled depth), in fp32 and in bf16 autocast (bf16 by default only where the
hardware multiplies bf16 natively, loopscope.compute; --precisions forces it). Beside
them, in the same rounds: a size x size matmul in each precision (the roof) and a plain
fp32 reference of the same shapes built from torch.nn.TransformerEncoderLayer (causal
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

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from loopscope import compute, memory, paths, runtime
from loopscope.cells import cell_group, paper_b_backbones
from loopscope.config import READS, CellConfig, load_cell
from loopscope.depth import sampler
from loopscope.errors import DataError, ParamsError
from loopscope.model import LoopedLM, ModelConfig, schedule
from loopscope.model import cost as model_cost
from loopscope.outputs import read_metrics, write_json
from loopscope.params import Params, load_params, resolve_cell
from loopscope.policies import Policy, Uniform, flops_per_token, make, masked_forward
from loopscope.runs import Windows, trained_runs
from loopscope.stage import run
from loopscope.timings import cpu_model
from loopscope.train import compiled, forward_loss, optimizer, update

# The rules timed, each at its matched threshold: A1 and the two head-free rules. A2
# (probe) matches depth R only by hardly exiting (paper B: no saving; 7.99 of 8 loops
# here), kl-huginn exits where kl does, and minp-kl, entropy-diff and argmax-stability
# pay kl's check while exiting later: timing them would lengthen the stage, not answer
# anything new.
RULES = ("kl", "latent-diff", "cosine")
MIN_REPEATS = 3  # every mode is a median over at least this many interleaved rounds
PRECISIONS = ("fp32", "bf16")  # of a training step (loopscope.compute)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def interleaved(jobs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds of each job over interleaved_rounds."""
    return {n: statistics.median(v) for n, v in interleaved_rounds(jobs, repeats).items()}


def interleaved_rounds(jobs: dict[str, Callable[[], Any]], repeats: int, warm: bool = True
                       ) -> dict[str, list[float]]:
    """Seconds of each job in each of `repeats` rounds (after one untimed warm-up call,
    unless the caller has already run every job: warm=False), the jobs interleaved
    within a round and their order rotated between rounds, so drift in the machine's
    speed falls on all of them alike."""
    names = list(jobs)
    times: dict[str, list[float]] = {n: [] for n in names}
    for name in names if warm else []:  # warm-up, untimed
        jobs[name]()
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            _sync()
            start = time.perf_counter()
            jobs[name]()
            _sync()
            times[name].append(time.perf_counter() - start)
    return times


def _batches(w: Windows, size: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    return [(w.x[i:i + size], w.y[i:i + size], None if w.h0 is None else w.h0[i:i + size])
            for i in range(0, len(w.x), size)]


def _ce(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float(F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()))


def matched_policies(metrics: dict[str, Any], first: int, every: int) -> dict[str, Policy]:
    """Each rule of RULES at the threshold the policies stage chose, where it exits
    before the cap: a rule that never matched depth R's quality, or matched it only by
    not exiting (a threshold of 0 is uniform depth R plus checks), has nothing to time."""
    reference = metrics["reference_depth"]
    return {rule: make(rule, metrics[rule]["threshold"], first, every)
            for rule in RULES if metrics.get(rule, {}).get("matched")
            and metrics[rule]["mean_loops"] < reference}


def calibrate(model: LoopedLM, x: torch.Tensor, h0: torch.Tensor | None,
              reads_logits: bool, repeats: int = 5) -> dict[str, Any]:
    """Measured seconds of one runtime loop and one check readout at several numbers of
    active tokens (random, spread over the batch), and of the work every token does
    once (prelude and final readout)."""
    scorer = runtime.Scorer(model, x, h0)
    g = torch.Generator().manual_seed(0)
    counts, loop_s, check_s = [], [], []
    for frac in (1.0, 0.75, 0.5, 0.3, 0.15, 0.08, 0.04):
        active = (torch.rand(x.shape, generator=g) < frac).to(x.device)
        active.view(-1)[0] = True
        jobs = {"loop": lambda a=active: scorer.advance(runtime.Layout.of(a))}
        if reads_logits:
            jobs["check"] = lambda a=active: scorer.logits(runtime.Layout.of(a))
        got = interleaved(jobs, repeats)
        counts.append(int(active.sum()))
        loop_s.append(got["loop"])
        check_s.append(got.get("check", 0.0))
    order = np.argsort(counts)
    once = interleaved({"once": lambda: model.read(model.inputs(x), last=True)}, repeats)
    return {"active_tokens": np.array(counts)[order].tolist(),
            "loop_s": np.array(loop_s)[order].tolist(),
            "check_s": np.array(check_s)[order].tolist(), "once_s": once["once"]}


def _predicted(active_per_loop: list[int], checks: list[int], cal: dict[str, Any]) -> float:
    """Seconds of one batch from the calibration: each loop and check at its count."""
    at = cal["active_tokens"]
    return float(cal["once_s"] + sum(np.interp(n, at, cal["loop_s"]) for n in active_per_loop)
                 + sum(np.interp(n, at, cal["check_s"]) for n in checks))


def speedups(base: float, cost: dict[str, float]) -> dict[str, float]:
    """A baseline's cost (seconds, or FLOPs) over each policy's."""
    return {n: base / c for n, c in cost.items()}


def _timings(rounds: dict[str, list[float]], tokens: int) -> dict[str, Any]:
    seconds = {n: statistics.median(v) for n, v in rounds.items()}
    return {"seconds": seconds, "round_seconds": rounds,
            "tokens_per_s": {n: tokens / v for n, v in seconds.items()}}


def _ratios(out: dict[str, Any], flops: dict[str, float], model: LoopedLM, r: int, b: int
            ) -> None:
    """The ratios of one mode (module doc): the policies' median seconds and FLOPs
    against uniform depth b's (the honest baseline) and depth R's."""
    seconds, cost = out["seconds"], model.cost()
    times = {n: seconds[n] for n in flops}
    out.update({"realized": speedups(seconds[f"uniform {b}"], times),
                "realized_vs_r": speedups(seconds[f"uniform {r}"], times),
                "flop_speedup": speedups(cost.uniform(b), flops),
                "flop_speedup_vs_r": speedups(cost.uniform(r), flops)})


def scoring(model: LoopedLM, w: Windows, policies: dict[str, Policy], r: int, b: int,
            batch: int, repeats: int) -> dict[str, Any]:
    """Teacher-forced scoring of the windows: uniform depths R and b (plain forward
    passes), every policy through the runtime, and A1 through the masked reference."""
    data = _batches(w, batch)
    decisions: dict[str, dict[str, Any]] = {}
    for name, policy in policies.items():
        runs = [runtime.score(model, xb, policy, r, hb) for xb, _, hb in data]
        exits = torch.cat([rn.exit_loop.flatten() for rn in runs]).cpu().numpy()
        checks = torch.cat([rn.checks.flatten() for rn in runs]).cpu().numpy()
        decisions[name] = {
            "mean_loops": float(exits.mean()),
            "ce": float(np.mean([_ce(rn.logits, yb) for rn, (_, yb, _) in
                                 zip(runs, data, strict=True)])),
            "flops": flops_per_token(model, exits, checks, policy.needs_logits),
            "active": [rn.active_per_loop for rn in runs],
            "checks": [[int(c) for c in _checks_per_loop(rn, policy, r)] for rn in runs],
        }
    jobs: dict[str, Callable[[], Any]] = {  # one job when b is R
        f"uniform {k}": (lambda k=k: [model(xb, loops=k, read="last", h0=hb)
                                      for xb, _, hb in data]) for k in sorted({r, b})[::-1]}
    for name, policy in policies.items():
        jobs[name] = (lambda p=policy: [runtime.score(model, xb, p, r, hb)
                                        for xb, _, hb in data])
    if "kl" in policies:
        jobs["kl (masked reference)"] = lambda: [masked_forward(model, xb, policies["kl"], r, hb)
                                                 for xb, _, hb in data]
    for name in set(jobs) - set(policies):  # warm-up, untimed (the policies ran above)
        jobs[name]()
    out: dict[str, Any] = {"tokens": int(w.x.numel()), "batch_windows": batch,
                           **_timings(interleaved_rounds(jobs, repeats, warm=False),
                                      int(w.x.numel()))}
    seconds = out["seconds"]
    _ratios(out, {n: d["flops"] for n, d in decisions.items()}, model, r, b)
    cal = calibrate(model, data[0][0], data[0][2], any(p.needs_logits for p in policies.values()))
    uniform = {k: _predicted([data[0][0].numel()] * k, [], cal) * len(data) for k in (r, b)}
    predicted = {n: sum(_predicted(a, c, cal) for a, c in zip(d["active"], d["checks"],
                                                               strict=True))
                 for n, d in decisions.items()}
    out.update({
        "measured_speedup": speedups(uniform[b], predicted),
        "measured_speedup_vs_r": speedups(uniform[r], predicted),
        "mean_loops": {n: d["mean_loops"] for n, d in decisions.items()},
        "ce": {n: d["ce"] for n, d in decisions.items()},
        "calibration": cal,
    })
    if "kl" in policies:
        masked = seconds["kl (masked reference)"]
        out["masked_reference_realized"] = seconds[f"uniform {b}"] / masked
        out["masked_reference_realized_vs_r"] = seconds[f"uniform {r}"] / masked
    return out


def _checks_per_loop(rn: runtime.ScoreRun, policy: Policy, r: int) -> list[int]:
    """How many tokens each check of a scoring run read out (the active ones)."""
    if not policy.needs_logits:
        return []
    return [n for loop, n in enumerate(rn.active_per_loop, 1)
            if loop < r and policy.checks_at(loop)]


def decoding(model: LoopedLM, w: Windows, policies: dict[str, Policy], r: int, b: int,
             streams: int, tokens: int, repeats: int) -> dict[str, Any]:
    """Token-by-token decoding, teacher-forced on the first `streams` windows cut to
    `tokens` tokens, streams depth-wise batched; uniform depths R and b through the same
    decoder (every token runs the cap)."""
    x, y = w.x[:streams, :tokens], w.y[:streams, :tokens]
    h0 = None if w.h0 is None else w.h0[:streams, :tokens]
    configs: dict[str, tuple[Policy, int]] = {f"uniform {k}": (Uniform(), k)
                                              for k in sorted({r, b})[::-1]}
    configs.update({n: (p, r) for n, p in policies.items()})
    jobs = {n: (lambda p=p, cap=cap: runtime.generate(model, x, p, cap, h0))
            for n, (p, cap) in configs.items()}
    runs = {n: job() for n, job in jobs.items()}  # the decisions, and the warm-up
    out: dict[str, Any] = {"streams": streams, "tokens_per_stream": tokens,
                           **_timings(interleaved_rounds(jobs, repeats, warm=False),
                                      int(x.numel()))}
    flops = {n: flops_per_token(model, runs[n].exit_loop.cpu().numpy(),
                                runs[n].checks.cpu().numpy(), p.needs_logits)
             for n, p in policies.items()}
    _ratios(out, flops, model, r, b)
    out.update({
        "steps": {n: rn.steps for n, rn in runs.items()},
        "mean_loops": {n: float(rn.exit_loop.float().mean()) for n, rn in runs.items()},
        "ce": {n: _ce(rn.logits, y) for n, rn in runs.items()},
    })
    return out


def top_ops(fn: Callable[[], Any], n: int = 12) -> list[dict]:
    """Where one call of fn spends its time: the top operators by self CPU time
    (torch.profiler), after one untimed call."""
    fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return _top(prof.key_averages(), n)


def _top(events: Any, n: int) -> list[dict]:
    """The n operators of a profile with the most self time, with their shares."""
    events = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    return [{"op": e.key, "share": e.self_cpu_time_total / total, "calls": e.count}
            for e in events[:n]]


def profile(model: LoopedLM, w: Windows, policy: Policy, r: int, batch: int) -> list[dict]:
    """Where one runtime scoring call spends its time."""
    xb, hb = w.x[:batch], None if w.h0 is None else w.h0[:batch]
    return top_ops(lambda: runtime.score(model, xb, policy, r, hb))


def exits(params: Params, cell: str | None, repeats: int | None = None) -> dict[str, Any]:
    """The exit benchmark (module doc) on `cell` (default: the main paper B backbone)."""
    repeats = params.bench.repeats if repeats is None else repeats
    if repeats < MIN_REPEATS:
        raise ParamsError(f"--repeats is {repeats}; every mode is a median over at least "
                          f"{MIN_REPEATS} interleaved rounds.")
    if cell is None:
        configs = {c: load_cell(paths.config_file(c)) for c in params.cells}
        cell, _ = paper_b_backbones({c: v for c, v in configs.items()
                                     if cell_group(v) == "paper B backbone"})
        if cell is None:
            raise DataError("no paper B backbone in params.yaml; pass --cell.")
    metrics = read_metrics("policies", cell)
    r, m, b = (metrics["reference_depth"], metrics["uniform"]["matched_depth"],
               metrics["baseline_depth"])
    tokens = min(params.bench.decode_tokens, load_cell(paths.config_file(cell)).model.context)
    first = next(trained_runs(cell))
    model, cfg = first.model, params.policies
    torch.set_num_threads(first.cell.train.threads)
    sets = first.window_sets(params.convergence.windows, "convergence.windows")
    with torch.no_grad():  # fp32 (first.compute), as the policies stage measured
        policies = matched_policies(metrics, cfg.first, cfg.every)
        report = sets["report"]
        result = {
            "cell": cell, "run": first.tag, "reference_depth": r, "matched_depth": m,
            "baseline_depth": b, "repeats": repeats,
            "thresholds": {n: metrics[n]["threshold"] for n in policies},
            "check_schedule": {"first": cfg.first, "every": cfg.every},
            "machine": {"cpu": cpu_model(),
                        "threads": torch.get_num_threads(), "torch": torch.__version__,
                        "device": str(first.compute.device)},
            "scoring": scoring(model, report, policies, r, b, cfg.batch_size, repeats),
            "generation_batch1": decoding(model, report, policies, r, b, 1, tokens, repeats),
            "generation_batched": decoding(model, report, policies, r, b, cfg.batch_size,
                                           tokens, repeats),
        }
        if policies:
            best = max(policies, key=lambda n: result["scoring"]["realized"][n])
            result["profile"] = {"policy": best, "top_ops": profile(
                model, report, policies[best], r, cfg.batch_size)}
    return result


class Reference(nn.Module):
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


def reference_job(cell: CellConfig, depths: list[int]) -> Callable[[], None]:
    """The cell's Reference (fp32, plain AdamW) stepped at the same depths."""
    m, cfg = cell.model, cell.train
    torch.manual_seed(cfg.seed)
    x, y = (torch.randint(0, m.vocab_size, (cfg.batch_size, m.context)) for _ in range(2))
    read, ref = READS[cfg.loss], Reference(m).train()
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
            "top_ops": _top([e for e in events if not e.key.startswith("step: ")], n)}


def default_precisions() -> list[str]:
    """fp32, and bf16 where this CPU multiplies it natively (elsewhere a bf16 step is
    emulated, 10-20x slower: pass --precisions fp32 bf16 to time it anyway)."""
    return ["fp32", "bf16"] if compute.native_bf16_cpu() else ["fp32"]


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
    memory.tune_heap("train")  # as the train stage runs
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
        jobs["reference fp32"] = reference_job(cell, depths)
        for p, (a, b) in roofs.items():
            jobs[f"matmul {p}"] = lambda a=a, b=b: a @ b
        rounds = interleaved_rounds(jobs, repeats)
        seconds = {n: statistics.median(v) for n, v in rounds.items()}
        m, read = cell.model, READS[cell.train.loss]
        tokens = steps * cell.train.batch_size * m.context
        flops = statistics.mean(step_flops(m, read, cell.train.backprop_loops, r) for r in depths)
        ref_flops = statistics.mean(step_flops(dataclasses.replace(m, inject="none", ffn="gelu"),
                                               read, cell.train.backprop_loops, r) for r in depths)
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
                extra = compile_s[name] - seconds[name]
                gain = seconds[p] - seconds[name]
                row[name]["compile_seconds"] = extra
                row[name]["break_even_steps"] = (extra / gain * steps if gain > 0 else None)
        ref_gflops = tokens * ref_flops / seconds["reference fp32"] / 1e9
        row["reference_fp32"] = {"tokens_per_s": tokens / seconds["reference fp32"],
                                 "gflops": ref_gflops,
                                 "ratio_to_matmul": ref_gflops / roof.get("fp32", math.nan)}
        result["cells"][cell.cell] = row
        timed = ", ".join(f"{n} {row[n]['tokens_per_s']:,.0f} tok/s "
                          f"({row[n]['ratio_to_matmul']:.2f} of the {n.split()[0]} matmul)"
                          for n in jobs if n in row)
        print(f"bench train {cell.cell} (depths {min(depths)}-{max(depths)}): {timed}; "
              f"reference fp32 {row['reference_fp32']['tokens_per_s']:,.0f} tok/s", flush=True)
        if profiled is None or (profiled.precision != "bf16" and "bf16" in jobs):
            profiled = jobs["bf16"] if "bf16" in jobs else jobs["fp32"]
    if profiled is not None:
        result["profile"] = step_profile(profiled)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="bench", required=True)
    ex = sub.add_parser("exits", help="adaptive runtime: realized vs ideal speedup")
    ex.add_argument("--cell", help="a trained cell (default: the main paper B backbone)")
    ex.add_argument("--repeats", type=int, help="timed rounds, >= 3 (default: bench.repeats)")
    ex.add_argument("--out", default=str(paths.bench_file("exits")))
    tr = sub.add_parser("train", help="training step against the machine's matmul")
    tr.add_argument("--cells", nargs="+", help="cells of params.yaml (default: "
                    "terminal_normed, perloop_normed, backbone)")
    tr.add_argument("--steps", type=int, default=10, help="optimizer steps per round")
    tr.add_argument("--repeats", type=int, default=5, help="timed rounds, interleaved")
    tr.add_argument("--precisions", nargs="+", choices=PRECISIONS,
                    help="default: fp32, and bf16 where the CPU multiplies it natively")
    tr.add_argument("--compile", action="store_true",
                    help="also time torch.compile'd steps (compile time counted apart)")
    tr.add_argument("--matmul", type=int, default=2048, help="size of the roof's matmul")
    tr.add_argument("--out", default=str(paths.bench_file("train")))
    args = parser.parse_args(argv)
    params = load_params()
    if args.bench == "train":
        if args.steps < 1 or args.repeats < 1 or args.matmul < 1:
            raise ParamsError("--steps, --repeats and --matmul must be >= 1.")
        write_json(args.out, train(params, args.cells, args.steps, args.repeats, args.matmul,
                                   args.precisions, args.compile))
        print(f"bench train -> {args.out}")
        return
    result = exits(params, args.cell, args.repeats)
    write_json(args.out, result)
    s = result["scoring"]
    found = ", ".join(f"{n} {v:.2f}x (FLOPs {s['flop_speedup'][n]:.2f}x; "
                      f"{s['realized_vs_r'][n]:.2f}x vs depth {result['reference_depth']})"
                      for n, v in s["realized"].items())
    print(f"bench exits {result['cell']}: scoring against uniform depth "
          f"{result['baseline_depth']}: {found} -> {args.out}")


if __name__ == "__main__":
    run(main)
