"""Stage clamp@<cell>: rescale every H_k to its loop-1 magnitude (direction kept) and
measure the change in cross-entropy per loop."""

import sys
from pathlib import Path

from loopscope.config import load_params
from loopscope.diagnostics import clamp_effect
from loopscope.stage import run, trained_cell, write_json


def main() -> None:
    name = sys.argv[1]
    params = load_params()
    model, cell, x, y = trained_cell(name, params.diagnose.val_sequences)
    result = clamp_effect(model, x, y, params.diagnose.batch_size)
    write_json(Path("metrics/clamp") / f"{name}.json", result)
    last = f"k{cell.model.loops}"
    print(f"clamp {name}: final-loop CE {result['ce'][last]:.4f} -> "
          f"{result['ce_clamped'][last]:.4f} (delta {result['delta_ce'][last]:+.4f})")


if __name__ == "__main__":
    run(main)
