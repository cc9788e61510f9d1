"""Stage extract@<cell>: save H_0..H_K of a fixed validation slice for every trained
run of the cell to extracts/<cell>/seed<N>/ (format: loopscope.diagnostics.Extract)."""

import sys

from loopscope import memory, paths
from loopscope.diagnostics import write_extract
from loopscope.params import load_params
from loopscope.runs import trained_runs
from loopscope.stage import run


def main() -> None:
    name = sys.argv[1]
    params = load_params()
    for r in trained_runs(name, params.extract.val_sequences, "extract.val_sequences"):
        out = paths.extract_dir(name, r.tag)
        memory.check_forward(r.cell, r.compute, params.extract.batch_size,
                             "extract.batch_size", "extract", reads=False,
                             n_params=r.model.num_params())
        ext = write_extract(r.model, r.x, r.y, params.extract.batch_size, out, name, r.h0)
        print(f"extract {name} {r.tag}: {ext.meta['tokens']:,} tokens x "
              f"{ext.meta['loops'] + 1} states -> {out}/")


if __name__ == "__main__":
    run(main, stage=f"extract@{sys.argv[1]}")
