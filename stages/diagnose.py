"""Stage diagnose@<cell>: norm statistics, radial gradient fraction and update
decomposition per loop; perplexity and tokens/s at depth K = 1..K_train."""

import sys
from pathlib import Path

from loopscope.config import load_params
from loopscope.diagnostics import diagnose, load_extract, throughput
from loopscope.stage import run, trained_cell, write_json


def main() -> None:
    name = sys.argv[1]
    params = load_params()
    model, cell, x, y = trained_cell(name, params.diagnose.val_sequences)
    ext = load_extract(Path("extracts") / name)
    metrics = diagnose(model, x, y, params.diagnose.batch_size, ext)
    metrics["val_tokens"] = int(y.numel())
    write_json(Path("metrics/diagnose") / f"{name}.json", metrics)
    # Timings vary from run to run: kept apart so the metrics above stay reproducible.
    speed = {f"k{k}": throughput(model, x, params.diagnose.batch_size, k,
                                 params.diagnose.timing_repeats)
             for k in range(1, cell.model.loops + 1)}
    write_json(Path("metrics/throughput") / f"{name}.json", {"tokens_per_s": speed})
    last = f"k{cell.model.loops}"
    print(f"diagnose {name}: ppl at K={cell.model.loops} {metrics['ppl'][last]:.1f}, "
          f"final-loop mean norm {metrics['norm_mean'][last]:.1f}, radial fraction "
          f"{metrics['radial_fraction'][last]:.1e}")


if __name__ == "__main__":
    run(main)
