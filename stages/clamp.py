"""Stage clamp@<cell>: the recurrent scale clamp in the reference's two modes
(freeze_loop1: every H_k rescaled to its loop-1 magnitude, direction kept;
remove_radial: each loop's update loses its component along the previous state), and
the change in cross-entropy per loop through each loop's own readout, token by token
against the unclamped CE that diagnose@<cell> measured on the same windows and seeds.

metrics/clamp/<cell>.json: per mode, delta_ce per loop (pooled over seeds) and at the
last loop its 95% interval from resampling documents (diagnose.bootstrap).
"""

import sys

import pandas as pd

from loopscope import memory, paths
from loopscope.diagnostics import Clamped, clamp_headline, clamp_metrics, clamp_run, unclamped_ce
from loopscope.errors import require_output
from loopscope.outputs import write_outputs
from loopscope.params import load_params
from loopscope.runs import trained_runs
from loopscope.stage import run


def main() -> None:
    name = sys.argv[1]
    params = load_params().diagnose
    tokens = pd.read_parquet(require_output(paths.table_file("diagnose", name),
                                            f"diagnose@{name}"))
    runs: list[Clamped] = []
    for r in trained_runs(name, params.val_sequences):
        memory.check_forward(r.cell, r.compute, params.batch_size, "diagnose.batch_size",
                             "clamp", reads=False)
        seed, docs = r.cell.train.seed, r.token_docs()
        unclamped = unclamped_ce(tokens, seed, docs, r.cell.model.loops, name)
        runs.append(clamp_run(r.model, r.x, r.y, r.h0, params.batch_size, unclamped, seed,
                              docs))
    metrics = clamp_metrics(runs, params.bootstrap)
    write_outputs("clamp", name, metrics)
    print(f"clamp {name}: {clamp_headline(metrics)}")


if __name__ == "__main__":
    run(main, stage=f"clamp@{sys.argv[1]}")
