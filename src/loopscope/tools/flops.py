"""The FLOP and time model `plan` prices a run by: the forward FLOPs of the measuring
stages of a model of a given cost (loopscope.looped.types.Cost), a trained cell's or an
outside model's, the rate assumed on a GPU and the start-up of a stage. Its own module so
that `plan` (the cells) and `plan_outside` (the released models) both import it and
neither imports the other back.
"""

from __future__ import annotations

from loopscope.looped.types import Cost
from loopscope.measure.exit_rules.exits import KNOWN
from loopscope.measure.exit_rules.policies import settings
from loopscope.measure.exit_rules.rules import TIMED
from loopscope.measure.per_loop.recalibrate import LOGITS_BYTES
from loopscope.params import Params

TFLOPS = 50.0  # assumed sustained bf16 TFLOP/s of one current GPU (H100 / 4090 class)
# Start-up of a stage beyond its model FLOPs: python, imports, reading and writing its
# files, DVC's hashing. Measured in the micro pipeline (tests/test_pipeline.py) on a
# 2-core AMD EPYC: the stages without a model (claims, headline, plots) took 3.3-3.6 s
# each, configure 4.1 s; the three reports 9-21 s (rendering their notebooks).
STAGE_SECONDS = 4.0
REPORT_SECONDS = 15.0
CLAMP_PASSES = 2  # diagnose@<cell>'s clamp: one pass per mode (clamp.CLAMP_MODES)
BENCH_POLICIES = len(TIMED)  # the rules bench_exits times (exit_rules.rules.TIMED)


def bench_flops(params: Params, c: Cost, t: int, k: int) -> float:
    """The exit benchmark's forward FLOPs on a model of cost c (measuring_flops'
    bench_exits): bench_exits on the bench cell, outside_bench_exits on an outside
    model."""
    full, jobs = c.prelude + k * (c.loop + c.readout), BENCH_POLICIES + 3
    return float(jobs * (params.bench.repeats + 1) * params.convergence.windows * t * full)


def recalibrate_flops(params: Params, c: Cost, t: int, k: int, vocab: int = 0) -> float:
    """One run's recalibration (loopscope.measure.per_loop.recalibrate), in readouts R per
    token of the extract's windows: every loop read once (k R); then per affine loop and
    fold, L-BFGS's evaluations (about 1.25 per iteration) of a forward and backward
    readout (3 R) over the other folds' tokens, and the fold scored (R). The
    temperature's fits reread a loop's stored logits (no readout) where they fit in
    recalibrate.LOGITS_BYTES; beyond it (a vocabulary of `vocab` ids over the windows)
    every loop is read again to score the folds (k R), and each fold's temperature is
    fitted on the windows whose logits fit, read once."""
    r = params.recalibrate
    folds, fitted = r.folds, len(r.affine_loops(k))
    evals = 1.25 * r.iterations * 3 * (folds - 1) / folds + 1 / folds
    windows = params.extract.val_sequences
    again = 0.0
    if windows * t * vocab * 4 > LOGITS_BYTES:
        sampled = min(windows * (folds - 1) / folds, LOGITS_BYTES // (t * vocab * 4))
        again = k + k * folds * max(1, sampled) / windows
    return windows * t * c.readout * (k + fitted * folds * evals + again)


def model_flops(params: Params, c: Cost, t: int, k: int, runs: int, policies: bool,
                recalibrate: bool = False, vocab: int = 0) -> dict[str, float]:
    """The forward FLOPs of the per-model measuring stages (measuring_flops' extract,
    diagnose, convergence and, where `policies`, policies; where `recalibrate`,
    recalibrate) of `runs` runs of a model of cost c, windows of t tokens, depth k and
    `vocab` ids: a cell's, or an outside model's (one run)."""
    full = c.prelude + k * (c.loop + c.readout)  # a uniform pass to K, reading every loop
    d, cv = params.diagnose, params.convergence
    depth = max(d.sweep_depth, k)
    conv = cv.depth_factor * k
    out = {
        "extract": runs * params.extract.val_sequences * t * (c.prelude + k * c.loop),
        "diagnose": runs * d.val_sequences * t * (c.prelude + depth * (c.loop + c.readout)
                                                  + 4 * k * c.readout + CLAMP_PASSES * full),
        "convergence": runs * 3 * cv.windows * t * (c.prelude + conv * (c.loop + c.readout)),
    }
    if recalibrate:
        out["recalibrate"] = runs * recalibrate_flops(params, c, t, k, vocab)
    if policies:
        grid = sum(c.prelude + k * c.loop + c.readout
                   + (k - 1) * c.readout * KNOWN[rule].needs_logits
                   for rule, _ in settings(params.policies.grids))
        out["policies"] = runs * cv.windows * t * (full + 2 * (full + grid))
    return {stage: float(v) for stage, v in out.items()}
