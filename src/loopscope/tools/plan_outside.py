"""`plan` for the outside models (params.yaml's `outside:`): each one's size, the memory
each of its measuring stages needs and the hours they take, from its config.json alone
(no weight is read), and a refusal where it cannot fit.

Memory: loopscope.preflight.memory's forward estimate at each stage's batch size, in
the precision the model is measured in (bf16 weights and activations on a GPU, fp32 on
the CPU), diagnose's with Lemma 1's float64 copy of the readout; the same numbers the
stages check before their first batch. Where the device it would run on is this
machine's (its CPU, or a GPU torch sees), a stage whose floor is above what there is
is refused here, naming the keys, before any work. Time: the forward FLOPs of its
stages (loopscope.tools.flops.model_flops, one run) at an assumed rate on CUDA (--tflops,
flops.TFLOPS) or this CPU's matmul roof (the probe's; an upper rate, so a lower bound of
the time), plus a start-up per stage.
"""

from __future__ import annotations

from typing import Any

import torch

from loopscope.looped.types import Cost
from loopscope.params import Params
from loopscope.preflight import memory
from loopscope.preflight.memory import GIB
from loopscope.released import outside
from loopscope.tools.flops import STAGE_SECONDS, TFLOPS, bench_flops, model_flops
from loopscope.weights import compute
from loopscope.weights.outside_config import OutsideConfig

STAGES = ("outside_prepare", "outside_extract", "outside_diagnose", "outside_convergence",
          "outside_policies", "outside_bench_exits", "outside_recalibrate")


def batches(params: Params) -> dict[str, tuple[str, int, bool, bool]]:
    """Each measuring stage's batch: (its key, its value, whether the stage reads the
    states out, whether it holds the float64 readout)."""
    return {"extract": ("extract.batch_size", params.extract.batch_size, False, False),
            "diagnose": ("diagnose.batch_size", params.diagnose.batch_size, False, True),
            "convergence": ("convergence.batch_size", params.convergence.batch_size, True,
                            False),
            "policies": ("policies.batch_size", params.policies.batch_size, True, False),
            # the exit runtime's scoring, at the policies' batch, reading logits
            "bench_exits": ("policies.batch_size", params.policies.batch_size, True, False),
            # the readout's fits, reading logits (one loop's of every window are held
            # besides, up to recalibrate.LOGITS_BYTES: the stage's own bound)
            "recalibrate": ("recalibrate.batch_size", params.recalibrate.batch_size, True,
                            False)}


def assumed(cfg: OutsideConfig, device: str | None) -> tuple[str, bool]:
    """The device it would run on (device auto: --device, else this machine's) and
    whether in bf16 (precision auto: on cuda): the outside stages' own rule
    (loopscope.released.outside.device_of and dtype_of), for the machine named."""
    cuda = compute.uses_cuda(cfg.device, None if device is None else device == "cuda")
    dev = "cuda" if cuda else "cpu"
    return dev, compute.uses_bf16(cfg.precision, cuda)


def checkable(dev: str) -> bool:
    """Whether this machine's memory for that device can be read: its CPU, or a GPU."""
    return dev == "cpu" or torch.cuda.is_available()


