"""The registry of released layouts: a layout registers itself by name with one
decorator on its model class, and the outside stages find it by the name params.yaml's
`outside.<name>.adapter` gives.

    @register("huginn", config=HuginnConfig, eos="<|end_text|>", title="Huginn's")
    class HuginnLM(Specified, nn.Module): ...

A layout is what loopscope needs of a released checkpoint beyond the looped-model
interface (loopscope.looped.interface), which its model class implements:
- `config`: its config.json's reader, `config.from_json(raw)`, with the sizes the memory
  checks and `plan` read (d_model, n_heads, intermediate, vocab_size, context and
  mean_recurrence, its own depth: loopscope.released.loader.sizing);
- `model(cfg, loops)`: the model built from that config, read at depth `loops` (None:
  the checkpoint's own); the loader builds it on the meta device and fills it;
- `eos`: the end-of-text token its tokenizer separates documents with;
- `optional(cfg)`: tensors a checkpoint may hold beyond the parameters (name -> shape),
  accepted and not loaded as parameters;
- `after_load(model, files, device)`: what the layout does once the weights are in (its
  rotary tables are built on the device; Huginn's saved table is checked, then used);
- `exit_modes`: the exit semantics its policies may run under (`outside.<name>.exit_mode`):
  "frozen", ours (an exited token's state, keys and values stay those of its exit loop),
  for every layout, and "published" where the model's own early exit runs every token
  to the cap and reads each token's output at its exit loop (Ouro's).

A third layout is one file that defines its model class under this decorator, and one
import line in loopscope.released.outside (tests/test_layouts.py registers one written
in the test suite alone).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from loopscope.base.errors import ParamsError

Shapes = dict[str, tuple[int, ...]]
Files = dict[str, tuple[Path, tuple[int, ...]]]  # tensor name -> (file, shape)


def no_extras(cfg: Any) -> Shapes:
    return {}


def rebuild_rotary(model: nn.Module, files: Files, device: torch.device | str) -> None:
    """The rotary table, a buffer the meta device left empty, built on the device."""
    model.rotary.rebuild(device)


@dataclass(frozen=True)
class Layout:
    """A registered layout (module doc)."""

    name: str
    model: Callable[..., nn.Module]
    config: Any
    eos: str
    title: str  # "Huginn's", for messages: "the weights do not fit Huginn's layout"
    optional: Callable[[Any], Shapes] = field(default=no_extras)
    after_load: Callable[[nn.Module, Files, torch.device | str], None] = field(
        default=rebuild_rotary)
    exit_modes: tuple[str, ...] = ("frozen",)


LAYOUTS: dict[str, Layout] = {}


def register(name: str, *, config: Any, eos: str, title: str,
             optional: Callable[[Any], Shapes] = no_extras,
             after_load: Callable[[nn.Module, Files, torch.device | str], None]
             = rebuild_rotary, exit_modes: tuple[str, ...] = ("frozen",)
             ) -> Callable[[type], type]:
    """A class decorator: the model class of layout `name` (module doc). A name
    registered twice is a ValueError: two layouts cannot answer to one adapter name."""
    def add(cls: type) -> type:
        if name in LAYOUTS and LAYOUTS[name].model is not cls:
            raise ValueError(f"layout {name!r} is registered already "
                             f"({LAYOUTS[name].model.__qualname__})")
        LAYOUTS[name] = Layout(name, cls, config, eos, title, optional, after_load,
                               exit_modes)
        return cls
    return add


def layout(name: str, key: str = "adapter") -> Layout:
    """The layout registered as name; a ParamsError naming key and the known ones."""
    if name not in LAYOUTS:
        raise ParamsError(f"'{key}' is {name!r}: no such layout; the known ones are "
                          f"{', '.join(sorted(LAYOUTS))} (docs/outside-models.md)")
    return LAYOUTS[name]


class LayoutReader(nn.Module):
    """What a layout's read runs, with the model's own modules under the same names, so
    that a float64 copy of it (loopscope.measure.per_loop.sweep) holds the readout
    alone. Each layout's reader subclasses it and takes its model's read (the same code)
    as forward: `parts`, the readout's modules by name, under `tree` (the attribute the
    layout keeps its modules under), with the embedding (`embedding`, its name there)
    where it is the head (tied: the model has no lm_head)."""

    def __init__(self, model: nn.Module, tree: str, parts: dict[str, nn.Module],
                 embedding: str) -> None:
        super().__init__()
        self.cfg, self.lm_head = model.cfg, model.lm_head
        if model.lm_head is None:
            parts = {**parts, embedding: getattr(getattr(model, tree), embedding)}
        setattr(self, tree, nn.ModuleDict(parts))


def tied_head(tree: nn.Module, embedding: str, lm_head: nn.Linear | None) -> torch.Tensor:
    """The readout's matrix: the embedding (tree's module named `embedding`) when tied
    (no lm_head), else lm_head's. A reader holds the embedding only when tied."""
    return getattr(tree, embedding).weight if lm_head is None else lm_head.weight


def checked_positions(t: int, positions: torch.Tensor | None, context: int,
                      device: torch.device | str) -> torch.Tensor:
    """The positions of a call on T tokens, on the device: 0 .. T - 1 by default (refusing
    T beyond the model's context), else the (T,) or (B, T) ones given (refusing another
    length): what every layout's rotary embedding is read at."""
    if positions is None:
        if t > context:
            raise ValueError(f"sequence length {t} exceeds the context {context}")
        return torch.arange(t, device=device)
    if positions.shape[-1] != t:
        raise ValueError(f"positions give {positions.shape[-1]} tokens, the input {t}")
    return positions.to(device)
