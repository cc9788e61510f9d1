"""Training one cell: loss placement, norm penalty, schedule, sampled depth, logging.

The run is resumable: every train.checkpoint_every steps the model, optimizer, batch
sampler, depth sampler and every process's RNG states go to a resume checkpoint
(loopscope.weights.checkpoint), and a rerun continues from it to the same weights, bit for bit
on the CPU, with one process or several.

A run that fails stops with nothing saved: a NaN or infinite loss (DivergenceError), or
a collapse (CollapseError): past half of the run, a final-loop CE still no better than
the training split's unigram entropy while the loss stays finite, which no NaN check
sees.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import record_function
from tqdm import tqdm

from loopscope.base.errors import CollapseError, DivergenceError, ParamsError
from loopscope.weights import compute
from loopscope.weights.checkpoint import load_resume, run_fingerprint, save_resume
from loopscope.weights.config import READS, CellConfig, TrainConfig
from loopscope.weights.data import Batches, steps_for_epochs
from loopscope.weights.depth import Fixed, LogNormal, sampler
from loopscope.weights.model import LoopedLM, LoopOutput, loop_ce

# A collapsed run: past half of its steps, at every one of the last COLLAPSE_PATIENCE
# logging steps, the final loop's CE is still no better (by COLLAPSE_MARGIN) than
# predicting the training split's unigram frequencies for every token: the entropy of
# that distribution, the best a model that maps every token onto one state can do. A
# lack of progress, not a state: healthy runs pass through a phase where every token's
# state points one way (they predict the unigram first). The default perloop_raw logged
# cosines of 0.99-0.9999 up to step 50, and paper A's reference init (N(0, 1)
# embeddings) keeps them above 0.99 all run long while its CE falls below the unigram
# entropy; a guard on the cosine stopped such runs. The corpus's unigram entropy, not a
# batch's: the entropy of 2048 sampled targets is biased low (5.67 nats on the default
# corpus against 6.11), and the reference-init run sits between the two at half its
# steps (5.92) on its way to 5.55. The cosine is still logged and named in the error.
# And not falling: a run whose CE still dropped by COLLAPSE_MARGIN over the last quarter
# of its steps is progressing (paper A's reference raw cell is at 6.03 at step 200 of 400
# on its way to 5.36, down from 6.3 at step 180). COLLAPSE_MARGIN also covers the batch
# CE's noise around the unigram entropy.
COLLAPSE_PATIENCE = 3
COLLAPSE_AFTER = 0.5  # share of the run before a lack of progress can stop it
COLLAPSE_SPAN = 0.25  # share of the run over which the CE must have fallen
COLLAPSE_MARGIN = 0.1  # nats
COLLAPSE_FIRST = 100  # nor before this step: a short run may still be at the unigram


def world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) outside torchrun."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed(cfg: TrainConfig) -> None:
    """Join the process group torchrun set up (gloo on CPU, nccl on CUDA).

    Run under torchrun, every process trains its share of each global batch and DDP
    averages the gradients; the world size must be train.processes.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size != cfg.processes:
        raise ParamsError(f"'train.processes' is {cfg.processes} but {size} process(es) "
                          "were started; set train.processes to torchrun's world size.")
    if size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if compute.uses_cuda(cfg.device) else "gloo")


def train_steps(cfg: TrainConfig, n_tokens: int, context: int) -> int:
    """train.steps, or the steps that make train.epochs passes over the windows."""
    if cfg.epochs <= 0:
        return cfg.steps
    steps = steps_for_epochs(cfg.epochs, n_tokens, context, cfg.stride, cfg.batch_size)
    if cfg.warmup_steps > steps:
        raise ParamsError(f"'train.warmup_steps' is {cfg.warmup_steps}, but train.epochs "
                          f"{cfg.epochs} gives only {steps} steps on this corpus; lower it.")
    return steps


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over train.warmup_steps (none at 0), then by train.schedule:
    cosine decay to min_lr_ratio * lr at the last step, or constant lr."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    ratio = cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.lr * ratio


def objective(out: LoopOutput, targets: torch.Tensor, cfg: TrainConfig
              ) -> tuple[torch.Tensor, list[float]]:
    """The training loss of one batch, and the CE of each loop that was read out.

    per_loop: mean CE over every loop's readout (dense supervision, usable exits).
    final: CE of the last loop only.
    norm_penalty adds lambda * mean over loops of mean(H_k^2), which makes the state's
    scale visible to the loss without changing the readout.
    """
    ces = [loop_ce(lg, targets) for lg in out.logits if lg is not None]
    loss = torch.stack(ces).mean() if cfg.loss == "per_loop" else ces[-1]
    if cfg.norm_penalty > 0:
        loss = loss + cfg.norm_penalty * torch.stack(
            [h.float().pow(2).mean() for h in out.states]).mean()
    return loss, [c.item() for c in ces]


