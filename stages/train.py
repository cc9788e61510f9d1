"""Stage train@<cell>: train one cell and save models/<cell>.pt; logs go to DVCLive.

A resume checkpoint is kept in checkpoints/<cell>/last.pt while training runs. It is not
a DVC output (DVC deletes outputs before rerunning a stage), so after a kill `dvc repro`
continues from it; it is deleted once the outputs are in place.
"""

import sys
from pathlib import Path

import torch
from dvclive import Live

from loopscope.config import load_cell, load_params
from loopscope.data import check_context, load_meta, load_tokens
from loopscope.stage import run, write_json
from loopscope.train import discard_resume, save_checkpoint, train_cell


def main() -> None:
    name = sys.argv[1]
    load_params()  # fail on a bad params.yaml before anything else
    cell = load_cell(Path("configs") / f"{name}.json")
    prepared = Path("prepared")
    check_context(load_meta(prepared), cell.model.context)  # before any step, not in diagnose
    tokens = torch.from_numpy(load_tokens(prepared, "train"))
    resume = Path("checkpoints") / name / "last.pt"
    with Live(dir=f"dvclive/{name}", dvcyaml=None, save_dvc_exp=False) as live:
        model, summary = train_cell(cell, tokens, live, resume)
    save_checkpoint(Path("models") / f"{name}.pt", model, cell, {"summary": summary})
    write_json(Path("metrics/train") / f"{name}.json",
               {k: v for k, v in summary.items() if k != "config"})
    discard_resume(resume)


if __name__ == "__main__":
    run(main)
