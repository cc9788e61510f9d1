"""Check a params file and print what training and measuring its cells would cost,
without training.

    python -m loopscope.tools.plan [PARAMS_FILE] [--json | --brief] [--device cuda|cpu] [--tflops X]
    python -m loopscope.tools.plan [PARAMS_FILE] --budget-hours H [--write PATH] [...]

A paper-scale run takes GPU-hours; a wrong context, a too-large batch or an epoch count
that means ten times more steps than intended should show up in a second. For every
cell this prints the parameter count, the training depth, tokens and steps per epoch,
a memory estimate and the hours its training takes, and a total over all training runs
(cells x seeds), then the hours of the measuring stages. --brief prints the two totals
on one line (`make repro` prints it before `dvc repro`).

The params file is validated first (load_params): a bad key prints one `error: ...`
line and exits 1 before anything else happens, like every stage.

Tokens come, in order of preference, from prepared/meta.json (if its vocabulary size,
tokenizer kind and hub dataset match the params; which files it read is not recorded, so
a match is likely, not certain), from
an estimate on the raw .txt files in data.dir (a tokenizer trained on a ~2 MB sample),
or not at all (the corpus is not fetched yet; the command that fetches it is printed).

The memory column is loopscope.preflight.memory's training estimate per process (its docstring
has the formula), the same numbers the train stage checks against the memory there is
before its first step. Not counted: the CUDA context (~0.5 GiB).

Time is FLOPs over a sustained rate. Training FLOPs per token: the forward pass at the
sampler's mean depth with its readouts (loopscope.weights.model.cost) plus twice the part the
gradients run through (the kept loops). The rate:
- CUDA: an assumed TFLOPS (--tflops to change it);
- CPU: calibrated on this machine in a few seconds (probe): the fp32 matmul roof (a
  square matmul, the size `bench train` times, on train.threads threads) times the
  share of that roof a training step reaches (step efficiency: the fp32 ratio_to_matmul
  of a committed `bench train` result, metrics/bench/train.json, else STEP_EFFICIENCY);
  a cell whose runs train side by side (train.seed_processes) at each run's share of
  the threads, its roof probed at that count, times the runs at once; --tflops replaces
  the calibration.
The measuring stages (extract, diagnose with the clamp, throughput, convergence, policies,
bench_exits) run forward passes only; their FLOPs are counted from params.yaml (windows,
depths, seeds, grids: measuring_flops), at the rate of a forward pass of the model's own
shapes timed on this machine (CUDA: the assumed rate), plus a fixed start-up per stage
and per report (STAGE_SECONDS, REPORT_SECONDS). An order of magnitude to budget by, not
a measurement.

Outside models (params.yaml's `outside:`, released checkpoints measured beside the cells)
are planned from their config.json: size, memory per measuring stage and hours, and a
refusal where one cannot fit this machine (loopscope.tools.plan_outside). --budget-hours H
prints instead, for each of them, the measuring sizes (windows, depths) that fit its
stages in H hours at the same rate, the floors it will not pass, and the interval widths
those sizes buy, estimated from this run's cells; --write PATH writes a params file with
them (loopscope.tools.budget).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from loopscope.base import paths
from loopscope.params import Params, load_params
from loopscope.preflight import memory
from loopscope.preflight.memory import GIB, num_params
from loopscope.tools import budget
from loopscope.tools.flops import (
    REPORT_SECONDS,
    STAGE_SECONDS,
    TFLOPS,
    bench_flops,
    model_flops,
)
from loopscope.tools.plan_outside import outside_lines, plan_outside
from loopscope.tools.probe import Calibration, calibrate, shape_key
from loopscope.tools.tokens import corpus_tokens
from loopscope.weights import compute
from loopscope.weights.config import CellConfig, TrainConfig
from loopscope.weights.data import steps_for_epochs, train_windows
from loopscope.weights.depth import sampler
from loopscope.weights.model import cost
from loopscope.weights.resolve import resolve_cell

# The measuring stages as dvc.yaml builds them: once per cell, once per policies.cell,
# once; the reports. Training's own (timings.TRAINING) are timed by their FLOPs.
PER_CELL_STAGES = ("extract", "diagnose", "convergence")
POLICY_STAGES = ("policies",)
RECALIBRATE_STAGES = ("recalibrate",)  # once per recalibrate.cells
ONCE_STAGES = ("throughput", "bench_exits", "headline", "claims", "plots", "summary")
REPORT_STAGES = ("report_blind_spot", "report_convergence", "report_index")


def assumed_device(cell: CellConfig, device: str | None = None) -> str:
    """The device training would use (loopscope.weights.compute's rule), assuming the given
    device is what this machine has, where train.device is auto."""
    cuda = compute.uses_cuda(cell.train.device, device == "cuda" if device else None)
    return "cuda" if cuda else "cpu"


@functools.cache
def _depth_mean(depth: str, sigma: float, convention: str, loops: int) -> float:
    """E[r] of a depth sampler. The lognormal's is a mean over 20,000 fixed-seed draws (a
    third of a second), which depends on nothing else: one estimate per process."""
    cfg = TrainConfig(depth=depth, depth_sigma=sigma, depth_mean=convention)
    return sampler(cfg, loops).mean()


def depth_mean(t: TrainConfig, loops: int) -> float:
    """E[r] of a cell's training depth sampler (train.depth, its sigma and convention)."""
    return _depth_mean(t.depth, t.depth_sigma, t.depth_mean, loops)


