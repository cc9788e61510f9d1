"""Stage extract@<cell>: save H_0..H_K of a fixed validation slice for every trained
run of the cell to extracts/<cell>/seed<N>/ (format:
loopscope.measure.per_loop.extract.Extract). For an outside model (stage
outside_extract@<name>, through stages/outside.py): the same for its run."""

import sys

from loopscope.base import paths
from loopscope.measure.params import load
from loopscope.measure.per_loop.extract import write_extract
from loopscope.measure.runs import batch_for, runs_of
from loopscope.preflight import memory

READS = ("extract.val_sequences", "extract.batch_size")


def main(name: str) -> None:
    params = load(READS).extract
    batch = batch_for(name, params.batch_size)
    for r in runs_of(name, params.val_sequences, "extract.val_sequences"):
        out = paths.extract_dir(name, r.tag)
        memory.check_forward(r.shape, r.compute, batch, "extract.batch_size", "extract",
                             reads=False, act_bytes=r.act_bytes)
        ext = write_extract(r.model, r.x, r.y, batch, out, name, r.h0)
        print(f"extract {name} {r.tag}: {ext.meta['tokens']:,} tokens x "
              f"{ext.meta['loops'] + 1} states -> {out}/")


if __name__ == "__main__":
    main(sys.argv[1])
