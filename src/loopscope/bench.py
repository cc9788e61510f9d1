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
stream, and convergence.windows... streams decoded together, depth-wise batched):
    realized        time of uniform depth R / time of the policy
    ideal           FLOPs of uniform depth R / FLOPs of the same exit decisions, checks
                    included (LoopedLM.cost: attention at the mean query position)
    measured_ideal  the same ratio with each loop and check costed at its measured time
                    for its number of active tokens (scoring only): what skipping can
                    give on this machine once per-call overheads are counted
    vs_matched_uniform  time of the smallest uniform depth that matches depth R's
                    quality on `choose` / time of the policy: the honest baseline

train: how close does a training step on the CPU (fp32, train.threads threads) come to
this machine's matrix-multiply speed? Per cell (from params.yaml alone, no stage outputs
needed; random token ids, since timing does not depend on the data; a sampled depth
fixed at R = model.loops), the median over
`repeats` rounds of `steps` optimizer steps exactly as loopscope.train takes them, beside,
in the same rounds, a 2048 x 2048 fp32 matmul and a plain reference of the same shapes
built from torch.nn.TransformerEncoderLayer (causal mask, pre-norm LayerNorm, GELU, tied
head, the same loops and readouts). FLOPs per token of a step (step_flops):
    3 (prelude + G loop + n_read readout) + F loop
with G loops building a graph, F loops run without one (train.backprop_loops), n_read
readouts (every graph loop for a per-loop loss, one for a final one) and loop / readout
the forward FLOPs of LoopedLM.cost; the backward pass costs two forwards. GFLOP/s over the
matmul's is the step's share of the machine's large-matmul throughput (like MFU).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from loopscope import memory, paths, runtime
from loopscope.config import READS, CellConfig, load_cell
from loopscope.convergence import fit_probe, trajectory
from loopscope.errors import DataError, ParamsError, run, write_json
from loopscope.model import LoopedLM, ModelConfig, schedule
from loopscope.model import cost as model_cost
from loopscope.params import Params, load_params, resolve_cell
from loopscope.plots import read_metrics
from loopscope.policies import Policy, Uniform, flops_per_token, make, masked_forward
from loopscope.report import cell_group, paper_b_backbones
from loopscope.runs import Windows, trained_runs
from loopscope.train import objective, optimizer, update