def train_flops_per_token(cell: CellConfig) -> float:
    """Training FLOPs per token at the sampler's mean depth: the forward pass with its
    readouts, plus the backward pass (2x forward) through the loops gradients reach."""
    m, t = cell.model, cell.train
    c, mean = cost(m), depth_mean(t, m.loops)
    kept = min(mean, t.backprop_loops) if t.backprop_loops > 0 else mean
    per_loop = t.loss == "per_loop"
    forward = c.prelude + c.loop * mean + c.readout * (mean if per_loop else 1)
    backward = 2 * (c.prelude + c.loop * kept + c.readout * (kept if per_loop else 1))
    return forward + backward


def measuring_flops(params: Params, name: str, cell: CellConfig) -> dict[str, float]:
    """Forward FLOPs of the measuring stages on one cell, every run (seed) of it
    together, by stage: what each stage runs (stages/*.py), at most.

    With P, L, R the prelude, one loop and one readout of loopscope.weights.model.cost, K the
    training depth (model.loops) and T the context, per token of each stage's windows:
      extract      P + K L (extract.val_sequences windows; states, no readouts)
      diagnose     P + D (L + R) + 4 K R, D = max(diagnose.sweep_depth, K): the depth sweep
                   reading every loop, and Lemma 1's float64 readout with its gradient
                   at each of the K loops (2 R, at half the fp32 rate); then the
                   clamp, one pass P + K (L + R) per clamp mode
      throughput   the first run: one warm-up batch, then diagnose.timing_repeats
                   rounds of depths 1..K with the final readout (diagnose.timing_windows)
      convergence  3 passes P + C (L + R), C = depth_factor x K: the report and choose
                   trajectories and the cross-analysis's KL exit, run to C at most
                   (convergence.windows per set)
      policies     (policies.cells) the probe set's trajectory to K, then on each of
                   two sets uniform depth K and every grid setting through the masked
                   forward: P + K L + R, plus (K - 1) R for a rule that reads logits
      recalibrate  (recalibrate.cells) every loop read once, then per affine loop and fold
                   about 1.25 x recalibrate.iterations forward and backward readouts
                   (3 R) on the other folds' tokens (flops.recalibrate_flops)
      bench_exits  (bench.cell, its first run) the scoring mode's six jobs (uniform
                   depths R and B, the three timed policies, A1's masked forward),
                   each once untimed and in bench.repeats rounds, each at most
                   P + K (L + R); decoding a few streams adds few FLOPs
    Early exits only make the policies and bench stages cheaper: this is an upper bound.
    """
    m, d = cell.model, params.diagnose
    c, t, k = cost(m), m.context, m.loops
    per_model = model_flops(params, c, t, k, len(cell.seeds), name in params.policies.cells,
                            name in params.recalibrate.cells, m.vocab_size)
    out = {stage: per_model[stage] for stage in ("extract", "diagnose")}
    out["throughput"] = t * (d.batch_size * (c.prelude + k * c.loop + c.readout)
                             + d.timing_repeats * d.timing_windows
                             * sum(c.prelude + i * c.loop + c.readout for i in range(1, k + 1)))
    out.update({stage: v for stage, v in per_model.items() if stage not in out})
    bench = params.bench.cell or params.policies.cells[0]
    if name == bench:
        out["bench_exits"] = bench_flops(params, c, t, k)
    return {stage: float(v) for stage, v in out.items()}


