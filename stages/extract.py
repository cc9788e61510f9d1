"""Stage extract@<cell>: save H_0..H_K of a fixed validation slice (format: see
loopscope.diagnostics.Extract) to extracts/<cell>/."""

import sys
from pathlib import Path

from loopscope.config import load_params
from loopscope.diagnostics import write_extract
from loopscope.stage import run, trained_cell


def main() -> None:
    name = sys.argv[1]
    params = load_params()
    model, cell, x, y = trained_cell(name, params.extract.val_sequences)
    ext = write_extract(model, x, y, params.extract.batch_size, Path("extracts") / name, name)
    print(f"extract {name}: {ext.meta['tokens']:,} tokens x {ext.meta['loops'] + 1} states "
          f"-> extracts/{name}/")


if __name__ == "__main__":
    run(main)
