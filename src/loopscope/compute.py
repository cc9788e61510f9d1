"""Where a run computes: the device and whether it autocasts to bf16, decided once.

Training, every stage that runs a trained model and `plan` ask this module, so a cell
trained on CUDA is also measured there, and `plan --device cuda` assumes what training
would do.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from loopscope.config import TrainConfig
from loopscope.errors import ParamsError


def uses_cuda(device: str, cuda_available: bool | None = None) -> bool:
    """train.device cuda, or auto on a machine with CUDA (cuda_available: assume it)."""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    return device == "cuda" or (device == "auto" and cuda_available)


def uses_bf16(precision: str, cuda: bool) -> bool:
    """train.precision bf16, or auto on CUDA (bf16 autocast; fp32 master weights)."""
    return precision == "bf16" or (precision == "auto" and cuda)


@dataclass(frozen=True)
class Compute:
    """The device of a run and whether its forward passes autocast to bf16."""

    device: torch.device
    bf16: bool

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def describe(self) -> str:
        return str(self.device) + (" bf16" if self.bf16 else "")


def resolve(cfg: TrainConfig) -> Compute:
    """The Compute of train.device and train.precision on this machine.

    Asked for before any step, so `cuda` on a machine without one fails in a second.
    Under torchrun on CUDA each process takes the GPU of its LOCAL_RANK.
    """
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ParamsError("'train.device' is 'cuda' but torch sees no CUDA device; set it to "
                          "auto or cpu (or install a CUDA build of torch).")
    cuda = uses_cuda(cfg.device)
    if cuda and dist.is_initialized():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cuda" if cuda else "cpu")
    return Compute(device, uses_bf16(cfg.precision, cuda))
