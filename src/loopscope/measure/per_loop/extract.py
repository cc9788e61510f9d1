"""The extract: H_0..H_K of validation windows saved for later reading (the extract
stage; format: Extract)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from loopscope.base.errors import DataError
from loopscope.base.files import atomic_write_bytes
from loopscope.looped.interface import LoopedModel, h0_rows, run_loops
from loopscope.preflight.disk import require_disk

TABLE_ROW_BYTES = 22  # tokens.parquet, one row uncompressed: four int32, an int16, a float


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor on any device, in any dtype, as numpy (bf16 widened to float32)."""
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


@dataclass
class Extract:
    """Per-loop hidden states of a fixed validation slice.

    On disk (one folder per cell, written by the extract stage):
        states.npy    float32, shape (loops + 1, tokens, d_model): H_0 (the initial state)
                      then H_1 .. H_K, tokens in reading order (sequence-major)
        tokens.parquet one row per (token, loop k >= 1): seq, position, token_id,
                      target_id, loop, norm (= ||H_k|| of that token)
        meta.json     cell, loops, context, sequences, d_model
    states.npy is written batch by batch through a memmap, so memory stays bounded by
    one batch whatever the slice size.
    """

    states: np.ndarray
    table: pd.DataFrame
    meta: dict


@torch.no_grad()
def write_extract(model: LoopedModel, x: torch.Tensor, y: torch.Tensor, batch_size: int,
                  out: Path, cell: str, h0: torch.Tensor | None = None) -> Extract:
    """Run the model over (x, y) and write the extract folder out/ (see Extract).
    h0: the windows' initial states for a noise state_init (loopscope.measure.runs).

    Checks the free disk space first: the states grow with the params, and a full disk
    under the memmap would end the process with SIGBUS rather than an error.
    """
    loops, d = model.loops, model.d_model
    n, t = x.shape
    out.mkdir(parents=True, exist_ok=True)
    require_disk({out / "states.npy": (loops + 1) * n * t * d * 4
                  + loops * n * t * TABLE_ROW_BYTES},
                 f"Free disk space, or lower extract.val_sequences ({n} windows of "
                 f"model.context {t} tokens, each token with model.loops + 1 = {loops + 1} "
                 f"states of model.d_model {d} floats), then rerun `dvc repro`.")
    tmp = out / ".states.npy.tmp"
    states = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32,
                                       shape=(loops + 1, n * t, d))
    norms = np.empty((loops, n * t), dtype=np.float32)  # from each batch, not a reread
    for i in range(0, n, batch_size):
        xb = x[i:i + batch_size]
        rows = slice(i * t, (i + len(xb)) * t)
        initial, hs = run_loops(model, xb, loops, h0_rows(h0, i, batch_size))
        states[0, rows] = _numpy(initial.flatten(0, 1))
        for k, h in enumerate(hs, 1):
            states[k, rows] = _numpy(h.flatten(0, 1))
            norms[k - 1, rows] = _numpy(h.float().norm(dim=-1).flatten())
    states.flush()
    seq = np.repeat(np.arange(n), t)
    pos = np.tile(np.arange(t), n)
    table = pd.DataFrame({
        "seq": np.tile(seq, loops).astype(np.int32),
        "position": np.tile(pos, loops).astype(np.int32),
        "token_id": np.tile(_numpy(x.flatten()), loops).astype(np.int32),
        "target_id": np.tile(_numpy(y.flatten()), loops).astype(np.int32),
        "loop": np.repeat(np.arange(1, loops + 1), n * t).astype(np.int16),
        "norm": norms.flatten(),
    })
    meta = {"cell": cell, "loops": loops, "context": t, "sequences": n,
            "d_model": d, "tokens": n * t}
    del states
    tmp_table = out / ".tokens.parquet.tmp"
    table.to_parquet(tmp_table, index=False)
    tmp.replace(out / "states.npy")
    tmp_table.replace(out / "tokens.parquet")
    atomic_write_bytes(out / "meta.json", (json.dumps(meta, indent=2) + "\n").encode())
    return load_extract(out)


def load_extract(path: Path) -> Extract:
    """Read an extract folder, checking that its parts agree."""
    files = {name: path / name for name in ("states.npy", "tokens.parquet", "meta.json")}
    for file in files.values():
        if not file.is_file():
            raise DataError(f"{file}: missing; rerun the extract stage (`dvc repro`).")
    meta = json.loads(files["meta.json"].read_text())
    states = np.load(files["states.npy"], mmap_mode="r")
    table = pd.read_parquet(files["tokens.parquet"])
    want = (meta["loops"] + 1, meta["tokens"], meta["d_model"])
    if states.shape != want or len(table) != meta["loops"] * meta["tokens"]:
        raise DataError(f"{path}/: states {states.shape} or table ({len(table)} rows) do not "
                        f"match meta.json {want}; rerun `dvc repro -f extract@{meta['cell']}`.")
    return Extract(states=states, table=table, meta=meta)