def measuring_stages(params: Params) -> dict[str, int]:
    """How many measuring stages of each kind dvc.yaml builds from these params."""
    n = {stage: len(params.cells) for stage in PER_CELL_STAGES}
    n.update({stage: len(params.policies.cells) for stage in POLICY_STAGES})
    n.update({stage: len(params.recalibrate.cells) for stage in RECALIBRATE_STAGES})
    n.update({stage: 1 for stage in (*ONCE_STAGES, *REPORT_STAGES)})
    return n


def plan_cell(cell: CellConfig, tokens: int | None, device: str | None = None,
              n_params: int | None = None, tflops: float | None = None,
              cpu_gflops: float | None = None) -> dict[str, Any]:
    """Size, depth, steps, memory (loopscope.preflight.memory.training) and time
    estimate of one cell.

    tokens: training tokens of the corpus (None: unknown, so no epoch numbers).
    device: assumed device where train.device is auto. n_params: a cached count.
    tflops: a sustained rate to assume (None: TFLOPS on cuda, cpu_gflops on a CPU).
    cpu_gflops: a training step's GFLOP/s calibrated on this CPU (Calibration); None
    and no tflops: no time on a CPU.
    """
    m, t = cell.model, cell.train
    dev = assumed_device(cell, device)
    est = memory.training(cell, dev == "cuda", n_params)
    needs = {**est.parts, "total": est.total}

    windows = train_windows(tokens, m.context, t.stride) if tokens is not None else None
    if t.epochs > 0:
        steps = (steps_for_epochs(t.epochs, tokens, m.context, t.stride, t.batch_size)
                 if tokens is not None else None)
    else:
        steps = t.steps
    epochs = (steps * t.batch_size / windows if steps is not None and windows else None)
    trained = steps * t.batch_size * m.context if steps is not None else None
    flops = train_flops_per_token(cell) * trained if trained is not None else None
    rate, source = _rate(cell, dev, tflops, cpu_gflops)
    return {
        "params": est.params,
        "loops": m.loops,
        "depth": t.depth,
        "depth_mean": depth_mean(t, m.loops),
        "depth_p99": est.depth_p99,
        "loops_kept": est.loops_kept,
        "readouts": est.readouts,
        "block_applications": est.blocks,
        "windows_per_epoch": windows,
        "tokens_per_epoch": windows * m.context if windows is not None else None,
        "steps": steps,
        "epochs": epochs,
        "tokens_trained": trained,
        "train_flops": flops,
        "tflops_assumed": rate / 1e12 if source in ("given", "assumed") else None,
        "rate_flops_per_s": rate,
        "rate_source": source,
        "hours": flops / rate / 3600 if flops is not None and rate else None,
        "runs": len(cell.seeds),
        "device": dev,
        "device_auto": t.device == "auto",
        "precision": compute.precision_of(t, dev == "cuda"),
        "activation_bytes": est.act_bytes,
        "batch_per_process": est.batch,
        "memory_bytes": needs,
        "memory_gib": {k: v / GIB for k, v in needs.items()},
    }


