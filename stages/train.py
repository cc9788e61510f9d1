"""Stage train@<cell>: train one cell, once per seed.

    python stages/train.py --config configs/<cell>.json --prepared prepared
        --model models/<cell>/seed{seed}.pt --resume checkpoints/<cell>/seed{seed}/last.pt
        --live dvclive/<cell> --metrics metrics/train/<cell>.json
        --timings metrics/train_timings/<cell>.json

Every path comes from dvc.yaml's cmd (tests/test_layout.py checks them against
loopscope.base.paths), so this script and the code it runs hold no layout: training
depends on what sets the weights alone (loopscope.weights), and editing where a report
goes, an error message elsewhere or a memory estimate retrains nothing. The checks
before compute is spent (memory, disk) run in the configure stage, before any training.

Logs go to DVCLive (--live, each run's metrics under the model file's name, seed<N>);
--metrics summarizes the runs, and --timings holds their wall times, apart, so the same
params give byte-identical model files and metrics (and nothing downstream of a
retrained cell reruns when its weights did not change). While a run trains, a resume
checkpoint is kept at --resume. It is not a DVC output (DVC deletes outputs before
rerunning a stage), so after a kill `dvc repro` continues from it; it is deleted once
the run's outputs are in place.

With train.processes > 1 the stage starts itself again under torchrun (one node, that
many processes, DDP); across nodes, start it with torchrun yourself (docs/scaling.md).
Only rank 0 writes logs, checkpoints and metrics.
"""

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import mean
from typing import Any

import torch
import torch.distributed as dist
from dvclive import Live

from loopscope.base.files import write_json
from loopscope.weights import compute
from loopscope.weights.checkpoint import discard_resume, save_model
from loopscope.weights.config import CellConfig, load_cell
from loopscope.weights.data import check_context, load_meta, load_tokens
from loopscope.weights.side_by_side import train_side_by_side
from loopscope.weights.train import init_distributed, log_row, train_cell, world


class RunLog:
    """A cell's DVCLive as one run sees it: every metric filed under the run's tag, so
    the seeds of a cell share one log (dvclive/<cell>/plots/metrics/seed42/train/loss)."""

    def __init__(self, live: Live, tag: str) -> None:
        self.live, self.tag = live, tag

    @property
    def step(self) -> int:
        return self.live.step

    @step.setter
    def step(self, value: int) -> None:
        self.live.step = value

    def log_metric(self, name: str, value: float) -> None:
        self.live.log_metric(f"{self.tag}/{name}", value)

    def next_step(self) -> None:
        self.live.next_step()


def arguments(argv: list[str]) -> argparse.Namespace:
    """The files the stage reads and writes; {seed} in --model and --resume is a run's
    seed."""
    parser = argparse.ArgumentParser(description="train one cell, once per seed")
    for name in ("config", "prepared", "model", "resume", "live", "metrics", "timings"):
        parser.add_argument(f"--{name}", required=True)
    return parser.parse_args(argv)


def sequential(cell: CellConfig, prepared: Path, args: argparse.Namespace, live: Any,
               rank: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each seed of the cell in turn, in this process, logging live; rank 0 saves each
    run's model file (its summary without the timings and the logged rows)."""
    tokens = torch.from_numpy(load_tokens(prepared, "train"))
    for seed in cell.seeds:
        model_file = Path(args.model.format(seed=seed))
        resume = Path(args.resume.format(seed=seed))
        run_cell = cell.for_seed(seed)
        model, summary = train_cell(run_cell, tokens,
                                    live and RunLog(live, model_file.stem), resume)
        if rank == 0:
            save_model(model_file, model, run_cell, {"summary": {
                k: v for k, v in summary.items() if k not in ("timings", "history")}})
            discard_resume(resume)
        yield seed, summary


def main(argv: list[str]) -> None:
    args = arguments(argv)
    cell = load_cell(args.config)  # configure validated params.yaml and checked room
    prepared = Path(args.prepared)
    check_context(load_meta(prepared), cell.model.context)  # before any step
    compute.resolve(cell.train)  # a missing GPU fails here, before torchrun starts
    if cell.train.processes > 1 and "LOCAL_RANK" not in os.environ:
        stage = os.environ.get("LOOPSCOPE_STAGE")  # the stage runner's, to run each rank
        script = ["-m", "loopscope.stage", stage, __file__] if stage else [__file__]
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={cell.train.processes}", *script, *argv]
        print(f"train {cell.cell}: starting {cell.train.processes} processes (torchrun)",
              flush=True)
        os.execv(sys.executable, command)
    init_distributed(cell.train)
    compute.tune_heap("train")
    rank = world()[0]
    runs, timings = {}, {}
    live_log = (Live(dir=args.live, dvcyaml=None, save_dvc_exp=False)
                if rank == 0 else contextlib.nullcontext())
    start = time.perf_counter()
    with live_log as live:
        if cell.runs_at_once > 1:  # each run in its own process, logs replayed after
            done = train_side_by_side(cell, prepared, args.model, args.resume)
        else:
            done = dict(sequential(cell, prepared, args, live, rank))
        for seed, summary in done.items():
            tag = Path(args.model.format(seed=seed)).stem
            timings[tag] = summary.pop("timings")  # not in the model file
            history = summary.pop("history")
            if cell.runs_at_once > 1 and live is not None:
                for row in history:
                    log_row(RunLog(live, tag), row)
            runs[tag] = {k: v for k, v in summary.items() if k != "config"}
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    if rank != 0:
        return
    write_json(args.metrics, {
        "final_loss": mean(r["final_loss"] for r in runs.values()),
        "params": next(iter(runs.values()))["params"],
        "seeds": len(runs),
        "runs": runs,
    })
    write_json(args.timings, {  # wall: the runs side by side counted once
        "wall_seconds": round(time.perf_counter() - start, 2),
        "train_seconds": round(sum(t["train_seconds"] for t in timings.values()), 2),
        "tokens_per_second": round(mean(t["tokens_per_second"] for t in timings.values()), 1),
        "runs": timings,
    })


if __name__ == "__main__":
    main(sys.argv[1:])
