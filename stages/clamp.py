"""Stage clamp@<cell>: rescale every H_k to its loop-1 magnitude (direction kept) and
measure the change in cross-entropy per loop (mean over the cell's seeds)."""

import sys
from pathlib import Path

from loopscope.config import load_params
from loopscope.diagnostics import clamp_effect
from loopscope.stage import mean_over_runs, run, trained_runs, write_json


def main() -> None:
    name = sys.argv[1]
    params = load_params()
    results = [clamp_effect(model, x, y, params.diagnose.batch_size)
               for _, model, _, x, y in trained_runs(name, params.diagnose.val_sequences)]
    result = mean_over_runs(results)
    write_json(Path("metrics/clamp") / f"{name}.json", result)
    last = max(result["ce"], key=lambda k: int(k[1:]))
    print(f"clamp {name}: final-loop CE {result['ce'][last]:.4f} -> "
          f"{result['ce_clamped'][last]:.4f} (delta {result['delta_ce'][last]:+.4f})")


if __name__ == "__main__":
    run(main)
