"""Stage diagnose@<cell>: norm statistics, radial gradient fraction and update
decomposition per loop; perplexity and tokens/s at depth K = 1..K_train.

With several seeds, every metric is the mean over the cell's runs; `seeds` says how
many, and `ppl_sd` / `norm_mean_sd` give the spread across them.
"""

import sys
from pathlib import Path
from statistics import pstdev

from loopscope.config import load_params
from loopscope.diagnostics import diagnose, load_extract, throughput
from loopscope.stage import mean_over_runs, run, trained_runs, write_json


def main() -> None:
    name = sys.argv[1]
    params = load_params()
    runs, speeds = [], []
    for tag, model, cell, x, y in trained_runs(name, params.diagnose.val_sequences):
        ext = load_extract(Path("extracts") / name / tag)
        runs.append(diagnose(model, x, y, params.diagnose.batch_size, ext))
        # Timings vary from run to run: kept apart so the metrics stay reproducible.
        speeds.append({f"k{k}": throughput(model, x, params.diagnose.batch_size, k,
                                           params.diagnose.timing_repeats)
                       for k in range(1, cell.model.loops + 1)})
    metrics = mean_over_runs(runs)
    for key in ("ppl", "norm_mean"):
        metrics[f"{key}_sd"] = {k: pstdev(r[key][k] for r in runs) for k in runs[0][key]}
    metrics["seeds"] = len(runs)
    metrics["val_tokens"] = int(y.numel())
    write_json(Path("metrics/diagnose") / f"{name}.json", metrics)
    write_json(Path("metrics/throughput") / f"{name}.json",
               {"tokens_per_s": mean_over_runs(speeds)})
    last = f"k{cell.model.loops}"
    print(f"diagnose {name}: ppl at K={cell.model.loops} {metrics['ppl'][last]:.1f}, "
          f"final-loop mean norm {metrics['norm_mean'][last]:.1f}, radial fraction "
          f"{metrics['radial_fraction'][last]:.1e} ({len(runs)} seed(s))")


if __name__ == "__main__":
    run(main)
