"""Stage train@<cell>: train one cell, once per seed, into models/<cell>/seed<N>.pt.

Logs go to DVCLive (dvclive/<cell>/, each run's metrics under seed<N>/);
metrics/train/<cell>.json summarizes the runs, and metrics/train_timings/<cell>.json
holds their wall times, apart, so the same params give byte-identical model files and
metrics (and nothing downstream of a retrained cell reruns when its weights did not
change). While a run trains, a resume checkpoint is kept in
checkpoints/<cell>/seed<N>/last.pt. It is not a DVC output (DVC deletes outputs before
rerunning a stage), so after a kill `dvc repro` continues from it; it is deleted once
the run's outputs are in place.

With train.processes > 1 the stage starts itself again under torchrun (one node, that
many processes, DDP); across nodes, start it with torchrun yourself (docs/scaling.md).
Only rank 0 writes logs, checkpoints and metrics.

Before the first step (and before torchrun starts) the stage refuses a run that will not
fit: memory against loopscope.memory's estimate, disk against the model files and the
resume checkpoint.
"""

import contextlib
import os
import sys
from statistics import mean

import torch
import torch.distributed as dist
from dvclive import Live

from loopscope import compute, memory, paths
from loopscope.checkpoint import discard_resume, model_file_bytes, resume_file_bytes, save_model
from loopscope.config import CellConfig, load_cell
from loopscope.data import check_context, load_meta, load_tokens
from loopscope.errors import require_disk
from loopscope.outputs import write_json
from loopscope.stage import run
from loopscope.train import init_distributed, train_cell, world


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


def check_disk(cell: CellConfig) -> None:
    """Room for what training writes: a model file per seed, and a resume checkpoint,
    twice (the previous one stays until the next is in place)."""
    n = memory.num_params(cell.model)
    require_disk({paths.model_dir(cell.cell): len(cell.seeds) * model_file_bytes(n),
                  paths.CHECKPOINTS / cell.cell: 2 * resume_file_bytes(n, cell.train.processes)},
                 "Free disk space (or train a smaller model: model.d_model, model.n_core), "
                 "then rerun `dvc repro`. Nothing was trained.")


def main() -> None:
    name = sys.argv[1]
    cell = load_cell(paths.config_file(name))  # configure validated params.yaml
    check_context(load_meta(paths.PREPARED), cell.model.context)  # before any step
    run_on = compute.resolve(cell.train)  # a missing GPU fails here, before torchrun starts
    memory.check_training(cell, run_on.device)  # and memory, and disk
    check_disk(cell)
    if cell.train.processes > 1 and "LOCAL_RANK" not in os.environ:
        args = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={cell.train.processes}", __file__, name]
        print(f"train {name}: starting {cell.train.processes} processes (torchrun)", flush=True)
        os.execv(sys.executable, args)
    init_distributed(cell.train)
    memory.tune_heap("train")
    rank = world()[0]
    tokens = torch.from_numpy(load_tokens(paths.PREPARED, "train"))
    runs, timings = {}, {}
    live_log = (Live(dir=str(paths.dvclive_dir(name)), dvcyaml=None, save_dvc_exp=False)
                if rank == 0 else contextlib.nullcontext())
    with live_log as live:
        for seed in cell.seeds:
            tag = paths.seed_tag(seed)
            run_cell = cell.for_seed(seed)
            resume = paths.resume_file(name, seed)
            model, summary = train_cell(run_cell, tokens, live and RunLog(live, tag), resume)
            timings[tag] = summary.pop("timings")  # not in the model file: a timing
            if rank == 0:
                save_model(paths.model_file(name, seed), model, run_cell, {"summary": summary})
                discard_resume(resume)
            runs[tag] = {k: v for k, v in summary.items() if k != "config"}
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    if rank != 0:
        return
    write_json(paths.metrics_file("train", name), {
        "final_loss": mean(r["final_loss"] for r in runs.values()),
        "params": next(iter(runs.values()))["params"],
        "seeds": len(runs),
        "runs": runs,
    })
    write_json(paths.metrics_file(paths.TRAIN_TIMINGS, name), {
        "train_seconds": round(sum(t["train_seconds"] for t in timings.values()), 2),
        "tokens_per_second": round(mean(t["tokens_per_second"] for t in timings.values()), 1),
        "runs": timings,
    })


if __name__ == "__main__":
    run(main, stage=f"train@{sys.argv[1]}")
