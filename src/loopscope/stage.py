"""What every stage script shares: clean error exits and atomic JSON outputs."""

from __future__ import annotations

import errno
import json
import sys
from collections.abc import Callable, Iterator
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


def seed_tag(seed: int) -> str:
    """The name of one training run of a cell: models/<cell>/<tag>.pt and so on."""
    return f"seed{seed}"


def trained_runs(name: str, val_sequences: int
                 ) -> Iterator[tuple[str, LoopedLM, CellConfig, Tensor, Tensor]]:
    """Each trained run of a cell, ready to measure: (tag, model in eval mode, the run's
    config, inputs, targets), the targets being the first val_sequences validation
    windows, the same for every cell and seed.

    Seeds torch with the run's seed before yielding, so a noise initial state draws the
    same noise in every stage that reads the model.
    """
    paths = sorted(Path("models", name).glob("seed*.pt"), key=lambda p: int(p.stem[4:]))
    if not paths:
        raise CheckpointError(f"models/{name}/: no trained runs; run `dvc repro train@{name}`.")
    tokens = torch.from_numpy(load_tokens(Path("prepared"), "val"))
    for path in paths:
        model, cell = load_checkpoint(path)
        torch.manual_seed(cell.train.seed)
        torch.set_num_threads(cell.train.threads)
        x, y = val_windows(tokens, cell.model.context, val_sequences)
        yield path.stem, model, cell, x, y


def mean_over_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Average metrics dicts of the same shape (one per seed), leaf by leaf."""
    first = runs[0]
    if isinstance(first, dict):
        return {key: mean_over_runs([r[key] for r in runs]) for key in first}
    return sum(runs) / len(runs)


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())
