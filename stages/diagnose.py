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
from statistics import pstdev

import pandas as pd

from loopscope import memory, paths
from loopscope.diagnostics import Measured, measure, summarize
from loopscope.outputs import atomic_output, write_json
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
        m.tokens.insert(0, "seed", r.cell.train.seed)
        m.sweep.insert(0, "seed", r.cell.train.seed)
        runs.append(m)
    batch = [sum(v) / len(runs) for v in zip(*(m.radial_batch for m in runs), strict=True)]
    pooled = Measured(pd.concat([m.tokens for m in runs], ignore_index=True),
                      pd.concat([m.sweep for m in runs], ignore_index=True), batch)
    metrics = summarize(pooled)
    each = [summarize(m) for m in runs]
    for key in ("ppl_at_depth", "norm_mean"):
        metrics[f"{key}_sd"] = {k: pstdev(e[key][k] for e in each) for k in metrics[key]}
    metrics["seeds"] = len(runs)
    metrics["val_tokens"] = int(r.y.numel())
    metrics.update(Units(r.docs, r.unit).describe())
    for kind, table in (("diagnose", pooled.tokens), ("sweep", pooled.sweep)):
        with atomic_output(paths.table_file(kind, name)) as tmp:
            table.to_parquet(tmp, index=False)
    write_json(paths.metrics_file("diagnose", name), metrics)
    last = f"k{r.cell.model.loops}"
    lemma2 = metrics["lemma2"]
    print(f"diagnose {name}: ppl at K={r.cell.model.loops} {metrics['ppl_at_depth'][last]:.1f}, "
          f"final-loop mean norm {metrics['norm_mean'][last]:.1f}, radial fraction per token "
          f"{metrics['radial_fraction_token'][last]:.1e} (eps floor "
          f"{metrics['radial_floor'][last]:.1e}); over {lemma2['loops']} loops the scale grows "
          f"x{lemma2['scale_growth']:.2f}, step-vs-scale slope {lemma2['slope']:.2f} "
          f"({len(runs)} seed(s), {metrics['units']} units: {metrics['unit']})")


if __name__ == "__main__":
    run(main, stage=f"diagnose@{sys.argv[1]}")