def log_row(live: Any, row: dict[str, float]) -> None:
    """Send one logged row to DVCLive at its own step (set before logging: dvclive
    stamps each value with the step current when it is logged)."""
    if live is None:
        return
    live.step = int(row["step"])
    for name, value in row.items():
        if name != "step":
            live.log_metric(name, value)
    live.next_step()


def optimizer(model: LoopedLM, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with train.betas; weight decay on the matrices only (decay_on: matrices; the
    gains and biases are in a group without it) or on every parameter (decay_on: all,
    norm gains and embeddings included, as paper A's reference code has it); never on a
    parameter marked `no_weight_decay` (the stable injection's, as Parcae has it)."""
    def decayed(p: torch.nn.Parameter) -> bool:
        return ((cfg.decay_on == "all" or p.dim() >= 2)
                and not getattr(p, "no_weight_decay", False))

    decay = [p for p in model.parameters() if decayed(p)]
    no_decay = [p for p in model.parameters() if not decayed(p)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]))


def _rng_states(device: torch.device) -> list[dict[str, torch.Tensor]]:
    """torch's RNG states of every process, in rank order (a collective: every process
    calls it). Dropout and the noise initial state draw from them, and under DDP each
    process draws its own, so a resumed run is exact only if each gets its own back."""
    own = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        own["cuda"] = torch.cuda.get_rng_state(device)
    size = world()[1]
    if size == 1:
        return [own]
    states: list[Any] = [None] * size
    dist.all_gather_object(states, own)
    return [{k: v.cpu() for k, v in s.items()} for s in states]


def _snapshot(model: LoopedLM, opt: torch.optim.Optimizer, batches: Batches,
              depth: Fixed | LogNormal, rngs: list[dict[str, torch.Tensor]]
              ) -> dict[str, Any]:
    """Everything the next step depends on. The batch and depth samplers are the same on
    every process; rngs (from _rng_states) holds each process's own torch RNG."""
    return {"model": model.state_dict(), "optimizer": opt.state_dict(),
            "batches_rng": batches.gen.get_state(), "torch_rng": rngs,
            "depth_rng": depth.state()}


def _restore(state: dict[str, Any], model: LoopedLM, opt: torch.optim.Optimizer,
             batches: Batches, depth: Fixed | LogNormal, device: torch.device) -> None:
    """The inverse of _snapshot, for this process (its own RNG states)."""
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    batches.gen.set_state(state["batches_rng"])
    rng = state["torch_rng"][world()[0]]
    torch.set_rng_state(rng["cpu"])
    if device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], device)
    depth.set_state(state["depth_rng"])


def _mean_over_processes(values: list[float], device: torch.device) -> list[float]:
    """Average logged numbers over the data-parallel processes (each saw its share)."""
    rank, size = world()
    if size == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return (t / size).tolist()


def state_cosine(h: torch.Tensor, device: torch.device) -> float:
    """Mean cosine similarity over all pairs of distinct tokens of the states h (..., d),
    over the tokens of every process: 1 when every token sits on one direction.

    The mean of u_i . u_j over i != j is (|sum u|^2 - n) / (n (n - 1)) for unit vectors
    u, so it costs one pass over the tokens, not n^2 products.
    """
    u = torch.nn.functional.normalize(h.detach().reshape(-1, h.shape[-1]).double(), dim=-1)
    size = world()[1]
    total = torch.tensor(_mean_over_processes(u.sum(0).tolist(), device)) * size
    n = u.shape[0] * size
    return ((total @ total - n) / (n * (n - 1))).item() if n > 1 else 1.0


def unigram_entropy(tokens: torch.Tensor, vocab: int) -> float:
    """Entropy (nats) of the tokens' frequencies: the CE of predicting them for every
    position, what a model that tells no tokens apart reaches at best."""
    counts = torch.bincount(tokens.flatten().long(), minlength=vocab).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def target_entropy(y: torch.Tensor, vocab: int, device: torch.device) -> float:
    """Entropy (nats) of the target frequencies of every process's batch, logged beside
    the CE. As an estimate of the unigram entropy it is biased low (a batch misses the
    rare tokens), so the collapse guard compares against unigram_entropy instead."""
    counts = torch.bincount(y.flatten(), minlength=vocab).to(device, torch.float64)
    if world()[1] > 1:
        dist.all_reduce(counts)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def forward_loss(forward: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, loops: int,
                 cfg: TrainConfig, run_on: compute.Compute
                 ) -> tuple[torch.Tensor, list[float], LoopOutput]:
    """The forward pass and loss of one training step (objective) at depth `loops`, in the
    run's precision (bf16 autocast over fp32 master weights, or fp32). Training and the
    training benchmark (`python -m loopscope.tools.bench train`) both take their steps through
    this function and update, so the benchmark times the step training runs."""
    with record_function("step: forward"), run_on.autocast():
        out = forward(x, loops=loops, read=READS[cfg.loss], grad_loops=cfg.backprop_loops)
        loss, ces = objective(out, y, cfg)
    return loss, ces, out


