"""Stage diagnose@<cell>: one depth sweep per trained run, to diagnose.sweep_depth loops, on
diagnose.val_sequences windows spread over the whole validation split: perplexity at
each depth through each loop's own readout, norm statistics, radial gradient fraction
(per token and per batch, beside RMSNorm's eps floor), and Lemma 2's angular step times
scale per loop (tokens/s: the throughput stage, which times every cell in one process).
Then, on the same windows and models, the recurrent scale clamp in the reference's two
modes (freeze_loop1: every H_k rescaled to its loop-1 magnitude, direction kept;
remove_radial: each loop's update loses its component along the previous state): the
change in CE per loop through each loop's own readout, token by token, against the
unclamped CE of the sweep. The clamp reads the same params, models and windows, so it
runs in this process rather than paying a second start-up and model load per cell.

Writes metrics/diagnose/<cell>.json and, for the intervals the claims need,
tables/diagnose/<cell>.parquet (one row per token and seed, with its resampling unit:
see loopscope.measure.per_loop.sweep.Measured and loopscope.stats.units) and
tables/sweep/<cell>.parquet (per seed and unit, sums over its tokens). With several seeds, every
metric pools the cell's runs; `ppl_at_depth_sd` / `norm_mean_sd` give the spread, and the claims'
intervals resample the seeds too. metrics/clamp/<cell>.json: per mode, delta_ce per loop
(pooled over seeds) and at the last loop its 95% interval from resampling units and
seeds (diagnose.bootstrap), and each seed's alone; tables/clamp/<cell>.parquet: the change
at the last loop per token and seed, which the claims resample with the rest.

For an outside model (stage outside_diagnose@<name>, through stages/outside.py): the
same for its run, in its own precision; Lemma 1's float64 copy holds its readout alone
(loopscope.measure.per_loop.sweep.float64_reader), which the memory check counts.
"""

import sys

import torch

from loopscope.measure.params import load
from loopscope.measure.per_loop.clamp import (
    Clamped,
    clamp_headline,
    clamp_metrics,
    clamp_run,
    clamp_table,
    unclamped_ce,
)
from loopscope.measure.per_loop.sweep import Measured, diagnose_headline, measure, summarize_runs
from loopscope.measure.runs import Run, batch_for, runs_of
from loopscope.measure.save import write_outputs
from loopscope.preflight import memory
from loopscope.stats.units import Units

READS = ("diagnose.val_sequences", "diagnose.batch_size", "diagnose.sweep_depth",
         "diagnose.bootstrap")


def main(name: str) -> None:
    params = load(READS).diagnose
    batch = batch_for(name, params.batch_size)
    runs: list[Measured] = []
    trained: list[Run] = []
    for r in runs_of(name, params.val_sequences):
        trained.append(r)
        memory.check_forward(r.shape, r.compute, batch, "diagnose.batch_size", "diagnose",
                             reads=False, float64_readout=True, act_bytes=r.act_bytes)
        m = measure(r.model, r.x, r.y, r.docs, batch, params.sweep_depth, r.h0)
        runs.append(m.of_run(r.seed, Units(r.docs, r.unit)))
    metrics, pooled = summarize_runs(runs)
    write_outputs("diagnose", name, metrics, {"diagnose": pooled.tokens, "sweep": pooled.sweep})
    print(f"diagnose {name}: {diagnose_headline(metrics)}")

    clamped: list[Clamped] = []
    for r in trained:
        seed, docs = r.seed, r.token_docs()
        torch.manual_seed(seed)  # as trained_runs seeds each run before its measurement
        unclamped = unclamped_ce(pooled.tokens, seed, docs, r.model.loops, name)
        clamped.append(clamp_run(r.model, r.x, r.y, r.h0, batch, unclamped, seed, docs))
    clamp = clamp_metrics(clamped, params.bootstrap)
    write_outputs("clamp", name, clamp, {"clamp": clamp_table(clamped)})
    print(f"clamp {name}: {clamp_headline(clamp)}")


if __name__ == "__main__":
    main(sys.argv[1])