def _rate(cell: CellConfig, dev: str, tflops: float | None, cpu_gflops: float | None
          ) -> tuple[float | None, str | None]:
    """The FLOP/s a cell's training is timed at, and where it comes from: given
    (tflops), assumed (TFLOPS on cuda), calibrated (cpu_gflops per process), or none."""
    if tflops is not None:
        return tflops * 1e12, "given"
    if dev == "cuda":
        return TFLOPS * 1e12, "assumed"
    if cpu_gflops is not None:
        return cpu_gflops * 1e9 * cpu_processes(cell), "calibrated"
    return None, None


def cpu_processes(cell: CellConfig) -> int:
    """Data-parallel CPU processes that can each have train.threads cores of this machine
    (train.processes, at most cores // threads, at least 1): the calibrated rate is one
    process's."""
    cores = os.cpu_count() or 1
    return max(1, min(cell.train.processes, cores // max(1, cell.train.threads)))


def _n(x: float | None, fmt: str = ",.0f") -> str:
    return "?" if x is None else format(x, fmt)


def _si(x: float | None) -> str:
    """1234567 -> 1.2M: counts that span six orders of magnitude, readable at a glance."""
    if x is None:
        return "?"
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.1f}{unit}"
    return f"{x:.0f}"


def plan(path: str | Path, device: str | None = None,
         prepared: Path = paths.PREPARED, tflops: float | None = None,
         probe: Callable[[list[CellConfig], int], Calibration] | None = calibrate
         ) -> dict[str, Any]:
    """The whole plan of a params file: corpus tokens, every cell, a total for training
    and one for the measuring stages, and the outside models (plan_outside). probe:
    calibrates this machine for the cells that train on its CPU when no tflops is given
    (None: no probe, so no CPU times)."""
    params = load_params(path)  # first: a bad key fails before any work
    corpus = corpus_tokens(params, prepared, path)
    resolved = {name: resolve_cell(params, name) for name in params.cells}
    on_cpu = [c for c in resolved.values() if assumed_device(c, device) == "cpu"]
    calibration = (probe(on_cpu, params.diagnose.batch_size)
                   if on_cpu and tflops is None and probe is not None else None)
    counts: dict[str, int] = {}
    cells = {}
    for name, cell in resolved.items():
        key = json.dumps(cell.model.__dict__, sort_keys=True)
        counts.setdefault(key, num_params(cell.model))
        gflops = calibration.side_by_side_gflops(cell) if calibration else None
        cells[name] = plan_cell(cell, corpus.tokens, device, counts[key], tflops, gflops)
        flops = measuring_flops(params, name, cell)
        rate = measuring_rate(cells[name], cell, calibration)
        cells[name]["measure_flops"] = flops
        cells[name]["measure_hours"] = (sum(flops.values()) / rate / 3600 if rate else None)

    def total(key: str) -> float | None:
        values = [c[key] for c in cells.values()]
        if None in values:
            return None
        return sum(v * c["runs"] for v, c in zip(values, cells.values(), strict=True))

    stages = measuring_stages(params)
    startup = (STAGE_SECONDS * sum(n for s, n in stages.items() if s not in REPORT_STAGES)
               + REPORT_SECONDS * sum(n for s, n in stages.items() if s in REPORT_STAGES))
    by_stage: dict[str, float] = {}
    for c in cells.values():
        for stage, f in c["measure_flops"].items():
            by_stage[stage] = by_stage.get(stage, 0.0) + f
    model_hours = [c["measure_hours"] for c in cells.values()]
    return {
        "params_file": str(path),
        "device_given": device,
        "corpus": {"train_tokens": corpus.tokens, "source": corpus.source},
        "calibration": (dataclasses.asdict(calibration) | {
            "train_gflops": calibration.train_gflops} if calibration else None),
        "cells": cells,
        "total": {"cells": len(cells), "runs": sum(c["runs"] for c in cells.values()),
                  "steps": total("steps"),
                  "tokens_trained": total("tokens_trained"),
                  "train_flops": total("train_flops"),
                  "hours": total("hours"),
                  "peak_memory_gib": max(c["memory_gib"]["total"] for c in cells.values())},
        "measuring": {"flops": sum(by_stage.values()), "flops_by_stage": by_stage,
                      "stages": stages, "startup_seconds": startup,
                      "hours": (None if None in model_hours
                                else sum(model_hours) + startup / 3600)},
        "outside": plan_outside(params, device, tflops,
                                calibration.roof_gflops if calibration else None),
    }


def measuring_rate(planned: dict[str, Any], cell: CellConfig,
                   calibration: Calibration | None) -> float | None:
    """FLOP/s of the measuring stages' forward passes for a planned cell: the rate its
    training assumes where it is given or assumed (CUDA), else the forward pass of its
    shapes timed on this CPU (None: not calibrated)."""
    if planned["rate_source"] in ("given", "assumed"):
        return planned["rate_flops_per_s"]
    if calibration is None:
        return None
    return calibration.forward_gflops[shape_key(cell.model)] * 1e9


def format_plan(result: dict[str, Any]) -> str:
    """A readable text table of plan()'s result."""
    rows = []
    for name, c in result["cells"].items():
        depth = (f"{c['loops']}" if c["depth"] == "fixed"
                 else f"~{c['depth_mean']:.1f} (p99 {c['depth_p99']})")
        gib = c["memory_gib"]
        rows.append([name, _si(c["params"]), depth, str(c["loops_kept"]),
                     _si(c["windows_per_epoch"]), _si(c["tokens_per_epoch"]), _n(c["steps"]),
                     _n(c["hours"], ",.1f"),
                     _n(c["epochs"], ".2f"),
                     str(c["runs"]), f"{gib['weights_optimizer']:.1f}",
                     f"{gib['activations']:.1f}", f"{gib['attention']:.1f}",
                     f"{gib['logits']:.1f}", f"{gib['total']:.1f}"])
    t = result["total"]
    rows.append(["total", "", "", "", "", "", _n(t["steps"]), _n(t["hours"], ",.1f"), "",
                 str(t["runs"]), "", "", "",
                 "", f"{t['peak_memory_gib']:.1f} max"])
    header = ["cell", "params", "depth", "bp loops", "windows/epoch", "tokens/epoch", "steps",
              "hours", "epochs", "runs", "W+G+Adam", "activ.", "attn.", "logits", "GiB (est.)"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                         for i, (v, w) in enumerate(zip(r, widths, strict=True)))

    first = next(iter(result["cells"].values()))
    precision = "16-bit" if first["activation_bytes"] == 2 else "fp32"
    tokens = result["corpus"]["train_tokens"]
    where = ""
    if first["device_auto"]:
        where = (" (train.device auto, from --device)" if result["device_given"] else
                 " (train.device auto, as on this machine; --device cuda plans for a GPU)")
    out = [f"plan: {result['params_file']} (nothing is trained; memory is an estimate; "
           "attn.: the attention matrices, which fused attention kernels do not store)",
           f"train tokens: {_n(tokens)} ({result['corpus']['source']})",
           f"device: {first['device']}{where}, {precision} activations, batch per process "
           f"{first['batch_per_process']} (first cell; memory is per process)",
           "", line(header), line(["-" * w for w in widths]), *map(line, rows[:-1]),
           line(["-" * w for w in widths]), line(rows[-1])]
    if t["tokens_trained"] is not None:
        out.append(f"all runs together train on {_si(t['tokens_trained'])} tokens "
                   f"(steps x batch x context), {t['train_flops']:.2e} FLOPs")
    out.extend(time_lines(result))
    out.extend(outside_lines(result.get("outside", {})))
    return "\n".join(out)


def _hours(h: float | None) -> str:
    if h is None:
        return "? h"
    if h >= 0.1:
        return f"{h:,.1f} h"
    return f"{h * 60:.0f} min" if h * 60 >= 1 else "<1 min"


def _where(result: dict[str, Any]) -> str:
    """The machine the times are for: the CPU and its threads, or the assumed rate."""
    cal = result["calibration"]
    first = next(iter(result["cells"].values()))
    if first["rate_source"] == "calibrated" and cal:
        return f"on {cal['cpu']}, {cal['threads']} threads"
    if first["rate_source"] in ("given", "assumed"):
        return f"on {first['device']} at an assumed {first['tflops_assumed']:g} TFLOP/s"
    return f"on {first['device']} (not calibrated)"


def time_lines(result: dict[str, Any]) -> list[str]:
    """The training and measuring times of plan()'s result and where they come from."""
    t, m, cal = result["total"], result["measuring"], result["calibration"]
    first = next(iter(result["cells"].values()))
    out = []
    if t["hours"] is not None and first["rate_source"] in ("given", "assumed"):
        out.append(f"time: {t['hours']:,.1f} device-hours at an assumed "
                   f"{first['tflops_assumed']:g} TFLOP/s sustained (--tflops; an estimate "
                   "from FLOPs, not a measurement)")
    elif t["hours"] is not None and cal:
        out.append(f"time: {_hours(t['hours'])} of training {_where(result)}: its FLOPs at "
                   f"{cal['train_gflops']:.1f} GFLOP/s = step efficiency "
                   f"{cal['efficiency']:.2f} ({cal['efficiency_source']}) x this machine's "
                   f"fp32 matmul roof, {cal['roof_gflops']:.1f} GFLOP/s ({cal['matmul_size']}"
                   f" x {cal['matmul_size']}, probed in {cal['seconds']:.1f} s with the "
                   "forward passes below; --tflops to assume a rate instead); an estimate "
                   "from FLOPs, not a measurement")
        bf16 = [n for n, c in result["cells"].items()
                if c["device"] == "cpu" and c["precision"] == "bf16"]
        if bf16:
            out.append(f"  {len(bf16)} cells train in bf16 here: timed at fp32's rate "
                       "(`python -m loopscope.tools.bench train --precisions fp32 bf16` measures "
                       "the difference)")
    elif first["device"] == "cpu" and t["hours"] is None and first["rate_source"]:
        out.append("time: ? (the train tokens are unknown, so the steps are)")
    if m["hours"] is None:
        return out
    fl = m["flops_by_stage"]
    share = (f", {m['flops'] / t['train_flops']:.2g} of training's"
             if t["train_flops"] else "")
    if first["rate_source"] == "calibrated" and cal:
        rates = sorted(cal["forward_gflops"].values())
        rate = (f"{rates[0]:.1f}" if len(rates) == 1 or rates[-1] - rates[0] < 0.05
                else f"{rates[0]:.1f}-{rates[-1]:.1f}")
        how = f"at the rate of a forward pass of the models' shapes probed here ({rate} GFLOP/s)"
    else:
        how = "at the same rate"
    n = m["stages"]
    reports = sum(v for k, v in n.items() if k in REPORT_STAGES)
    out.append(f"measuring: {_hours(m['hours'])}: the forward FLOPs of "
               + ", ".join(f"{k} {v:.1e}" for k, v in fl.items())
               + f" ({m['flops']:.1e}{share}; an upper bound: plan.measuring_flops) {how}, "
               f"plus {STAGE_SECONDS:g} s start-up per stage ({sum(n.values()) - reports}) "
               f"and {REPORT_SECONDS:g} s per report ({reports}); bootstrap resampling "
               "not counted")
    return out


def format_brief(result: dict[str, Any]) -> str:
    """One line of totals, and one of what they are: what `make repro` prints first."""
    t, m = result["total"], result["measuring"]
    training = _hours(t["hours"])
    if t["hours"] is None and t["train_flops"] is None:
        training += " (train tokens unknown: " + result["corpus"]["source"] + ")"
    cal = result["calibration"]
    how = (f"FLOPs at rates probed here in {cal['seconds']:.1f} s" if cal
           else "FLOPs at an assumed rate")
    runs = f"{t['runs']} run" + ("s" if t["runs"] != 1 else "")
    return (f"estimated: training {training}, measuring {_hours(m['hours'])} "
            f"{_where(result)}\n"
            f"  ({runs} from scratch, {how}; `dvc repro` reruns only what changed; "
            f"`python -m loopscope.tools.plan {result['params_file']}` for the table)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loopscope.tools.plan",
                                     description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("params_file", nargs="?", default=str(paths.PARAMS))
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print the plan as JSON")
    shown.add_argument("--brief", action="store_true",
                       help="print the estimated hours of training and measuring only")
    parser.add_argument("--device", choices=("cuda", "cpu"),
                        help="assume this device where train.device is auto "
                             "(default: cuda if this machine has it)")
    parser.add_argument("--prepared", default=str(paths.PREPARED),
                        help="the prepare stage's output")
    parser.add_argument("--tflops", type=float,
                        help=f"assumed sustained TFLOP/s for the times (default "
                             f"{TFLOPS:g} on cuda, calibrated on this machine's CPU)")
    parser.add_argument("--budget-hours", type=float, metavar="H",
                        help="print, for each outside model, the measuring sizes that fit "
                             "its stages in H hours at the rate above (loopscope.tools.budget)")
    parser.add_argument("--write", metavar="PATH",
                        help="with --budget-hours: write the params file with those sizes")
    args = parser.parse_args(argv)
    check_args(parser, args)
    result = plan(args.params_file, args.device, Path(args.prepared), args.tflops)
    if args.budget_hours is not None:
        result["budget"] = budget.fit_all(load_params(args.params_file), result["outside"],
                                          args.budget_hours)
    try:
        text = (json.dumps(result, indent=2) if args.json
                else format_brief(result) if args.brief
                else "\n".join(budget.budget_lines(result["budget"])) if "budget" in result
                else format_plan(result))
        print(text, flush=True)
    except BrokenPipeError:  # `plan | head`: the reader is gone, not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if args.write:  # after the JSON, if any: on stderr then, so stdout stays JSON
        write_budget(args.params_file, args.write, result["budget"],
                     sys.stderr if args.json else sys.stdout)


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The options' ranges and combinations, before any work (parser.error exits 2)."""
    for name in ("tflops", "budget_hours"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} is {value:g}; it must be > 0")
    if args.write and args.budget_hours is None:
        parser.error("--write writes the sizes --budget-hours chooses: give --budget-hours")
    if args.brief and args.budget_hours is not None:
        parser.error("--brief prints the plan's totals; --budget-hours prints the sizes")
    if args.write and Path(args.write).resolve() == Path(args.params_file).resolve():
        parser.error(f"--write {args.write} is the params file itself: the file written is "
                     "a YAML dump without its comments, so name another")


def write_budget(source: str, target: str, fitted: dict[str, dict[str, Any]],
                 out: TextIO) -> None:
    """--write: the params file with the chosen sizes, where every outside model fits."""
    if not fitted or not all(f["fits"] for f in fitted.values()):
        print(f"not written: {target} (not every outside model fits the budget)", file=out,
              flush=True)
        return
    print(f"written: {budget.write(source, target, fitted)} ({source} with the shared keys "
          "above; where outside models chose differently, the smallest)", file=out, flush=True)


if __name__ == "__main__":
    from loopscope.stage import execute

    execute(main)