def compiled(forward: torch.nn.Module, cfg: TrainConfig) -> torch.nn.Module:
    """torch.compile(forward) where train.compile asks for it, specialized to each depth
    (dynamic=False): a sampled depth otherwise becomes a symbolic loop count, which the
    truncated-backprop schedule cannot branch on. Off by default (docs/benchmarks.md, the
    training benchmark): on the CPU it does not win back its compile time within a cell."""
    return torch.compile(forward, dynamic=False) if cfg.compile else forward


def update(model: torch.nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor,
           grad_clip: float) -> None:
    """One optimizer step on a loss: gradients, clipped to grad_clip in global norm.
    (The labels name the step's phases in a profile: `bench train` reports them.)"""
    opt.zero_grad(set_to_none=True)
    with record_function("step: backward"):
        loss.backward()
    with record_function("step: optimizer"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()


@dataclass
class _Run:
    """What one cell's training carries from step to step, and what its resume
    checkpoint restores: the model, optimizer and samplers, the step training starts at
    (0, or the checkpoint's), the seconds spent before it, the rows logged so far and
    the last loss."""

    model: LoopedLM
    opt: torch.optim.AdamW
    batches: Batches
    depth: Fixed | LogNormal
    fingerprint: str = ""  # of this run (config, tokens, code), for its checkpoints
    first: int = 0
    spent: float = 0.0
    history: list[dict[str, float]] = field(default_factory=list)
    loss: float = float("nan")


def _start(cell: CellConfig, cfg: TrainConfig, train_tokens: torch.Tensor,
           device: torch.device, live: Any, resume: Path | None) -> _Run:
    """A run from its seed, or from the resume checkpoint of this same run where there is
    one (its logged rows replayed into live); on the device, ready for its first step.
    The torch RNG is seeded before the model draws its weights and, under torchrun,
    reseeded per process after: the draws every run makes, in the same order."""
    rank, size = world()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    model = LoopedLM(cell.model)
    model.train()
    run = _Run(model, optimizer(model, cfg),
               Batches(train_tokens, cell.model.context, cfg.batch_size, cfg.seed, cfg.stride),
               sampler(cfg, cell.model.loops))
    state = None
    if resume is not None:
        run.fingerprint = run_fingerprint(cell, train_tokens)
        state = load_resume(resume, cell, run.fingerprint)
    if size > 1:
        torch.manual_seed(cfg.seed + 1_000_003 * rank)  # dropout/noise differ per process
    if state is not None:
        _restore(state, model, run.opt, run.batches, run.depth, device)
        run.first, run.spent, run.history, run.loss = (state["step"], state["seconds"],
                                                       state["history"], state["loss"])
        if rank == 0:
            print(f"train {cell.cell}: resuming from step {run.first} ({resume})", flush=True)
        for row in run.history:
            log_row(live, row)
    model.to(device)
    _optimizer_to(run.opt, device)
    return run


def _forward(run: _Run, cell: CellConfig, cfg: TrainConfig) -> torch.nn.Module:
    """The module each step runs: the model, under torchrun wrapped in DDP (which must
    be told when a step leaves parameters unused), compiled where train.compile asks."""
    forward: torch.nn.Module = run.model
    if world()[1] > 1:  # a raw readout never uses the final norm; a one-loop step, the
        unused = (cell.model.readout == "raw"  # inter-loop norm (it feeds loop 2 on)
                  or cell.model.inter_loop_norm
                  and (run.depth.varies or cell.model.loops == 1))
        forward = torch.nn.parallel.DistributedDataParallel(
            run.model, find_unused_parameters=unused)
    return compiled(forward, cfg)


def _row(step: int, lr: float, loss: float, ces: list[float], out: LoopOutput, loops: int,
         y: torch.Tensor, run: _Run, vocab: int, device: torch.device) -> dict[str, float]:
    """One logged row: loss, lr, the final loop's CE, the state norm per loop (the last
    loop's alone, and the depth, when the depth is sampled), the tokens' mean pairwise
    state cosine and the batch's target entropy, each over every process."""
    row = {"step": step, "train/loss": loss, "train/lr": lr, "train/ce_last": ces[-1]}
    norms = [h.detach().float().norm(dim=-1).mean().item() for h in out.states]
    if run.depth.varies:  # one column for the last loop
        row["train/depth"] = loops
        norms = norms[-1:]
        row["train/norm_last"], = _mean_over_processes(norms, device)
    else:
        for k, norm in enumerate(_mean_over_processes(norms, device), 1):
            row[f"train/norm_loop{k}"] = norm
    row["train/state_cosine"] = state_cosine(out.states[-1], device)
    row["train/target_entropy"] = target_entropy(y, vocab, device)
    return row


def _checkpoint(run: _Run, resume: Path, done: int, seconds: float,
                device: torch.device) -> None:
    """Save the resume checkpoint after step `done`: every process hands in its RNG
    states, rank 0 writes (seconds: the training time up to here)."""
    rngs = _rng_states(device)  # every process takes part
    if world()[0] == 0:
        save_resume(resume, run.fingerprint, {
            "step": done, "history": run.history, "loss": run.loss, "seconds": seconds,
            **_snapshot(run.model, run.opt, run.batches, run.depth, rngs)})


def _step(run: _Run, forward: torch.nn.Module, name: str, cfg: TrainConfig,
          run_on: compute.Compute, step: int, rows: slice
          ) -> tuple[float, list[float], LoopOutput, int, torch.Tensor]:
    """One optimizer step of cell `name` on this process's rows of the global batch:
    (lr, each read loop's CE over every process, the forward's output, the depth, the
    targets). Raises DivergenceError on a NaN or infinite loss, before the update."""
    device = run_on.device
    lr = lr_at(step, cfg)
    for group in run.opt.param_groups:
        group["lr"] = lr
    x, y = run.batches.next()
    x, y = x[rows].to(device), y[rows].to(device)
    loops = run.depth.sample()
    loss, ces, out = forward_loss(forward, x, y, loops, cfg, run_on)
    run.loss, *ces = _mean_over_processes([loss.item(), *ces], device)
    if not math.isfinite(run.loss):
        raise DivergenceError(
            f"cell '{name}': loss is {run.loss} at step {step} (lr {lr:.3g}); "
            "lower train.lr or raise train.warmup_steps. No model was saved.")
    update(run.model, run.opt, loss, cfg.grad_clip)
    return lr, ces, out, loops, y


def train_cell(cell: CellConfig, train_tokens: torch.Tensor, live: Any = None,
               resume: Path | None = None) -> tuple[LoopedLM, dict[str, Any]]:
    """Train one cell; returns the model (on the CPU) and a summary of the run.

    live: a dvclive.Live (or None) that receives per-step metrics.
    resume: where to keep a resume checkpoint (None: no checkpoints). If it holds one
    of this same run (config, tokens, code), training continues from its step with the
    model, optimizer, batch sampler and RNGs restored, so the result is bitwise that of
    an uninterrupted run on CPU with one process; the rows logged before it are replayed
    into live, since DVC deletes dvclive/<cell>/ before it reruns the stage.
    train_seconds then counts the time of the steps kept, not of work lost to the
    interruption.

    Under torchrun (train.processes > 1) every process draws the same global batch and
    trains on its rows; DDP averages gradients, so the run follows the one-process run
    with the same global batch (up to float summation order, and except for dropout and
    noise, which each process draws for itself). Only rank 0 logs and checkpoints; the
    checkpoint holds every process's RNG state, so a resumed DDP run is exact too.

    The summary's "timings" (train_seconds, tokens_per_second) vary from run to run; the
    rest of it is reproducible. Raises DivergenceError (a NaN or infinite loss) or
    CollapseError (no progress past half of the run, see check_collapse) with nothing
    saved.
    """
    rank, size = world()
    run_on = compute.resolve(cell.train)
    device = run_on.device
    cfg = dataclasses.replace(cell.train, steps=train_steps(cell.train, len(train_tokens),
                                                            cell.model.context))
    run = _start(cell, cfg, train_tokens, device, live, resume)
    unigram = unigram_entropy(train_tokens, cell.model.vocab_size)  # the collapse guard's bar
    forward = _forward(run, cell, cfg)
    rows = slice(rank * cfg.batch_size // size, (rank + 1) * cfg.batch_size // size)
    tokens_per_step = cfg.batch_size * cell.model.context
    start = time.perf_counter()
    bar = tqdm(range(run.first, cfg.steps), initial=run.first, total=cfg.steps,
               disable=rank != 0, desc=f"train {cell.cell} seed{cfg.seed}", unit="step",
               mininterval=2.0)
    for step in bar:
        lr, ces, out, loops, y = _step(run, forward, cell.cell, cfg, run_on, step, rows)
        tok_s = tokens_per_step * (step + 1 - run.first) / (time.perf_counter() - start)
        bar.set_postfix(loss=f"{run.loss:.3f}", tok_s=f"{tok_s:,.0f}", refresh=False)
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            row = _row(step, lr, run.loss, ces, out, loops, y, run, cell.model.vocab_size,
                       device)
            run.history.append(row)
            log_row(live, row)
            if cfg.collapse_guard:
                check_collapse(cell.cell, run.history, cfg, lr, run.loss, unigram)
        done = step + 1
        if resume is not None and done % cfg.checkpoint_every == 0 and done < cfg.steps:
            _checkpoint(run, resume, done, run.spent + time.perf_counter() - start, device)
    seconds = run.spent + time.perf_counter() - start
    run.model.to("cpu")
    return run.model, _summary(run, cfg, run_on, seconds)


def _summary(run: _Run, cfg: TrainConfig, run_on: compute.Compute, seconds: float
             ) -> dict[str, Any]:
    """The run's summary (train_cell): reproducible but for its timings; with the rows
    it logged (history), for a run whose log is replayed into DVCLive afterwards."""
    size = world()[1]
    tokens = cfg.batch_size * run.model.cfg.context * cfg.steps
    return {
        "final_loss": run.loss,
        "steps": cfg.steps,
        "params": run.model.num_params(),
        "device": run_on.describe() + (f" x{size}" if size > 1 else ""),
        "config": asdict(cfg),
        "timings": {"train_seconds": round(seconds, 2),
                    "tokens_per_second": round(tokens / seconds, 1)},
        "history": run.history,
    }


def check_collapse(name: str, history: list[dict[str, float]], cfg: TrainConfig,
                   lr: float, loss: float, unigram: float) -> None:
    """Stop the run like a NaN does for lack of progress: its last COLLAPSE_PATIENCE
    logged rows, all at or past COLLAPSE_AFTER of its steps (and step COLLAPSE_FIRST),
    have a final-loop CE no better than the unigram entropy of the training split less
    COLLAPSE_MARGIN, and their mean CE is within COLLAPSE_MARGIN of the CE logged
    COLLAPSE_SPAN of the run earlier. Read from the logged rows, so a resumed run stops
    where an uninterrupted one would."""
    recent = history[-COLLAPSE_PATIENCE:]
    if (len(recent) < COLLAPSE_PATIENCE
            or recent[0]["step"] < max(COLLAPSE_AFTER * cfg.steps, COLLAPSE_FIRST)
            or any(r["train/ce_last"] < unigram - COLLAPSE_MARGIN for r in recent)):
        return
    back = recent[0]["step"] - COLLAPSE_SPAN * cfg.steps
    before = [r for r in history if r["step"] <= back]
    now = sum(r["train/ce_last"] for r in recent) / len(recent)
    if not before or before[-1]["train/ce_last"] - now > COLLAPSE_MARGIN:
        return  # still falling
    first, last = int(recent[0]["step"]), int(recent[-1]["step"])
    seen = ", ".join(f"{r['train/state_cosine']:.4f}" for r in recent)
    raise CollapseError(
        f"cell '{name}': training made no progress (lr {lr:.3g}): past half of its "
        f"{cfg.steps} steps and step {COLLAPSE_FIRST}, from step {first} to step {last}, "
        f"the final loop's CE ({recent[-1]['train/ce_last']:.3f}) is no better than "
        f"predicting the training split's unigram frequencies for every token (entropy "
        f"{unigram:.3f}, less {COLLAPSE_MARGIN:g} for noise) and no lower than at step "
        f"{int(before[-1]['step'])} ({before[-1]['train/ce_last']:.3f}); the mean "
        f"pairwise cosine of the tokens' final states was {seen}; the loss stayed finite "
        f"({loss:.3f}). Lower train.lr or raise train.warmup_steps (or set "
        "train.collapse_guard: false to train on and measure the model). No model was "
        "saved.")


def _optimizer_to(opt: torch.optim.Optimizer, device: torch.device) -> None:
    """Move restored AdamW moments to the model's device."""
    for st in opt.state.values():
        for key, value in st.items():
            if isinstance(value, torch.Tensor) and key != "step":
                st[key] = value.to(device)
