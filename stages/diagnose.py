"""Stage diagnose@<cell>: one depth sweep per trained run, to diagnose.loops loops, on
diagnose.val_sequences windows spread over the whole validation split: perplexity at
each depth through each loop's own readout, norm statistics, radial gradient fraction
(per token and per batch, beside RMSNorm's eps floor), and Lemma 2's angular step times
scale per loop (tokens/s: the throughput stage, which times every cell in one process).

Writes metrics/diagnose/<cell>.json and, for the intervals the claims need,
tables/diagnose/<cell>.parquet (one row per token and seed, with its resampling unit:
see loopscope.diagnostics.Measured and loopscope.units) and tables/sweep/<cell>.parquet
(per seed and unit, sums over its tokens). With several seeds, every metric pools the
cell's runs; `ppl_at_depth_sd` / `norm_mean_sd` give the spread, and the claims'
intervals resample the seeds too.
"""

import sys

from loopscope import memory
from loopscope.diagnostics import Measured, diagnose_headline, measure, summarize_runs
from loopscope.outputs import write_outputs
from loopscope.params import load_params
from loopscope.runs import trained_runs
from loopscope.stage import run
from loopscope.units import Units


def main() -> None:
    name = sys.argv[1]
    params = load_params().diagnose
    runs: list[Measured] = []
    for r in trained_runs(name, params.val_sequences):
        memory.check_forward(r.cell, r.compute, params.batch_size, "diagnose.batch_size",
                             "diagnose", reads=False)
        m = measure(r.model, r.x, r.y, r.docs, params.batch_size, params.loops, r.h0)
        runs.append(m.of_run(r.cell.train.seed, Units(r.docs, r.unit)))
    metrics, pooled = summarize_runs(runs)
    write_outputs("diagnose", name, metrics, {"diagnose": pooled.tokens, "sweep": pooled.sweep})
    print(f"diagnose {name}: {diagnose_headline(metrics)}")


if __name__ == "__main__":
    run(main, stage=f"diagnose@{sys.argv[1]}")
