"""The one loader of released checkpoints, for every registered layout
(loopscope.released.layouts): a checkpoint directory holds config.json, the weights in
safetensors files (model.safetensors, or the shards a model.safetensors.index.json
maps) and tokenizer.json.

Every name and shape is checked against the layout before a weight is read: a missing,
unexpected or misshapen parameter is a CheckpointError naming the file and the
parameter. The model is built on the meta device and filled by assignment, so loading
needs the weights' memory once (a 3.5B model: about 14 GB in fp32, 7 GB in bf16), not
twice. Its sizes for `plan` and the memory checks (sizing) count the parameters of that
meta-device model, so they cannot disagree with what loads.

A local directory is the real path. To fetch a released model from the Hugging Face hub
first (optional; run nowhere in this project, and it needs the `huggingface_hub`
package and network access):

    from huggingface_hub import snapshot_download
    path = snapshot_download("tomg-group-umd/huginn-0125", allow_patterns=[
        "config.json", "model*.safetensors*", "tokenizer.json"])
    model = load(path, LAYOUTS["huginn"], dtype="bfloat16", device="cuda")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tokenizers import Tokenizer
from torch import nn

from loopscope.base.errors import CheckpointError
from loopscope.looped.types import Sizing
from loopscope.released.layouts import Files, Layout, Shapes

CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
INDEX = "model.safetensors.index.json"


def read_config(directory: Path, layout: Layout) -> Any:
    """The config.json of a checkpoint directory through the layout's reader; a
    CheckpointError naming the file and the key when it is missing, unreadable or not
    the layout's."""
    path = Path(directory) / CONFIG
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file; a checkpoint directory in "
                              f"{layout.title} layout holds config.json, its safetensors "
                              "weights and tokenizer.json")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: not readable JSON ({err})") from err
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object of {layout.title} config "
                              "keys")
    try:
        return layout.config.from_json(raw)
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{path}: {err}") from err


def read_tokenizer(directory: Path, vocab_size: int) -> Tokenizer:
    """tokenizer.json, whose ids must index the embedding (vocab_size rows)."""
    path = Path(directory) / TOKENIZER
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file; the model's own tokenizer is read "
                              "from the checkpoint directory")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception on a malformed file
        raise CheckpointError(f"{path}: not a tokenizers tokenizer.json ({err})") from err
    if tokenizer.get_vocab_size() > vocab_size:
        raise CheckpointError(f"{path}: {tokenizer.get_vocab_size()} tokens, more than "
                              f"config.json's vocab_size {vocab_size}")
    return tokenizer


def weight_files(directory: Path) -> Files:
    """Every tensor the directory's safetensors files hold: name -> (file, shape), read
    from the files' headers only. The files: those model.safetensors.index.json maps
    names to, else every *.safetensors in the directory."""
    index = directory / INDEX
    if index.is_file():
        try:
            mapped = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{index}: no readable weight_map ({err})") from err
        paths = sorted({directory / f for f in mapped.values()})
    else:
        paths = sorted(directory.glob("*.safetensors"))
    if not paths:
        raise CheckpointError(f"{directory}: no *.safetensors weights")
    found: Files = {}
    for path in paths:
        if not path.is_file():
            raise CheckpointError(f"{path}: listed in {index.name} but missing")
        try:
            with safe_open(str(path), framework="pt") as f:
                names = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
        except Exception as err:  # safetensors raises its own error types
            raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from err
        for name, shape in names.items():
            if name in found:
                raise CheckpointError(f"{path}: {name} is also in {found[name][0].name}")
            found[name] = (path, shape)
    return found


def check_names(files: Files, shapes: Shapes, optional: Shapes, title: str) -> None:
    """CheckpointError naming the files and parameters that do not fit the layout
    (title: "Huginn's"): missing, unexpected, or of another shape than config.json
    implies."""
    where = sorted({str(p) for p, _ in files.values()})
    problems = [f"{name} {shape} is missing (looked in {', '.join(where)})"
                for name, shape in shapes.items() if name not in files]
    for name, (path, shape) in files.items():
        wanted = shapes.get(name, optional.get(name))
        if wanted is None:
            problems.append(f"{path}: {name} is not a parameter of {title} layout at this "
                            "config.json")
        elif shape != wanted:
            problems.append(f"{path}: {name} has shape {shape}; config.json implies {wanted}")
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more"
                                            if len(problems) > 8 else "")
        raise CheckpointError(f"the weights do not fit {title} layout: {shown}")


def group_by_file(files: Files, names: Shapes) -> dict[Path, list[str]]:
    """The parameters to read, by the file that holds each (one open per file)."""
    grouped: dict[Path, list[str]] = {}
    for name in names:
        grouped.setdefault(files[name][0], []).append(name)
    return grouped


def floating_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A floating torch dtype from itself or its name ("bfloat16"); ValueError else."""
    found = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(found, torch.dtype) or not found.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype, got {dtype!r}")
    return found


def on_meta(layout: Layout, cfg: Any, loops: int | None = None) -> nn.Module:
    """The layout's model of this config on the meta device: its shapes, no memory."""
    with torch.device("meta"):
        return layout.model(cfg, loops)


def load(directory: str | Path, layout: Layout, dtype: torch.dtype | str = torch.float32,
         device: torch.device | str = "cpu", loops: int | None = None) -> nn.Module:
    """The model in a checkpoint directory in the layout, in eval mode on device in
    dtype, read at depth `loops` (None: the checkpoint's own), with its config as
    `.cfg` and its tokenizer as `.tokenizer` (module doc)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory (a checkpoint directory in "
                              f"{layout.title} layout: config.json, safetensors weights, "
                              "tokenizer.json)")
    dtype = floating_dtype(dtype)
    cfg = read_config(directory, layout)
    tokenizer = read_tokenizer(directory, cfg.vocab_size)
    model = on_meta(layout, cfg, loops)
    files = weight_files(directory)
    shapes = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    check_names(files, shapes, layout.optional(cfg), layout.title)
    state = {}
    for path, names in group_by_file(files, shapes).items():
        with safe_open(str(path), framework="pt") as f:
            for name in names:
                state[name] = f.get_tensor(name).to(device=device, dtype=dtype)
    model.load_state_dict(state, strict=True, assign=True)
    layout.after_load(model, files, device)
    model.tokenizer = tokenizer
    return model.eval().requires_grad_(False)


def sizing(layout: Layout, cfg: Any, loops: int | None = None) -> Sizing:
    """What the memory checks and `plan` read of a released model, from its config
    alone: the sizes config.json gives, and the parameters counted on the model built
    on the meta device (its readout's: the modules `read` runs, LoopedModel.reader)."""
    model = on_meta(layout, cfg, loops)
    return Sizing(params=sum(p.numel() for p in model.parameters()),
                  readout_params=sum(p.numel() for p in model.reader().parameters()),
                  d_model=model.d_model, n_heads=cfg.n_heads, intermediate=cfg.intermediate,
                  vocab_size=cfg.vocab_size, context=model.context,
                  coda_blocks=model.coda_blocks, loops=model.loops, cost=model.cost())
