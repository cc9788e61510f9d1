"""Stage clamp@<cell>: rescale every H_k to its loop-1 magnitude (direction kept) and
measure the change in cross-entropy per loop (mean over the cell's seeds), against the
unclamped cross-entropy diagnose@<cell> measured on the same windows."""

import sys

from loopscope import memory, paths
from loopscope.diagnostics import clamp_effect
from loopscope.errors import run, write_json
from loopscope.params import load_params
from loopscope.plots import read_metrics
from loopscope.runs import mean_over_runs, trained_runs


def main() -> None:
    name = sys.argv[1]
    params = load_params()
    unclamped = read_metrics("diagnose", name)["ce_readout"]  # mean over the seeds
    ce_readout = [unclamped[k] for k in sorted(unclamped, key=lambda k: int(k[1:]))]
    results = []
    for r in trained_runs(name, params.diagnose.val_sequences):
        memory.check_forward(r.cell, r.compute, params.diagnose.batch_size,
                             "diagnose.batch_size", "clamp")
        with r.compute.autocast():
            results.append(clamp_effect(r.model, r.x, r.y, params.diagnose.batch_size,
                                        ce_readout, r.h0))
    result = mean_over_runs(results)
    write_json(paths.metrics_file("clamp", name), result)
    last = max(result["ce_readout"], key=lambda k: int(k[1:]))
    print(f"clamp {name}: final-loop CE {result['ce_readout'][last]:.4f} -> "
          f"{result['ce_readout_clamped'][last]:.4f} (delta {result['delta_ce'][last]:+.4f})")


if __name__ == "__main__":
    run(main)
