"""Stage extract@<cell>: save H_0..H_K of a fixed validation slice for every trained
run of the cell to extracts/<cell>/seed<N>/ (format: loopscope.diagnostics.Extract)."""

import sys
from pathlib import Path

from loopscope.config import load_params
from loopscope.diagnostics import write_extract
from loopscope.stage import run, trained_runs


def main() -> None:
    name = sys.argv[1]
    params = load_params()
    for tag, model, _, x, y in trained_runs(name, params.extract.val_sequences):
        ext = write_extract(model, x, y, params.extract.batch_size,
                            Path("extracts") / name / tag, name)
        print(f"extract {name} {tag}: {ext.meta['tokens']:,} tokens x "
              f"{ext.meta['loops'] + 1} states -> extracts/{name}/{tag}/")


if __name__ == "__main__":
    run(main)
