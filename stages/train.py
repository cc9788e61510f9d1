"""Stage train@<cell>: train one cell, once per seed, into models/<cell>/seed<N>.pt.

Logs go to DVCLive (dvclive/<cell>/seed<N>/); metrics/train/<cell>.json summarizes the
runs. While a run trains, a resume checkpoint is kept in
checkpoints/<cell>/seed<N>/last.pt. It is not a DVC output (DVC deletes outputs before
rerunning a stage), so after a kill `dvc repro` continues from it; it is deleted once
the run's outputs are in place.
"""

import sys
from pathlib import Path
from statistics import mean

import torch
from dvclive import Live

from loopscope.config import load_cell, load_params
from loopscope.data import check_context, load_meta, load_tokens
from loopscope.stage import run, seed_tag, write_json
from loopscope.train import discard_resume, save_checkpoint, train_cell


def main() -> None:
    name = sys.argv[1]
    load_params()  # fail on a bad params.yaml before anything else
    cell = load_cell(Path("configs") / f"{name}.json")
    prepared = Path("prepared")
    check_context(load_meta(prepared), cell.model.context)  # before any step, not in diagnose
    tokens = torch.from_numpy(load_tokens(prepared, "train"))
    runs = {}
    for seed in cell.seeds:
        tag = seed_tag(seed)
        run_cell = cell.for_seed(seed)
        resume = Path("checkpoints") / name / tag / "last.pt"
        with Live(dir=f"dvclive/{name}/{tag}", dvcyaml=None, save_dvc_exp=False) as live:
            model, summary = train_cell(run_cell, tokens, live, resume)
        save_checkpoint(Path("models") / name / f"{tag}.pt", model, run_cell,
                        {"summary": summary})
        runs[tag] = {k: v for k, v in summary.items() if k != "config"}
        discard_resume(resume)
    write_json(Path("metrics/train") / f"{name}.json", {
        "final_loss": mean(r["final_loss"] for r in runs.values()),
        "train_seconds": round(sum(r["train_seconds"] for r in runs.values()), 2),
        "tokens_per_second": round(mean(r["tokens_per_second"] for r in runs.values()), 1),
        "params": next(iter(runs.values()))["params"],
        "seeds": len(runs),
        "runs": runs,
    })


if __name__ == "__main__":
    run(main)