def plan_one(params: Params, cfg: OutsideConfig, device: str | None, tflops: float | None,
             roof_gflops: float | None) -> dict[str, Any]:
    """One outside model's plan (module doc); a ResourceError where a stage cannot fit
    on this machine's device."""
    size = outside.sizing(cfg)
    dev, bf16 = assumed(cfg, device)
    act = 2 if bf16 else 4
    shape = memory.outside_shape(cfg, size, act)
    stages = {stage: (key, cfg.batch_size or batch, reads, f64)
              for stage, (key, batch, reads, f64) in batches(params).items()}
    parts = {stage: memory.forward_parts(shape, batch, shape.loops, reads, act, f64)
             for stage, (_, batch, reads, f64) in stages.items()}
    if checkable(dev):
        run_on = compute.Compute(torch.device(dev), False)
        for stage, (key, batch, reads, f64) in stages.items():
            key = f"outside.{cfg.cell}.batch_size" if cfg.batch_size else key
            memory.check_forward(shape, run_on, batch, key, f"outside_{stage}", reads,
                                 float64_readout=f64, act_bytes=act)
    flops = stage_flops(params, size.cost, shape.context, shape.loops, size.vocab_size)
    rate, source = rate_of(dev, tflops, roof_gflops)
    return {"adapter": cfg.adapter, "path": cfg.path, "params": shape.params,
            "r": shape.loops, "context": shape.context, "device": dev,
            "precision": "bf16" if bf16 else "fp32", "checked": checkable(dev),
            "memory_gib": {s: sum(p.values()) / GIB for s, p in parts.items()},
            "float64_readout_gib": parts["diagnose"]["float64 readout"] / GIB,
            "measure_flops": flops, "rate_flops_per_s": rate, "rate_source": source,
            "measure_hours": hours_of(flops, rate)}


def stage_flops(params: Params, c: Cost, context: int, loops: int, vocab: int
                ) -> dict[str, float]:
    """The forward FLOPs of an outside model's measuring stages (one run, of cost c,
    windows of `context` tokens, read at R = loops, `vocab` ids): what plan prices it
    by, and what loopscope.tools.budget sizes the keys against."""
    flops = model_flops(params, c, context, loops, 1, True, True, vocab)
    flops["bench_exits"] = bench_flops(params, c, context, loops)
    return flops


def rate_of(dev: str, tflops: float | None, roof_gflops: float | None
            ) -> tuple[float | None, str | None]:
    """The FLOP/s its stages are timed at and where it comes from: given (--tflops),
    assumed (flops.TFLOPS on cuda), this CPU's matmul roof, or none."""
    if tflops is not None or dev == "cuda":
        return (tflops or TFLOPS) * 1e12, "given" if tflops else "assumed"
    return (roof_gflops * 1e9, "matmul roof") if roof_gflops else (None, None)


def hours_of(flops: dict[str, float], rate: float | None) -> float | None:
    """Hours of every outside_* stage: the FLOPs at the rate, plus a start-up per stage
    (outside_prepare's included: it runs no model but is a stage)."""
    return (sum(flops.values()) / rate + STAGE_SECONDS * len(STAGES)) / 3600 if rate else None


def plan_outside(params: Params, device: str | None = None, tflops: float | None = None,
                 roof_gflops: float | None = None) -> dict[str, dict[str, Any]]:
    """Every outside model's plan (plan_one), by name."""
    return {name: plan_one(params, cfg, device, tflops, roof_gflops)
            for name, cfg in params.outside.items()}


def outside_lines(planned: dict[str, dict[str, Any]]) -> list[str]:
    """The outside models' part of the printed plan."""
    out = []
    for name, p in planned.items():
        gib = ", ".join(f"{s} {v:,.1f}" for s, v in p["memory_gib"].items())
        hours = ("? h (no rate: --tflops)" if p["measure_hours"] is None
                 else f"{p['measure_hours']:,.2f} h")
        how = {"given": "at the given rate", "assumed": "at an assumed GPU rate",
               "matmul roof": "at this CPU's matmul roof (a lower bound)"}.get(
                   p["rate_source"], "")
        checked = ("fits this machine" if p["checked"]
                   else "not checked here (no such device): the stages check it there")
        out.append(f"outside {name} ({p['adapter']}, {p['path']}): {p['params'] / 1e9:.2f}B "
                   f"parameters, R = {p['r']}, windows of {p['context']} tokens, "
                   f"{p['device']} {p['precision']}; memory per stage (GiB, est.): {gib} "
                   f"(diagnose's float64 readout {p['float64_readout_gib']:,.1f}); "
                   f"{checked}; measuring {hours} {how}; {sum(p['measure_flops'].values()):.1e}"
                   " FLOPs")
    return out