RULES = ("kl", "latent", "cosine", "probe")


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def interleaved(jobs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds of each job over `repeats` rounds, the jobs interleaved within a
    round and their order rotated between rounds, so drift in the machine's speed
    falls on all of them alike."""
    names = list(jobs)
    times: dict[str, list[float]] = {n: [] for n in names}
    for name in names:  # warm-up, untimed
        jobs[name]()
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            _sync()
            start = time.perf_counter()
            jobs[name]()
            _sync()
            times[name].append(time.perf_counter() - start)
    return {n: statistics.median(v) for n, v in times.items()}


def _batches(w: Windows, size: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    return [(w.x[i:i + size], w.y[i:i + size], None if w.h0 is None else w.h0[i:i + size])
            for i in range(0, len(w.x), size)]


def _ce(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float(F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()))


def matched_policies(metrics: dict[str, Any], probe: tuple[torch.Tensor, float] | None,
                     first: int, every: int) -> dict[str, Policy]:
    """Each rule at the threshold the policies stage chose (rules that never matched
    depth R's quality are left out)."""
    return {rule: make(rule, metrics[rule]["threshold"], first, every, probe)
            for rule in RULES if metrics.get(rule, {}).get("matched")}


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


def scoring(model: LoopedLM, w: Windows, policies: dict[str, Policy], r: int, m: int,
            batch: int, repeats: int) -> dict[str, Any]:
    """Teacher-forced scoring of the windows: uniform depths R and m (plain forward
    passes), every policy through the runtime, and A1 through the masked reference."""
    data = _batches(w, batch)
    out: dict[str, Any] = {"tokens": int(w.x.numel()), "batch_windows": batch}
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
    jobs: dict[str, Callable[[], Any]] = {
        f"uniform {r}": lambda: [model(xb, loops=r, read="last", h0=hb) for xb, _, hb in data],
        f"uniform {m}": lambda: [model(xb, loops=m, read="last", h0=hb) for xb, _, hb in data],
    }
    for name, policy in policies.items():
        jobs[name] = (lambda p=policy: [runtime.score(model, xb, p, r, hb)
                                        for xb, _, hb in data])
    if "kl" in policies:
        jobs["kl (masked reference)"] = lambda: [masked_forward(model, xb, policies["kl"], r, hb)
                                                 for xb, _, hb in data]
    seconds = interleaved(jobs, repeats)
    cost = model.cost()
    base, matched_t = seconds[f"uniform {r}"], seconds[f"uniform {m}"]
    cal = calibrate(model, data[0][0], data[0][2], any(p.needs_logits for p in policies.values()))
    uniform = _predicted([data[0][0].numel()] * r, [], cal) * len(data)
    out.update({
        "seconds": seconds,
        "tokens_per_s": {k: out["tokens"] / v for k, v in seconds.items()},
        "realized": {n: base / seconds[n] for n in policies},
        "ideal": {n: cost.uniform(r) / d["flops"] for n, d in decisions.items()},
        "measured_ideal": {n: uniform / sum(
            _predicted(a, c, cal) for a, c in zip(d["active"], d["checks"], strict=True))
            for n, d in decisions.items()},
        "vs_matched_uniform": {n: matched_t / seconds[n] for n in policies},
        "mean_loops": {n: d["mean_loops"] for n, d in decisions.items()},
        "ce": {n: d["ce"] for n, d in decisions.items()},
        "calibration": cal,
    })
    if "kl" in policies:
        out["masked_reference_realized"] = base / seconds["kl (masked reference)"]
    return out


def _checks_per_loop(rn: runtime.ScoreRun, policy: Policy, r: int) -> list[int]:
    """How many tokens each check of a scoring run read out (the active ones)."""
    if not policy.needs_logits:
        return []
    return [n for loop, n in enumerate(rn.active_per_loop, 1)
            if loop < r and policy.checks_at(loop)]


def decoding(model: LoopedLM, w: Windows, policies: dict[str, Policy], r: int, m: int,
             streams: int, tokens: int, repeats: int) -> dict[str, Any]:
    """Token-by-token decoding, teacher-forced on the first `streams` windows cut to
    `tokens` tokens, streams depth-wise batched; uniform depths through the same
    decoder (every token runs the cap)."""
    x, y = w.x[:streams, :tokens], w.y[:streams, :tokens]
    h0 = None if w.h0 is None else w.h0[:streams, :tokens]
    configs: dict[str, tuple[Policy, int]] = {f"uniform {r}": (Uniform(), r),
                                              f"uniform {m}": (Uniform(), m)}
    configs.update({n: (p, r) for n, p in policies.items()})
    jobs = {n: (lambda p=p, cap=cap: runtime.generate(model, x, p, cap, h0))
            for n, (p, cap) in configs.items()}
    runs = {n: job() for n, job in jobs.items()}
    seconds = interleaved(jobs, repeats)
    cost = model.cost()
    base, matched_t = seconds[f"uniform {r}"], seconds[f"uniform {m}"]
    flops = {n: flops_per_token(model, runs[n].exit_loop.cpu().numpy(),
                                runs[n].checks.cpu().numpy(), p.needs_logits)
             for n, p in policies.items()}
    return {
        "streams": streams, "tokens_per_stream": tokens,
        "seconds": seconds,
        "tokens_per_s": {n: x.numel() / v for n, v in seconds.items()},
        "steps": {n: rn.steps for n, rn in runs.items()},
        "realized": {n: base / seconds[n] for n in policies},
        "ideal": {n: cost.uniform(r) / f for n, f in flops.items()},
        "vs_matched_uniform": {n: matched_t / seconds[n] for n in policies},
        "mean_loops": {n: float(rn.exit_loop.float().mean()) for n, rn in runs.items()},
        "ce": {n: _ce(rn.logits, y) for n, rn in runs.items()},
    }


def top_ops(fn: Callable[[], Any], n: int = 12) -> list[dict]:
    """Where one call of fn spends its time: the top operators by self CPU time
    (torch.profiler), after one untimed call."""
    fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    return [{"op": e.key, "share": e.self_cpu_time_total / total, "calls": e.count}
            for e in events[:n]]


def profile(model: LoopedLM, w: Windows, policy: Policy, r: int, batch: int) -> list[dict]:
    """Where one runtime scoring call spends its time."""
    xb, hb = w.x[:batch], None if w.h0 is None else w.h0[:batch]
    return top_ops(lambda: runtime.score(model, xb, policy, r, hb))


def exits(params: Params, cell: str | None, repeats: int | None = None) -> dict[str, Any]:
    """The exit benchmark (module doc) on `cell` (default: the main paper B backbone)."""
    if cell is None:
        configs = {c: load_cell(paths.config_file(c)) for c in params.cells}
        cell, _ = paper_b_backbones({c: v for c, v in configs.items()
                                     if cell_group(v) == "paper B backbone"})
        if cell is None:
            raise DataError("no paper B backbone in params.yaml; pass --cell.")
    metrics = read_metrics("policies", cell)
    r, m = metrics["reference_depth"], metrics["uniform"]["matched_depth"]
    repeats = repeats or params.bench.repeats
    tokens = min(params.bench.decode_tokens, load_cell(paths.config_file(cell)).model.context)
    first = next(trained_runs(cell))
    model, cfg = first.model, params.policies
    torch.set_num_threads(first.cell.train.threads)
    sets = first.window_sets(params.convergence.windows, "convergence.windows")
    with torch.no_grad(), first.compute.autocast():
        p = sets["probe"]
        probe = fit_probe(trajectory(model, p.x, p.y, p.h0, r, cfg.batch_size,
                                     keep_states=r - 1), r)
        policies = matched_policies(metrics, probe, cfg.first, cfg.every)
        report = sets["report"]
        result = {
            "cell": cell, "run": first.tag, "reference_depth": r,
            "smallest_matching_uniform_depth": m, "repeats": repeats,
            "thresholds": {n: metrics[n]["threshold"] for n in policies},
            "check_schedule": {"first": cfg.first, "every": cfg.every},
            "machine": {"cpu": platform.processor() or platform.machine(),
                        "threads": torch.get_num_threads(), "torch": torch.__version__,
                        "device": str(first.compute.device)},
            "scoring": scoring(model, report, policies, r, m, cfg.batch_size, repeats),
            "generation_batch1": decoding(model, report, policies, r, m, 1, tokens, repeats),
            "generation_batched": decoding(model, report, policies, r, m, cfg.batch_size,
                                           tokens, max(1, repeats // 2)),
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


def step_flops(cfg: ModelConfig, read: str, grad_loops: int) -> float:
    """FLOPs per token of one training step at the cell's depth (module doc)."""
    cost = model_cost(cfg)
    sched = schedule(cfg.loops, read, grad_loops)
    return (3 * (cost.prelude + sched.graph_loops * cost.loop + len(sched.read) * cost.readout)
            + sched.frozen * cost.loop)


def train_jobs(cell: CellConfig) -> tuple[Callable[[], None], Callable[[], None]]:
    """Two closures, each taking one optimizer step on a fixed random batch: the cell's
    LoopedLM as loopscope.train steps it, and its Reference."""
    m, cfg = cell.model, cell.train
    torch.manual_seed(cfg.seed)
    x, y = (torch.randint(0, m.vocab_size, (cfg.batch_size, m.context)) for _ in range(2))
    read = READS[cfg.loss]
    model, ref = LoopedLM(m).train(), Reference(m).train()
    opt, ref_opt = optimizer(model, cfg), torch.optim.AdamW(ref.parameters(), lr=cfg.lr)

    def ours() -> None:
        loss, _ = objective(model(x, read=read, grad_loops=cfg.backprop_loops), y, cfg)
        update(model, opt, loss, cfg.grad_clip)

    def reference() -> None:
        logits = ref(x, m.loops, read, cfg.backprop_loops)
        loss = torch.stack([F.cross_entropy(lg.flatten(0, 1), y.flatten()) for lg in logits])
        update(ref, ref_opt, loss.mean(), cfg.grad_clip)
    return ours, reference


def _times(fn: Callable[[], Any], n: int) -> Callable[[], None]:
    def job() -> None:
        for _ in range(n):
            fn()
    return job


def train(params: Params, cells: list[str] | None, steps: int, repeats: int,
          matmul: int = 2048) -> dict[str, Any]:
    """The training benchmark (module doc) on `cells` (default: one paper A cell per loss
    placement and the main backbone, where params.yaml has them)."""
    default = [c for c in ("terminal_normed", "perloop_normed", "backbone") if c in params.cells]
    cells = cells or default or list(params.cells)[:1]
    resolved = [resolve_cell(params, c) for c in cells]  # unknown names fail here
    torch.set_num_threads(resolved[0].train.threads)
    memory.tune_heap("train")  # as the train stage runs
    a, b = torch.randn(matmul, matmul), torch.randn(matmul, matmul)
    result: dict[str, Any] = {
        "steps": steps, "repeats": repeats, "matmul_size": matmul,
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "threads": torch.get_num_threads(), "torch": torch.__version__},
        "cells": {}}
    profiled = None
    for cell in resolved:
        ours, reference = train_jobs(cell)
        profiled = profiled or ours
        seconds = interleaved({"ours": _times(ours, steps),
                               "reference": _times(reference, steps),
                               "matmul": _times(lambda: a @ b, steps)}, repeats)
        m, read = cell.model, READS[cell.train.loss]
        tokens = steps * cell.train.batch_size * m.context
        flops = step_flops(m, read, cell.train.backprop_loops)
        ref_flops = step_flops(dataclasses.replace(m, inject="none", ffn="gelu"), read,
                               cell.train.backprop_loops)
        mm = steps * 2 * matmul ** 3 / seconds["matmul"] / 1e9
        gflops = tokens * flops / seconds["ours"] / 1e9
        ref_gflops = tokens * ref_flops / seconds["reference"] / 1e9
        result["cells"][cell.cell] = {
            "loops": m.loops, "loss": cell.train.loss, "flops_per_token": flops,
            "tokens_per_s": tokens / seconds["ours"], "gflops": gflops,
            "matmul_gflops": mm, "ratio_to_matmul": gflops / mm,
            "reference_tokens_per_s": tokens / seconds["reference"],
            "reference_gflops": ref_gflops, "reference_ratio_to_matmul": ref_gflops / mm}
        print(f"bench train {cell.cell}: {tokens / seconds['ours']:,.0f} tokens/s, "
              f"{gflops:.0f} GFLOP/s = {gflops / mm:.2f} of the matmul's {mm:.0f}; "
              f"reference {tokens / seconds['reference']:,.0f} tokens/s", flush=True)
    result["profile"] = {"cell": resolved[0].cell, "top_ops": top_ops(profiled)}
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="bench", required=True)
    ex = sub.add_parser("exits", help="adaptive runtime: realized vs ideal speedup")
    ex.add_argument("--cell", help="a trained cell (default: the main paper B backbone)")
    ex.add_argument("--repeats", type=int, help="timed rounds (default: bench.repeats)")
    ex.add_argument("--out", default=str(paths.bench_file("exits")))
    tr = sub.add_parser("train", help="training step against the machine's matmul")
    tr.add_argument("--cells", nargs="+", help="cells of params.yaml (default: "
                    "terminal_normed, perloop_normed, backbone)")
    tr.add_argument("--steps", type=int, default=10, help="optimizer steps per round")
    tr.add_argument("--repeats", type=int, default=5, help="timed rounds, interleaved")
    tr.add_argument("--out", default=str(paths.bench_file("train")))
    args = parser.parse_args(argv)
    params = load_params()
    if args.bench == "train":
        if args.steps < 1 or args.repeats < 1:
            raise ParamsError("--steps and --repeats must be >= 1.")
        write_json(args.out, train(params, args.cells, args.steps, args.repeats))
        print(f"bench train -> {args.out}")
        return
    result = exits(params, args.cell, args.repeats)
    write_json(args.out, result)
    s = result["scoring"]
    found = ", ".join(f"{n} {v:.2f}x (ideal {s['ideal'][n]:.2f}x)"
                      for n, v in s["realized"].items())
    print(f"bench exits {result['cell']}: scoring realized {found} -> {args.out}")


if __name__ == "__main__":
    run(main)
