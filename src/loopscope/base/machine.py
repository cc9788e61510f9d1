"""The machine a timing was taken on: every timing names its CPU (the CPU differs
between machines, and a ratio taken on one says little of another)."""

from __future__ import annotations

import functools
import platform
from pathlib import Path


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform reports: every timing
    names the machine it was taken on."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


# The CPU features the kernels the pipeline runs dispatch on (ATen's AVX2/AVX512 code,
# oneDNN's jit, MKL's sgemm): two machines that share a model name can differ here
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16",
                "amx_tile", "avx_vnni")


@functools.cache
def cpu_identity() -> dict[str, str]:
    """The CPU beyond its model name (/proc/cpuinfo): vendor, family, model, stepping,
    microcode, cache size and the kernel-relevant flags. Models, tables and metrics can
    come out in other bytes on two machines that share a model name ("AMD EPYC" is a
    family of generations), and these fields tell the machines apart. Empty where
    /proc/cpuinfo is not there."""
    fields = {"vendor_id": "vendor", "cpu family": "family", "model": "model",
              "stepping": "stepping", "microcode": "microcode", "cache size": "cache"}
    found: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in fields and fields[key] not in found:
                found[fields[key]] = value.strip()
            elif key == "flags" and "flags" not in found:
                have = set(value.split())
                found["flags"] = " ".join(f for f in KERNEL_FLAGS if f in have)
            elif not key and found:
                break  # the first processor's block is enough
    except OSError:
        pass
    return found
