"""Checkpoints: the trained model files, the resume state, and their digests.

Two kinds, both written atomically and carrying a sha256 of their contents, so a
truncated or altered file is an error and never a silently wrong model:

- models/<cell>/seed<N>.pt, a trained model (a DVC output), written once at the end;
- a resume checkpoint (checkpoints/<cell>/seed<N>/last.pt, deliberately not a DVC
  output: DVC deletes a stage's outputs before rerunning it), written every
  train.checkpoint_every steps, so a killed run continues where it stopped and ends
  bitwise where an uninterrupted run ends.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import hashlib
import io
from pathlib import Path
from typing import Any

import torch

from loopscope.base.errors import CheckpointError
from loopscope.base.files import atomic_write_bytes, temp_path
from loopscope.weights.config import CellConfig
from loopscope.weights.depth import means
from loopscope.weights.model import LoopedLM

RESUME_FORMAT = "loopscope-resume-2"  # 2: torch_rng holds every process's RNG states
PACKAGE = Path(__file__).resolve().parents[1]  # src/loopscope


def _digest_into(h: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, dict):
        h.update(b"{")
        for key in sorted(obj, key=repr):
            h.update(repr(key).encode())
            _digest_into(h, obj[key])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for item in obj:
            _digest_into(h, item)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())


def payload_digest(payload: dict[str, Any]) -> str:
    """sha256 over every tensor's bytes and every value of a checkpoint payload.

    torch.load happily returns weights with a flipped byte in them; this digest, stored
    in the file and checked on load, turns that into an error.
    """
    h = hashlib.sha256()
    _digest_into(h, {k: v for k, v in payload.items() if k != "sha256"})
    return h.hexdigest()


def write_payload(path: Path, payload: dict[str, Any]) -> None:
    """Save a payload with its digest, atomically."""
    buf = io.BytesIO()
    torch.save({**payload, "sha256": payload_digest(payload)}, buf)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buf.getvalue())


def read_payload(path: Path) -> dict[str, Any]:
    """Load a payload written by write_payload; CheckpointError if damaged."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a damaged file
        raise CheckpointError(f"{path}: unreadable checkpoint "
                              f"({type(err).__name__}: {err})") from None
    if not isinstance(payload, dict) or payload.get("sha256") != payload_digest(payload):
        raise CheckpointError(f"{path}: checksum does not match its contents (altered, or "
                              "written by an older loopscope)")
    return payload


def save_model(path: Path, model: LoopedLM, cell: CellConfig, extra: dict[str, Any]) -> None:
    """Atomically save weights and the resolved config they were trained with."""
    write_payload(path, {"cell": cell.to_json(), "model": model.state_dict(), **extra})


def load_model(path: Path) -> tuple[LoopedLM, CellConfig]:
    """Rebuild a trained model (in eval mode, on the CPU) from a file of save_model,
    with the depth it trained at (nominal_mean, sampler_mean: depth.means)."""
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found; run `dvc repro` to train it.")
    rerun = f"rerun its train stage with `dvc repro -f train@{path.parent.name}`"
    try:
        state = read_payload(path)
        cell = CellConfig.from_json(state["cell"])
        model = LoopedLM(cell.model)
        model.load_state_dict(state["model"])
    except CheckpointError as err:
        raise CheckpointError(f"{err}; {rerun}.") from None
    except Exception as err:  # a valid file that is not one of our checkpoints
        raise CheckpointError(f"{path}: unreadable checkpoint ({type(err).__name__}: {err}); "
                              f"{rerun}.") from None
    nominal, sampler = means(cell.train, cell.model.loops)
    model.spec = dataclasses.replace(model.spec, nominal_mean=nominal, sampler_mean=sampler)
    model.eval()
    return model, cell


def module_file(name: str) -> Path | None:
    """The source file of a loopscope module ("loopscope.measure.per_loop.sweep"), or None."""
    parts = name.split(".")
    if parts[0] != "loopscope":
        return None
    path = PACKAGE.joinpath(*parts[1:])
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports(tree: ast.AST) -> set[str]:
    """The loopscope modules a syntax tree imports, anywhere (inside functions too):
    `from loopscope.measure import runtime` names the module loopscope.measure.bench.runtime,
    `from loopscope.measure.runs import Run` the module loopscope.measure.runs."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                "loopscope"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if module_file(sub) is not None and (
                    module_file(sub).name != "__init__.py") else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("loopscope.")}
    return found


def closure(trees: list[ast.AST]) -> set[Path]:
    """The loopscope source files the syntax trees run: every module they import,
    directly or through others. Read from the files, never by importing them. A package's
    __init__.py holds a docstring alone (tests/test_layout.py), so it is left out."""
    seen: set[Path] = set()
    todo = set().union(*(imports(t) for t in trees))
    while todo:
        path = module_file(todo.pop())
        if path is None or path in seen or path.name == "__init__.py":
            continue
        seen.add(path)
        todo |= imports(ast.parse(path.read_text()))
    return seen


def imported_modules(module: str) -> list[Path]:
    """The source files `module` ("loopscope.weights.train") runs: itself and every
    loopscope module it imports, directly or through others."""
    path = module_file(module)
    return sorted({path, *closure([ast.parse(path.read_text())])})


def run_fingerprint(cell: CellConfig, train_tokens: torch.Tensor) -> str:
    """What a training run's result depends on: resolved config, tokens and code.

    A resume checkpoint is used only by a run with the same fingerprint, so a corpus or
    code change after a kill (which DVC answers by rerunning the stage) starts afresh
    instead of finishing someone else's run. The code is what training runs
    (loopscope.weights.train and its imports): an edit to a report or a claim keeps the
    checkpoint, an edit to the model or the optimizer discards it.
    """
    h = hashlib.sha256(cell.to_json().encode())
    _digest_into(h, train_tokens)
    for path in imported_modules("loopscope.weights.train"):
        h.update(str(path.relative_to(PACKAGE)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def save_resume(path: Path, fingerprint: str, state: dict[str, Any]) -> None:
    """Write the resume checkpoint of a run (state: step, RNGs, model, optimizer...)."""
    write_payload(path, {"format": RESUME_FORMAT, "fingerprint": fingerprint, **state})


def load_resume(path: Path, cell: CellConfig, fingerprint: str) -> dict[str, Any] | None:
    """The resume state saved by a run with this fingerprint, else None (with a note).

    A resume file of another run (params, corpus or code changed after a kill), or a
    damaged one, is ignored rather than fatal: it only saves time, and training from
    step 0 is always correct. It is overwritten at the next checkpoint.
    """
    if not path.is_file():
        return None
    try:
        state = read_payload(path)
    except CheckpointError as err:
        print(f"note: {err}; training cell '{cell.cell}' from step 0.", flush=True)
        return None
    if state.get("format") != RESUME_FORMAT or state.get("fingerprint") != fingerprint:
        print(f"note: {path} was written for another config, corpus or code of cell "
              f"'{cell.cell}'; training from step 0.", flush=True)
        return None
    return state


def discard_resume(path: Path) -> None:
    """Delete a resume checkpoint (and its run and cell folders, if empty) once the
    outputs are in place."""
    path.unlink(missing_ok=True)
    temp_path(path).unlink(missing_ok=True)
    for folder in (path.parent, path.parent.parent):
        with contextlib.suppress(OSError):
            folder.rmdir()
