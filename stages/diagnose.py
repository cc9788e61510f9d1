"""Stage diagnose@<cell>: hidden norm per loop and perplexity at depth K=1..K_train."""

import sys
from pathlib import Path

import torch

from loopscope.config import load_params
from loopscope.data import load_tokens, val_windows
from loopscope.diagnostics import diagnose
from loopscope.stage import run, write_json
from loopscope.train import load_checkpoint


def main() -> None:
    name = sys.argv[1]
    params = load_params()
    model, cell = load_checkpoint(Path("models") / f"{name}.pt")
    torch.manual_seed(cell.train.seed)  # a noise initial state draws the same noise
    torch.set_num_threads(cell.train.threads)
    tokens = torch.from_numpy(load_tokens(Path("prepared"), "val"))
    x, y = val_windows(tokens, cell.model.context, params.diagnose.val_sequences)
    metrics = diagnose(model, x, y, params.diagnose.batch_size)
    metrics["val_tokens"] = int(y.numel())
    write_json(Path("metrics/diagnose") / f"{name}.json", metrics)
    last = f"k{cell.model.loops}"
    print(f"diagnose {name}: ppl at K={cell.model.loops} {metrics['ppl'][last]:.1f}, "
          f"final-loop mean norm {metrics['norm_mean'][last]:.1f}")


if __name__ == "__main__":
    run(main)
