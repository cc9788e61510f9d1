"""Stage diagnose@<cell>: norm statistics, radial gradient fraction and update
decomposition per loop; perplexity at depth K = 1..K_train (tokens/s: the throughput
stage, which times every cell in one process).

With several seeds, every metric is the mean over the cell's runs; `seeds` says how
many, and `ppl_at_depth_sd` / `norm_mean_sd` give the spread across them.
"""

import sys
from statistics import pstdev

from loopscope import memory, paths
from loopscope.diagnostics import diagnose, load_extract
from loopscope.errors import run, write_json
from loopscope.params import load_params
from loopscope.runs import mean_over_runs, trained_runs


def main() -> None:
    name = sys.argv[1]
    params = load_params()
    batch = params.diagnose.batch_size
    runs = []
    for r in trained_runs(name, params.diagnose.val_sequences):
        memory.check_forward(r.cell, r.compute, batch, "diagnose.batch_size", "diagnose")
        ext = load_extract(paths.extract_dir(name, r.tag))
        with r.compute.autocast():
            runs.append(diagnose(r.model, r.x, r.y, batch, ext, r.h0))
    metrics = mean_over_runs(runs)
    for key in ("ppl_at_depth", "norm_mean"):
        metrics[f"{key}_sd"] = {k: pstdev(r[key][k] for r in runs) for k in runs[0][key]}
    metrics["seeds"] = len(runs)
    metrics["val_tokens"] = int(r.y.numel())
    write_json(paths.metrics_file("diagnose", name), metrics)
    last = f"k{r.cell.model.loops}"
    print(f"diagnose {name}: ppl at K={r.cell.model.loops} {metrics['ppl_at_depth'][last]:.1f}, "
          f"final-loop mean norm {metrics['norm_mean'][last]:.1f}, radial fraction "
          f"{metrics['radial_fraction'][last]:.1e} ({len(runs)} seed(s))")


if __name__ == "__main__":
    run(main)
