"""Stage train@<cell>: train one cell and save models/<cell>.pt; logs go to DVCLive."""

import sys
from pathlib import Path

import torch

from dvclive import Live
from loopscope.config import load_cell, load_params
from loopscope.data import load_tokens
from loopscope.stage import run, write_json
from loopscope.train import save_checkpoint, train_cell


def main() -> None:
    name = sys.argv[1]
    load_params()  # fail on a bad params.yaml before anything else
    cell = load_cell(Path("configs") / f"{name}.json")
    tokens = torch.from_numpy(load_tokens(Path("prepared"), "train"))
    with Live(dir=f"dvclive/{name}", dvcyaml=None, save_dvc_exp=False) as live:
        model, summary = train_cell(cell, tokens, live)
    save_checkpoint(Path("models") / f"{name}.pt", model, cell, {"summary": summary})
    write_json(Path("metrics/train") / f"{name}.json",
               {k: v for k, v in summary.items() if k != "config"})


if __name__ == "__main__":
    run(main)
