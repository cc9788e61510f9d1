"""Stage clamp@<cell>: the recurrent scale clamp in the reference's two modes
(freeze_loop1: every H_k rescaled to its loop-1 magnitude, direction kept;
remove_radial: each loop's update loses its component along the previous state), and
the change in cross-entropy per loop through each loop's own readout, token by token
against the unclamped CE that diagnose@<cell> measured on the same windows and seeds.

metrics/clamp/<cell>.json: per mode, delta_ce per loop (pooled over seeds) and at the
last loop its 95% interval from resampling documents (diagnose.bootstrap).
"""

import sys

import numpy as np
import pandas as pd

from loopscope import memory, paths
from loopscope.diagnostics import CLAMP_MODES, clamped_ce
from loopscope.errors import DataError, require_output
from loopscope.outputs import write_json
from loopscope.params import load_params
from loopscope.runs import trained_runs
from loopscope.stage import run
from loopscope.stats import bootstrap_mean


def main() -> None:
    name = sys.argv[1]
    params = load_params().diagnose
    tokens = pd.read_parquet(require_output(paths.table_file("diagnose", name),
                                            f"diagnose@{name}"))
    deltas: dict[str, list[np.ndarray]] = {mode: [] for mode in CLAMP_MODES}
    docs, seeds = [], []
    for r in trained_runs(name, params.val_sequences):
        memory.check_forward(r.cell, r.compute, params.batch_size, "diagnose.batch_size",
                             "clamp", reads=False)
        mine = tokens[tokens["seed"] == r.cell.train.seed]
        loops = r.cell.model.loops
        if len(mine) != r.y.numel() or not np.array_equal(mine["doc"], r.token_docs()):
            raise DataError(f"{paths.table_file('diagnose', name)}: its seed "
                            f"{r.cell.train.seed} tokens are not this stage's windows; rerun "
                            f"`dvc repro diagnose@{name}`.")
        unclamped = np.stack([mine[f"ce_{k}"].to_numpy() for k in range(1, loops + 1)])
        for mode in CLAMP_MODES:
            deltas[mode].append(clamped_ce(r.model, r.x, r.y, params.batch_size, mode,
                                           r.h0) - unclamped)
        docs.append(r.token_docs())
        seeds.append(np.full(r.y.numel(), r.cell.train.seed))
    doc, seed = np.concatenate(docs), np.concatenate(seeds)
    result = {}
    for mode, parts in deltas.items():
        delta = np.concatenate(parts, axis=1)
        result[mode] = {"delta_ce": {f"k{k}": float(v) for k, v in
                                     enumerate(delta.mean(axis=1), 1)},
                        "delta_ce_last": bootstrap_mean(delta[-1], doc, params.bootstrap,
                                                        runs=seed).to_dict()}
    write_json(paths.metrics_file("clamp", name), result)
    print(f"clamp {name}: final-loop delta CE " + ", ".join(
        f"{mode} {result[mode]['delta_ce'][f'k{loops}']:+.4f}" for mode in CLAMP_MODES))


if __name__ == "__main__":
    run(main, stage=f"clamp@{sys.argv[1]}")
