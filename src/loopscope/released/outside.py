"""Loading an outside model (loopscope.weights.outside_config): the adapter its config
names reads the checkpoint directory into a model of the looped-model interface
(loopscope.looped.interface), on the device and in the precision it is measured in.

An adapter is a layout loopscope implements: its config reader (the checkpoint's
config.json, without the weights: what `plan` and the memory checks size it by), its
loader, its tokenizer reader and the end-of-text token its tokenizer separates
documents with. Huginn's is loopscope.released.huginn, Ouro's loopscope.released.ouro.
Precision: fp32 on the CPU, bf16 on a GPU (`precision: auto`; Huginn was trained and
is evaluated in bf16, Ouro is released in bf16); the norms, the rotary embedding and the
logits compute in float32 either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from loopscope.base.errors import CheckpointError, ParamsError
from loopscope.looped.types import Cost
from loopscope.released import huginn, ouro
from loopscope.released.huginn_config import HuginnConfig
from loopscope.released.ouro_config import OuroConfig
from loopscope.weights.outside_config import OutsideConfig


@dataclass(frozen=True)
class Adapter:
    """A layout loopscope reads: config (directory -> its config, read from
    config.json alone: sizes, context, default depth; what preflight.memory.outside_shape
    reads), load (directory, dtype, device -> the model in eval mode), tokenizer
    (directory, config -> its tokenizer), eos (its end-of-text token) and cost (config
    -> forward FLOPs per token of its parts, for `plan`)."""

    config: Callable[[Path], Any]
    load: Callable[..., torch.nn.Module]
    tokenizer: Callable[[Path, Any], Tokenizer]
    eos: str
    cost: Callable[[Any], Cost]


ADAPTERS: dict[str, Adapter] = {
    "huginn": Adapter(HuginnConfig.read, huginn.load_huginn, huginn.read_tokenizer,
                      "<|end_text|>", huginn.cost),
    "ouro": Adapter(OuroConfig.read, ouro.load_ouro, ouro.read_tokenizer, "<|endoftext|>",
                    ouro.cost),
}


def adapter(cfg: OutsideConfig) -> Adapter:
    return ADAPTERS[cfg.adapter]


def directory(cfg: OutsideConfig) -> Path:
    """The checkpoint directory; a ParamsError naming the key where it is not one."""
    path = Path(cfg.path)
    if not path.is_dir():
        raise ParamsError(f"'outside.{cfg.cell}.path' is {cfg.path!r}: not a directory. Put "
                          f"the checkpoint of adapter {cfg.adapter} there (docs/outside-"
                          "models.md), or fix the path.")
    return path


def model_config(cfg: OutsideConfig) -> Any:
    """The checkpoint's own config (config.json through its adapter), weights unread."""
    return adapter(cfg).config(directory(cfg))


def depth(cfg: OutsideConfig) -> int:
    """R, the depth it is read at: outside.<name>.loops, else the checkpoint's own (its
    config's mean_recurrence: Huginn's nominal mean, Ouro's total_ut_steps)."""
    return cfg.loops or int(model_config(cfg).mean_recurrence)


def tokenizer(cfg: OutsideConfig) -> Tokenizer:
    """The model's own tokenizer (tokenizer.json of the checkpoint directory)."""
    return adapter(cfg).tokenizer(directory(cfg), model_config(cfg))


def eos_token(cfg: OutsideConfig, tok: Tokenizer) -> tuple[str, int]:
    """The end-of-text token between documents and its id: `outside.<name>.eos`, else
    the adapter's; a ParamsError naming the key where the tokenizer lacks it."""
    name = cfg.eos or adapter(cfg).eos
    found = tok.token_to_id(name)
    if found is None:
        raise ParamsError(f"'outside.{cfg.cell}.eos': the tokenizer of {cfg.path} has no "
                          f"token {name!r}; set outside.{cfg.cell}.eos to its end-of-text "
                          "token.")
    return name, int(found)


def dtype_of(cfg: OutsideConfig, device: torch.device) -> torch.dtype:
    """bf16 on CUDA and fp32 on the CPU under `precision: auto`, else as set."""
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")
    return torch.bfloat16 if bf16 else torch.float32


def device_of(cfg: OutsideConfig) -> torch.device:
    """cuda where there is one under `device: auto`; a ParamsError for `cuda` without."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ParamsError(f"'outside.{cfg.cell}.device' is 'cuda' but torch sees no CUDA "
                          "device; set it to auto or cpu.")
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    return torch.device("cuda" if cuda else "cpu")


def load(cfg: OutsideConfig, device: torch.device) -> torch.nn.Module:
    """The outside model, in eval mode on `device` in its precision (dtype_of), read at
    depth R = outside.<name>.loops where that is set."""
    try:
        model = adapter(cfg).load(directory(cfg), dtype_of(cfg, device), device)
    except CheckpointError as err:
        raise CheckpointError(f"outside model '{cfg.cell}': {err}") from None
    if cfg.loops:
        model.loops = cfg.loops
    return model


def resolve(cfg: OutsideConfig) -> OutsideConfig:
    """The config as the configure stage writes it: its directory and config.json
    checked through its adapter (a missing directory or a config.json of another layout
    fails here, before anything runs), device and precision resolved on this machine
    (so a GPU machine writes another file, and the outside stages rerun there)."""
    model_config(cfg)
    device = device_of(cfg)
    precision = "bf16" if dtype_of(cfg, device) == torch.bfloat16 else "fp32"
    return dataclasses.replace(cfg, device=device.type, precision=precision)
