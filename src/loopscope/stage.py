"""What every stage script shares: clean error exits and atomic JSON outputs."""

from __future__ import annotations

import errno
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from loopscope.config import CellConfig, ParamsError
from loopscope.corpus import CorpusError
from loopscope.data import DataError, atomic_write_bytes, load_tokens, val_windows
from loopscope.model import LoopedLM
from loopscope.train import CheckpointError, DivergenceError, load_checkpoint

# Errors whose message already says what went wrong and what to do: no traceback.
EXPECTED = (ParamsError, DataError, DivergenceError, CorpusError, CheckpointError)


def run(main: Callable[[], None]) -> None:
    """Run a stage's main; print expected errors as one clear line and exit 1."""
    try:
        main()
    except EXPECTED as err:
        sys.exit(f"error: {err}")
    except OSError as err:  # a full disk or a read-only path, named by the OS error
        where = f"{err.filename}: {err.strerror}" if err.filename else str(err)
        todo = ("Free disk space" if err.errno in (errno.ENOSPC, errno.EDQUOT)
                else "Fix the path or its permissions")
        sys.exit(f"error: {where.rstrip('.')}. {todo}, then rerun `dvc repro`.")


def trained_cell(name: str, val_sequences: int) -> tuple[LoopedLM, CellConfig, Tensor, Tensor]:
    """A trained cell ready to measure: model (eval mode), its config, and the first
    val_sequences validation windows (inputs, targets), the same for every cell.

    Seeds torch with the cell's seed so a noise initial state draws the same noise in
    every stage that reads the model.
    """
    model, cell = load_checkpoint(Path("models") / f"{name}.pt")
    torch.manual_seed(cell.train.seed)
    torch.set_num_threads(cell.train.threads)
    tokens = torch.from_numpy(load_tokens(Path("prepared"), "val"))
    x, y = val_windows(tokens, cell.model.context, val_sequences)
    return model, cell, x, y


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())
