"""Training one cell: loss placement, norm penalty, schedule, logging, checkpoint."""

from __future__ import annotations

import io
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from loopscope.config import CellConfig, TrainConfig
from loopscope.data import Batches, atomic_write_bytes
from loopscope.model import LoopedLM, LoopOutput


class DivergenceError(RuntimeError):
    """The loss became NaN or infinite; the message names the cell, step and lr."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing or unreadable; the message names the file."""


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio * lr."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    ratio = cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.lr * ratio


def loop_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


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


def save_checkpoint(path: Path, model: LoopedLM, cell: CellConfig, extra: dict[str, Any]
                    ) -> None:
    """Atomically save weights and the resolved config they were trained with."""
    buf = io.BytesIO()
    torch.save({"cell": cell.to_json(), "model": model.state_dict(), **extra}, buf)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buf.getvalue())


def load_checkpoint(path: Path) -> tuple[LoopedLM, CellConfig]:
    """Rebuild the trained model from a checkpoint written by save_checkpoint."""
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found; run `dvc repro` to train it.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        cell = CellConfig.from_json(state["cell"])
        model = LoopedLM(cell.model)
        model.load_state_dict(state["model"])
    except Exception as err:  # torch raises many types for a damaged file
        raise CheckpointError(f"{path}: unreadable checkpoint ({type(err).__name__}: {err}); "
                           "rerun its train stage with `dvc repro -f`.") from None
    model.eval()
    return model, cell


def train_cell(cell: CellConfig, train_tokens: torch.Tensor, live: Any = None
               ) -> tuple[LoopedLM, dict[str, Any]]:
    """Train one cell from scratch; returns the model and a summary of the run.

    live: a dvclive.Live (or None) that receives per-step metrics.
    """
    cfg = cell.train
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    model = LoopedLM(cell.model)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95))
    batches = Batches(train_tokens, cell.model.context, cfg.batch_size, cfg.seed)
    read = "all" if cfg.loss == "per_loop" else "last"
    tokens_per_step = cfg.batch_size * cell.model.context
    start = time.perf_counter()
    bar = tqdm(range(cfg.steps), desc=f"train {cell.cell}", unit="step", mininterval=2.0)
    loss_value = float("nan")
    for step in bar:
        lr = lr_at(step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = batches.next()
        out = model(x, read=read)
        loss, ces = objective(out, y, cfg)
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            raise DivergenceError(
                f"cell '{cell.cell}': loss is {loss_value} at step {step} (lr {lr:.3g}); "
                "lower train.lr or raise train.warmup_steps. Nothing was saved.")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        tok_s = tokens_per_step * (step + 1) / (time.perf_counter() - start)
        bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{tok_s:,.0f}", refresh=False)
        if live is not None and (step % cfg.log_every == 0 or step == cfg.steps - 1):
            norms = [h.detach().norm(dim=-1).mean().item() for h in out.states]
            live.log_metric("train/loss", loss_value)
            live.log_metric("train/lr", lr)
            live.log_metric("train/ce_last", ces[-1])
            for k, n in enumerate(norms, 1):
                live.log_metric(f"train/norm_loop{k}", n)
            live.step = step
            live.next_step()
    seconds = time.perf_counter() - start
    summary = {
        "final_loss": loss_value,
        "train_seconds": round(seconds, 2),
        "tokens_per_second": round(tokens_per_step * cfg.steps / seconds, 1),
        "params": model.num_params(),
        "config": asdict(cfg),
    }
    return model, summary
