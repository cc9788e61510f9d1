"""An outside model (loopscope.weights.outside_config: params.yaml's `outside.<name>`)
through its layout: the registered layout its `adapter` names
(loopscope.released.layouts) reads its checkpoint directory with the one loader
(loopscope.released.loader) into a model of the looped-model interface, on the device
and in the precision it is measured in.

Precision: fp32 on the CPU, bf16 on a GPU (`precision: auto`; Huginn was trained and is
evaluated in bf16, Ouro is released in bf16); the norms, the rotary embedding and the
logits compute in float32 either way. The device follows the one device rule
(loopscope.weights.compute.device_for), as a trained run's does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from loopscope.base.errors import CheckpointError, ParamsError
from loopscope.looped.types import Sizing

# Each layout file registers its layout on import: a new layout is one file and a line here
from loopscope.released import huginn, loader, ouro, parcae  # noqa: F401
from loopscope.released.layouts import Layout, layout
from loopscope.weights import compute
from loopscope.weights.outside_config import OutsideConfig


def layout_of(cfg: OutsideConfig) -> Layout:
    """The layout outside.<name>.adapter names; a ParamsError naming the key else."""
    return layout(cfg.adapter, f"outside.{cfg.cell}.adapter")


def directory(cfg: OutsideConfig) -> Path:
    """The checkpoint directory; a ParamsError naming the key where it is not one."""
    path = Path(cfg.path)
    if not path.is_dir():
        raise ParamsError(f"'outside.{cfg.cell}.path' is {cfg.path!r}: not a directory. Put "
                          f"the checkpoint of adapter {cfg.adapter} there (docs/outside-"
                          "models.md), or fix the path.")
    return path


def model_config(cfg: OutsideConfig) -> Any:
    """The checkpoint's own config (config.json through its layout), weights unread."""
    return loader.read_config(directory(cfg), layout_of(cfg))


def sizing(cfg: OutsideConfig) -> Sizing:
    """Its sizes for the memory checks and `plan`, at the depth it is read at, from
    config.json alone (loader.sizing: parameters counted on the meta device)."""
    return loader.sizing(layout_of(cfg), model_config(cfg), cfg.loops or None)


def depth(cfg: OutsideConfig) -> int:
    """R, the depth it is read at: outside.<name>.loops, else the checkpoint's own (its
    config's mean_recurrence: Huginn's nominal mean, Ouro's total_ut_steps)."""
    return cfg.loops or int(model_config(cfg).mean_recurrence)


def tokenizer(cfg: OutsideConfig) -> Tokenizer:
    """The model's own tokenizer (tokenizer.json of the checkpoint directory)."""
    return loader.read_tokenizer(directory(cfg), model_config(cfg).vocab_size)


def eos_token(cfg: OutsideConfig, tok: Tokenizer) -> tuple[str, int]:
    """The end-of-text token between documents and its id: `outside.<name>.eos`, else
    the layout's; a ParamsError naming the key where the tokenizer lacks it."""
    name = cfg.eos or layout_of(cfg).eos
    found = tok.token_to_id(name)
    if found is None:
        raise ParamsError(f"'outside.{cfg.cell}.eos': the tokenizer of {cfg.path} has no "
                          f"token {name!r}; set outside.{cfg.cell}.eos to its end-of-text "
                          "token.")
    return name, int(found)


def device_of(cfg: OutsideConfig, cuda_available: bool | None = None) -> torch.device:
    """The device it runs on, by the one device rule (compute.device_for)."""
    return compute.device_for(cfg.device, f"outside.{cfg.cell}.device", cuda_available)


def dtype_of(cfg: OutsideConfig, device: torch.device) -> torch.dtype:
    """bf16 on CUDA and fp32 on the CPU under `precision: auto`, else as set
    (compute.uses_bf16, the rule a trained run's precision follows)."""
    bf16 = compute.uses_bf16(cfg.precision, device.type == "cuda")
    return torch.bfloat16 if bf16 else torch.float32


def load(cfg: OutsideConfig, device: torch.device) -> torch.nn.Module:
    """The outside model, in eval mode on `device` in its precision (dtype_of), read at
    depth R = outside.<name>.loops where that is set (passed to the model, which holds
    it in its spec), with its config as `.cfg`."""
    try:
        return loader.load(directory(cfg), layout_of(cfg), dtype_of(cfg, device), device,
                           cfg.loops or None)
    except CheckpointError as err:
        raise CheckpointError(f"outside model '{cfg.cell}': {err}") from None


def resolve(cfg: OutsideConfig) -> OutsideConfig:
    """The config as the configure stage writes it: its layout, directory and
    config.json checked (an unknown adapter, a missing directory or a config.json of
    another layout fails here, before anything runs), device and precision resolved on
    this machine (so a GPU machine writes another file, and the outside stages rerun
    there). An exit mode the layout does not publish fails here too."""
    model_config(cfg)
    modes = layout_of(cfg).exit_modes
    if cfg.exit_mode not in modes:
        raise ParamsError(f"'outside.{cfg.cell}.exit_mode' is {cfg.exit_mode!r}: adapter "
                          f"{cfg.adapter} has {', '.join(modes)} (docs/outside-models.md)")
    device = device_of(cfg)
    precision = "bf16" if dtype_of(cfg, device) == torch.bfloat16 else "fp32"
    return dataclasses.replace(cfg, device=device.type, precision=precision)
