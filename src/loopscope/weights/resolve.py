"""A cell of params.yaml resolved to its complete config: the cell's overrides applied
to the shared `model:` and `train:` blocks, validated, with its seeds.

The configure stage writes each resolved cell to configs/<cell>.json; training and
every stage that measures a model read that file alone, so a param change reruns
exactly the cells whose resolved config changed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from loopscope.base.errors import ParamsError
from loopscope.weights.config import CellConfig, ModelConfig, TrainConfig
from loopscope.weights.depth import SAMPLERS
from loopscope.weights.params import CELL_SECTIONS, SECTIONS, build, seeds_of, unknown


def resolve_cell(params: Any, name: str) -> CellConfig:
    """Apply a cell's overrides to the shared model and train blocks, and validate.
    params: anything with model, train, cells and seeds (a View, loopscope.params.Params)."""
    if name not in params.cells:
        raise ParamsError(f"unknown cell '{name}'; cells: {', '.join(params.cells)}.")
    overrides = params.cells[name]
    resolved = {}
    for section in CELL_SECTIONS:
        base = dataclasses.asdict(getattr(params, section))
        extra = overrides.get(section) or {}
        if not isinstance(extra, dict):
            raise ParamsError(f"'cells.{name}.{section}' must be a mapping, got {extra!r}.")
        if section == "model" and "vocab_size" in extra:
            raise ParamsError(f"'cells.{name}.model.vocab_size' is set by "
                              "'tokenizer.vocab_size'; remove it.")
        for key in extra:
            if key not in base:
                raise unknown(f"cells.{name}.{section}", str(key), list(base))
        if section == "train":
            # A cell's own training length replaces the shared one, in either unit.
            if "steps" in extra and "epochs" not in extra:
                base["epochs"] = 0.0
            if "epochs" in extra and "steps" not in extra:
                base["steps"] = 0
        try:
            cls, check = SECTIONS[section]
            resolved[section] = build(section, cls, {**base, **extra}, check)
        except ParamsError as err:
            raise ParamsError(f"in cell '{name}': {err}") from None
    seeds = seeds_of(overrides.get("seeds"), f"cells.{name}.seeds") or params.seeds
    if seeds:
        if "seed" in (overrides.get("train") or {}):
            where = f"'cells.{name}.seeds'" if "seeds" in overrides else "the top-level 'seeds'"
            raise ParamsError(f"'cells.{name}.train.seed' has no effect while {where} list "
                              f"is set ({seeds}); remove one of them.")
        resolved["train"] = dataclasses.replace(resolved["train"], seed=seeds[0])
    _check_cell(name, resolved["model"], resolved["train"])
    return CellConfig(cell=name, **resolved, seeds=list(seeds))


def _check_cell(name: str, model: ModelConfig, train: TrainConfig) -> None:
    """Rules that tie the model and train blocks of one cell together."""
    where = f"in cell '{name}': "
    why = SAMPLERS[train.depth].check(model.loops)
    if why:
        raise ParamsError(f"{where}'model.loops' is {model.loops}; with train.depth "
                          f"'{train.depth}' {why}.")
    if train.stride > model.context:
        raise ParamsError(f"{where}'train.stride' is {train.stride}; it must be at most "
                          f"model.context ({model.context}), or tokens are never trained on.")
