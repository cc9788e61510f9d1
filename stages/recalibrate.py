"""Stage recalibrate@<cell>: readout recalibration (loopscope.measure.per_loop.recalibrate)
of every trained run of the cell, on the states its extract saved (extracts/<cell>/, the
extract.val_sequences windows): at every loop 1 .. R the CE of the readout as trained,
with a fitted temperature, and with a fitted affine readout at the loops of
recalibrate.affine_at, each fit scored on folds of units it never saw; what each
recovers of the gap to depth R, with intervals over units and seeds.

Writes metrics/recalibrate/<cell>.json and tables/recalibrate/<cell>.parquet (a row per
seed, loop and token). For an outside model (stage outside_recalibrate@<name>, through
stages/outside.py): the same for its run.
"""

import sys

from loopscope.base import paths
from loopscope.base.errors import DataError
from loopscope.measure.per_loop.extract import load_extract
from loopscope.measure.per_loop.recalibrate import (
    cell_metrics,
    cell_table,
    headline,
    recalibrate_run,
)
from loopscope.measure.recalibrate_params import load
from loopscope.measure.runs import runs_of
from loopscope.measure.save import write_outputs
from loopscope.weights import compute

READS = ("extract.val_sequences", "recalibrate.folds", "recalibrate.affine_at",
         "recalibrate.ridge", "recalibrate.iterations", "recalibrate.bootstrap",
         "recalibrate.batch_size")


def main(name: str) -> None:
    params = load(READS)
    cfg = params.recalibrate
    runs = []
    for r in runs_of(name, params.extract.val_sequences, "extract.val_sequences"):
        # the fits allocate the same tensors at every iteration, as a training step does:
        # keep freed memory for the next (a measuring stage's heap gives it back, and the
        # page faults cost the fits 2.4x their time on 2 cores)
        compute.tune_heap("train")
        folder = paths.extract_dir(name, r.tag)
        ext = load_extract(folder)
        ids = ext.table["token_id"].to_numpy()[:ext.meta["tokens"]]
        if ext.meta["tokens"] != r.x.numel() or (ids != r.x.flatten().cpu().numpy()).any():
            raise DataError(f"{folder}/: its windows are not extract.val_sequences = "
                            f"{len(r.x)} windows of this split; rerun `dvc repro`.")
        runs.append(recalibrate_run(r.model, ext.states, r.y, r.docs, r.seed, cfg))
        print(f"recalibrate {name} {r.tag}: loops 1..{r.model.loops}")
    metrics = cell_metrics(runs, cfg, name)
    write_outputs("recalibrate", name, metrics, {"recalibrate": cell_table(runs)})
    print(f"recalibrate {name}: {headline(metrics)}")


if __name__ == "__main__":
    main(sys.argv[1])
