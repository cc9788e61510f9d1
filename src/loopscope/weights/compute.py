"""Where a run computes: the device and whether it autocasts to bf16, decided once.

Training, every stage that runs a trained model and `plan` ask this module, so a cell
trained on CUDA is also measured there, and `plan --device cuda` assumes what training
would do.

train.precision auto means bf16 autocast on CUDA and fp32 on every CPU. A CPU run's
precision, and so every number it produces, then does not depend on which CPU ran it: a
team on mixed CPUs can pull each other's results instead of retraining them. bf16 on the
CPU stays one `-S train.precision=bf16` away; it pays only where the CPU multiplies bf16
natively (AVX512-BF16 or AMX, native_bf16_cpu), and little even there at d_model 128: on a
2-core Intel Xeon with AMX a training step ran 1.03x its fp32 speed (the step is not
matmul-bound at this size), while on a CPU without them torch emulates bf16 and a step ran
18x slower than fp32 (AVX2-only AMD EPYC). The configure stage writes the resolved
precision into configs/<cell>.json (precision_of), so a machine that resolves auto
differently (a GPU) retrains the cell instead of reusing results made at another precision.

Only training and the throughput stage use a bf16 autocast. The measuring stages compute
norms, KL divergences down to 1e-6 and relative state changes, which bf16 logits cannot
resolve: they run the fp32 master weights in fp32 whatever precision the cell trained in.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from loopscope.base.errors import ParamsError
from loopscope.weights.config import TrainConfig


def uses_cuda(device: str, cuda_available: bool | None = None) -> bool:
    """train.device cuda, or auto on a machine with CUDA (cuda_available: assume it)."""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    return device == "cuda" or (device == "auto" and cuda_available)


def device_for(device: str, key: str, cuda_available: bool | None = None) -> torch.device:
    """The one device rule, for a trained run (train.device) and an outside model
    (outside.<name>.device) alike: cuda for `cuda`, or `auto` where torch sees a CUDA
    device, else the CPU; a ParamsError naming key for `cuda` without one, asked before
    any work so that it fails in a second. cuda_available: assume it (plan, for another
    machine)."""
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if device == "cuda" and not available:
        raise ParamsError(f"'{key}' is 'cuda' but torch sees no CUDA device; set it to auto "
                          "or cpu (or install a CUDA build of torch).")
    return torch.device("cuda" if uses_cuda(device, available) else "cpu")


@functools.cache
def native_bf16_cpu() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX tiles), as torch's
    own CPU feature checks report it (the instructions its bf16 kernels dispatch on)."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def uses_bf16(precision: str, cuda: bool) -> bool:
    """train.precision bf16, or auto on CUDA (bf16 autocast; fp32 master weights). auto
    is fp32 on every CPU, native bf16 or not, so CPU results do not depend on the CPU."""
    if precision != "auto":
        return precision == "bf16"
    return cuda


def precision_of(cfg: TrainConfig, cuda_available: bool | None = None
                 ) -> Literal["fp32", "bf16"]:
    """train.precision resolved on this machine: what configure writes for auto."""
    return "bf16" if uses_bf16(cfg.precision, uses_cuda(cfg.device, cuda_available)) else "fp32"


@dataclass(frozen=True)
class Compute:
    """The device of a run and whether its forward passes autocast to bf16."""

    device: torch.device
    bf16: bool

    @property
    def precision(self) -> str:
        return "bf16" if self.bf16 else "fp32"

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def exact(self) -> Compute:
        """The same device in fp32: how the measuring stages run a trained model."""
        return Compute(self.device, False)

    def describe(self) -> str:
        return str(self.device) + (" bf16" if self.bf16 else "")


def resolve(cfg: TrainConfig) -> Compute:
    """The Compute of train.device and train.precision on this machine.

    Asked for before any step, so `cuda` on a machine without one fails in a second.
    Under torchrun on CUDA each process takes the GPU of its LOCAL_RANK.
    """
    device = device_for(cfg.device, "train.device")
    cuda = device.type == "cuda"
    if cuda and dist.is_initialized():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    return Compute(device, uses_bf16(cfg.precision, cuda))


MEASURE_MMAP_BYTES = 4 << 20  # measuring: allocations from this size on get own pages
KEEP_BYTES = (1 << 31) - 1  # training: never give freed memory back


def tune_heap(work: Literal["train", "measure"]) -> None:
    """Set glibc's malloc for the work ahead (elsewhere a no-op).

    By default glibc gives large freed blocks back to the OS and moves its mmap
    threshold as it sees them, so the same sizes land sometimes on the heap and
    sometimes in fresh pages. train: a training step allocates the same tensors every
    step, so keep freed memory for the next one (no page faults after the first step;
    13-16% more tokens/s on this project's 2-core CPU, at the same peak). measure:
    measurement loops allocate tensors of many sizes, which fragment a heap that keeps
    them (a convergence stage needing 0.6 GiB peaked anywhere from 2 to 4.7 GiB), so
    give every block from 4 MiB up its own pages: the peak stays near the working set,
    at the same speed for convergence and about 20% slower for diagnose (its page
    faults), a few seconds per cell.
    """
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt"):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    if work == "train":
        libc.mallopt(m_trim_threshold, KEEP_BYTES)
        libc.mallopt(m_mmap_threshold, KEEP_BYTES)
    else:
        libc.mallopt(m_mmap_threshold, MEASURE_MMAP_BYTES)
