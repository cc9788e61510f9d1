"""Memory: the one estimate of what a run needs, and its check against what this process
can use.

`python -m loopscope.tools.plan` prints the estimate; the train stage (before its first step,
before torchrun starts) and the extract, diagnose and clamp stages (at their batch
sizes, before the first batch) compare the same numbers with the memory there is, so a
`model.context: 100000` (a typo for 1000) fails in a second, naming the keys, instead of
filling memory at step 0.

Training, per process, bytes (an estimate, not a measurement):

    weights + grads + AdamW state = params * (4 + 4 + 8)          fp32 master weights
    activations = blocks_kept * tokens * c * d_model * act_bytes / 2
    attention   = blocks_kept * tokens * 5 * n_heads * context * act_bytes / 2
                                                                   Korthikanti et al. 2022
    logits      = tokens * vocab * ((act_bytes + 4) * readouts_kept + 8)

with tokens = batch * context, batch = train.batch_size / train.processes, and
    depth       = model.loops, or the 99th-percentile sampled r for train.depth lognormal
    loops_kept  = min(depth, train.backprop_loops) if backprop_loops > 0, else depth
    readouts    = loops_kept for train.loss per_loop, else 1
    blocks_kept = n_prelude + n_core * loops_kept + n_coda * readouts
    c           = 34 bytes per token and unit of d_model at 16 bits for a pre-norm block
                  with a GELU MLP (Korthikanti's count), + 8 for a sandwich block (its two
                  extra norms), + 16 for SwiGLU (the gate's and the product's 4d tensors);
                  the concat adapter's 2d input adds 4 per loop kept
The coda counts once per readout because LoopedLM.read runs it for every loop that is
read out; each readout keeps its logits and their fp32 log-softmax, and the backward
pass of one readout holds its fp32 gradient and softmax (the + 8). act_bytes = 2
(16-bit activations) when train.precision is bf16, or auto where it resolves to bf16
(CUDA, or a CPU with native bf16: loopscope.weights.compute), else 4.
`attention` is the attention matrices math attention stores; the fused kernels of
scaled_dot_product_attention (flash, on CUDA and the CPU) store none, so the total is an
upper bound there, and the rest (the floor) is what any kernel keeps.

Calibration (tests/test_memory.py): on this project's CPU (fp32, 2 threads), the peak
resident memory a default cell's training adds to its process, above a baseline of
torch with its training machinery loaded (~340 MB), was 1.02-1.24 x the total after 3
steps and 1.13-1.43 x after 30 (the allocator's high-water mark creeps up; measured on
terminal_normed, perloop_normed, perloop_interloop_norm, backbone, backbone_mean4). At
context 128 the attention term stands in for what the formula leaves out (gradients
alive during backward, the allocator's slack). The test holds 3 steps within
MEASURED_RANGE.

Forward only (extract, diagnose, clamp: no graph, one batch at a time):

    weights   = params * 4 (2 for an outside model in bf16)
    states    = (loops + 2) * tokens * d_model * act_bytes       H_0 .. H_K and the input
    block     = tokens * c * d_model * act_bytes / 2             the block running
    attention = tokens * 5 * n_heads * context * act_bytes / 2   (math attention only)
    logits    = tokens * vocab * (act_bytes + 4), when the stage reads states out
    float64 readout (diagnose: Lemma 1's copy of what read() runs, not the whole model)
              = readout_params * 8 + tokens * (3 * vocab * 8 + n_coda * c * d_model * 4
                + 2 * d_model * 8)
An outside model (a released checkpoint: loopscope.released.outside) is sized the same
way from its config.json (outside_shape), at its own precision (bf16 on a GPU).

The check: on the CPU, the limit is the smaller of the available memory psutil reports
(MemAvailable of /proc/meminfo on Linux) and the room left in the process's cgroup (v2
memory.max - memory.current, v1 memory.limit_in_bytes - memory.usage_in_bytes, less
reclaimable page cache; psutil knows no container limits), for all processes training
on this machine together; on CUDA, the device's total memory, per
process. A run whose floor is above USABLE of the limit is refused; one whose total
alone is above it gets a note and runs (it fits if attention is fused).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from loopscope.base.errors import ResourceError
from loopscope.looped.types import Sizing
from loopscope.preflight.disk import format_bytes
from loopscope.weights import compute
from loopscope.weights.config import READS, CellConfig, TrainConfig
from loopscope.weights.depth import sampler
from loopscope.weights.model import ModelConfig, param_count, schedule
from loopscope.weights.outside_config import OutsideConfig

GIB = 1024**3
USABLE = 0.9  # of the limit: the rest for the allocator's slack, page cache, other work
MEASURED_RANGE = (0.9, 1.5)  # measured peak / estimate on the default cells (the test)
BLOCK_BYTES = 34  # pre-norm block, GELU MLP: bytes per token and unit of d at 16 bits
SANDWICH_BYTES = 8  # two more RMSNorm inputs
SWIGLU_BYTES = 16  # the gate's output and the gated product, each 4d
ADAPTER_BYTES = 4  # the concat adapter's input [h, e], 2d, once per loop kept
SANDWICH_BLOCK_BYTES = BLOCK_BYTES + SANDWICH_BYTES  # an outside sandwich block, per d
STABLE_BYTES = 8  # the stable injection's h, e, RMSNorm(e) and B RMSNorm(e), per loop kept
PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")
NO_LIMIT = 1 << 60  # cgroup v1 writes ~2^63 for "no limit"

# The keys the estimate grows with, named in every refusal.
TRAIN_KEYS = ("model.context", "train.batch_size", "model.d_model", "model.loops",
              "tokenizer.vocab_size", "train.processes")
# What to lower, by the largest part of the estimate.
LOWER = {
    "activations": "model.context or train.batch_size (the activations, the largest "
                   "part, grow with both; train.backprop_loops and model.loops also "
                   "count)",
    "logits": "train.batch_size, model.context or tokenizer.vocab_size (the logits are "
              "the largest part)",
    "weights_optimizer": "model.d_model or model.n_core (the weights and AdamW state "
                         "are the largest part)",
}


def num_params(model: ModelConfig) -> int:
    """Unique parameters of LoopedLM(model), the tied head once (model.param_count)."""
    return param_count(model)


def block_bytes(m: ModelConfig) -> int:
    """Activation bytes one block keeps per token at 16 bits, without the attention
    matrix (module docstring: c * d_model)."""
    c = (BLOCK_BYTES + (SANDWICH_BYTES if m.block == "sandwich" else 0)
         + (SWIGLU_BYTES if m.ffn == "swiglu" else 0))
    return c * m.d_model


def attention_bytes(m: ModelConfig) -> int:
    """The attention matrix math attention keeps per token and block at 16 bits: scores,
    softmax and its dropout (Korthikanti's 5 * n_heads * context)."""
    return 5 * m.n_heads * m.context


@dataclass(frozen=True)
class Training:
    """What one training process keeps in memory at its deepest steps."""

    params: int
    depth_p99: int
    loops_kept: int
    readouts: int
    blocks: int  # block applications kept for backward
    act_bytes: int
    batch: int  # windows per process
    parts: dict[str, int]  # weights_optimizer, activations, attention, logits

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def floor(self) -> int:
        """What any attention kernel keeps: all but the attention matrices."""
        return self.total - self.parts["attention"]


def training(cell: CellConfig, cuda: bool, n_params: int | None = None) -> Training:
    """The training estimate of one process (module docstring) on CUDA or the CPU."""
    m, t = cell.model, cell.train
    params = num_params(m) if n_params is None else n_params
    p99 = sampler(t, m.loops).quantile(0.99)
    step = schedule(p99, READS[t.loss], t.backprop_loops)  # the deepest steps
    kept, readouts = step.graph_loops, len(step.read)
    blocks = m.n_prelude + m.n_core * kept + m.n_coda * readouts
    act = 2 if compute.uses_bf16(t.precision, cuda) else 4
    batch = t.batch_size // t.processes
    tokens = batch * m.context
    per_loop = {"concat_adapter": ADAPTER_BYTES, "stable": STABLE_BYTES}.get(m.inject, 0)
    adapter = kept * per_loop * m.d_model
    parts = {
        "weights_optimizer": params * (4 + 4 + 8),
        "activations": tokens * (blocks * block_bytes(m) + adapter) * act // 2,
        "attention": tokens * blocks * attention_bytes(m) * act // 2,
        "logits": tokens * m.vocab_size * ((act + 4) * readouts + 8),
    }
    return Training(params, p99, kept, readouts, blocks, act, batch, parts)


@dataclass(frozen=True)
class Shape:
    """A model's sizes as the forward estimate reads them (forward_parts), from its
    config alone: a trained cell's (cell_shape) or an outside model's (outside_shape)."""

    label: str  # how a refusal names it: "cell 'backbone'", "outside model 'huginn'"
    params: int
    readout_params: int  # what read() runs (coda and head): Lemma 1's float64 copy
    context: int
    d_model: int
    heads: int
    vocab: int
    loops: int  # R, the depth it is read at
    block: int  # activation bytes per token of a block, at 16 bits (block_bytes)
    readout_blocks: int  # the coda's blocks
    keys: str  # the params (and config.json) keys the estimate grows with
    weight_bytes: int = 4  # per weight: fp32 master weights, or an outside model's bf16


def cell_shape(cell: CellConfig, n_params: int | None = None) -> Shape:
    """A trained cell's Shape (LoopedLM of its model config; n_params: a count)."""
    m = cell.model
    d = m.d_model
    ffn = (3 if m.ffn == "swiglu" else 2) * 4 * d * d
    coda = m.n_coda * (4 * d * d + ffn + (4 if m.block == "sandwich" else 2) * d)
    return Shape(f"cell '{cell.cell}'", num_params(m) if n_params is None else n_params,
                 coda + d + m.vocab_size * d, m.context, d, m.n_heads, m.vocab_size, m.loops,
                 block_bytes(m), m.n_coda,
                 f"model.context ({m.context}), model.d_model ({d}), model.loops ({m.loops}) "
                 f"and tokenizer.vocab_size ({m.vocab_size})")


def outside_shape(cfg: OutsideConfig, size: Sizing, weight_bytes: int) -> Shape:
    """An outside model's Shape from its Sizing (the looped-model contract's record of a
    released config: loopscope.released.loader.sizing): a sandwich block with a gated
    MLP keeps about SANDWICH_BLOCK_BYTES d + 6 x intermediate bytes per token at 16 bits
    (its fc output, 2 x intermediate wide, and the gated product)."""
    context = cfg.context or size.context
    where = f"outside.{cfg.cell}"
    return Shape(f"outside model '{cfg.cell}'", size.params, size.readout_params, context,
                 size.d_model, size.n_heads, size.vocab_size, size.loops,
                 SANDWICH_BLOCK_BYTES * size.d_model + 6 * size.intermediate,
                 size.coda_blocks,
                 f"{where}.context ({context}), {where}.loops ({size.loops}) and its "
                 f"config.json's width ({size.d_model}), MLP width ({size.intermediate}) "
                 f"and vocab_size ({size.vocab_size})", weight_bytes)


def forward_parts(s: Shape, batch: int, loops: int, reads: bool, act: int,
                  float64_readout: bool = False) -> dict[str, int]:
    """The forward-only estimate (module docstring) of `batch` windows of a Shape to
    `loops` loops at `act` bytes per activation; float64_readout: with Lemma 1's
    float64 copy of the readout (diagnose), its weights and one readout's logits,
    softmax and gradient and its coda's activations, in float64."""
    tokens = batch * s.context
    parts = {
        "weights": s.params * s.weight_bytes,
        "states": (loops + 2) * tokens * s.d_model * act,
        "block": tokens * s.block * act // 2,
        "attention": tokens * 5 * s.heads * s.context * act // 2,
        "logits": tokens * s.vocab * (act + 4) if reads else 0,
    }
    if float64_readout:
        parts["float64 readout"] = (s.readout_params * 8 + tokens * (
            3 * s.vocab * 8 + s.readout_blocks * s.block * 4 + 2 * s.d_model * 8))
    return parts


def forward(model: ModelConfig, batch: int, loops: int, reads: bool, bf16: bool,
            n_params: int | None = None) -> dict[str, int]:
    """The forward-only estimate (module docstring) of LoopedLM(model): a batch of
    `batch` windows run to `loops` loops without a graph, its states read out one at
    a time if `reads`."""
    cell = CellConfig("", model, TrainConfig())
    return forward_parts(cell_shape(cell, n_params), batch, loops, reads, 2 if bf16 else 4)


# ------------------------------------------------------------------------- the limit


@dataclass(frozen=True)
class Limit:
    """The memory a process can use (bytes) and where the number comes from."""

    bytes: int
    source: str


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2): no limit


def _inactive_file(stat: Path, key: str) -> int:
    """Reclaimable page cache in a cgroup's memory.stat (0 if unreadable)."""
    try:
        for line in stat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_dirs() -> list[tuple[Path, str]]:
    """The memory cgroup folders of this process and their ancestors, with the version
    ("v2" or "v1"), the process's own first. A cgroup namespace shows "/" as the path;
    the mount root is then the process's own cgroup."""
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":
            version, root = "v2", CGROUP_ROOT
        elif "memory" in controllers.split(","):
            version, root = "v1", CGROUP_ROOT / "memory"
        else:
            continue
        here = root / rel.strip("/")
        found += [(folder, version) for folder in (here, *here.parents)
                  if folder == root or root in folder.parents]
    return found


def cgroup_room() -> tuple[int, Path] | None:
    """The smallest room left under a memory limit of this process's cgroups (limit -
    usage, less reclaimable page cache), and the folder of that limit; None if no
    cgroup sets one."""
    best: tuple[int, Path] | None = None
    for folder, version in _cgroup_dirs():
        if version == "v2":
            limit, usage = (_read_int(folder / "memory.max"),
                            _read_int(folder / "memory.current"))
            cache = _inactive_file(folder / "memory.stat", "inactive_file")
        else:
            limit, usage = (_read_int(folder / "memory.limit_in_bytes"),
                            _read_int(folder / "memory.usage_in_bytes"))
            cache = _inactive_file(folder / "memory.stat", "total_inactive_file")
        if limit is None or usage is None or limit >= NO_LIMIT:
            continue
        room = max(0, limit - max(0, usage - cache))
        if best is None or room < best[0]:
            best = (room, folder)
    return best


def mem_available() -> int | None:
    """The bytes the OS can give without swapping, from psutil: MemAvailable of
    /proc/meminfo on Linux (psutil estimates it on kernels without the field), the free
    and reclaimable pages elsewhere (macOS), so the check runs off Linux as well. None
    where psutil cannot tell (an unsupported platform, an unreadable /proc)."""
    try:
        return int(psutil.virtual_memory().available)
    except (OSError, RuntimeError, NotImplementedError, psutil.Error):
        return None


def available(device: torch.device) -> Limit | None:
    """What a process on `device` can use: the device's total memory on CUDA; on the
    CPU the smaller of the OS's available memory (mem_available) and the room in its
    cgroup. None: unknown (neither can be read), and then nothing is checked."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return Limit(props.total_memory, f"the total memory of {device} ({props.name})")
    options = []
    free = mem_available()
    if free is not None:
        options.append(Limit(free, "MemAvailable in /proc/meminfo"
                             if sys.platform.startswith("linux")
                             else "the available memory psutil reports"))
    room = cgroup_room()
    if room is not None:
        options.append(Limit(room[0], f"the room left under the memory limit of the "
                                      f"cgroup {room[1]}"))
    return min(options, key=lambda limit: limit.bytes) if options else None


# ------------------------------------------------------------------------- the checks


def _gib(n: float) -> str:
    return f"{n / GIB:,.1f} GiB" if n >= GIB / 10 else format_bytes(int(n))


def _check(parts: dict[str, int], processes: int, limit: Limit, what: str, keys: str,
           lower: str) -> None:
    """Refuse (ResourceError) when the floor (all parts but the attention matrices) of
    `processes` such processes is above USABLE of the limit; print a note when only the
    total is."""
    usable = int(limit.bytes * USABLE)
    total = sum(parts.values()) * processes
    floor = total - parts.get("attention", 0) * processes
    if floor <= usable:
        if total > usable:
            print(f"note: {what} may not fit: about {_gib(total)} of memory with math "
                  f"attention, {_gib(floor)} with fused attention (scaled_dot_product_"
                  f"attention's flash kernels, the usual case), against {_gib(usable)} "
                  f"usable ({limit.source}).", flush=True)
        return
    split = " + ".join(f"{name.replace('_', ' and ')} {_gib(v)}"
                       for name, v in parts.items() if v and name != "attention")
    each = f"{processes} processes x {_gib(floor // processes)} each: " if processes > 1 else ""
    math = (f"; {_gib(total)} with the attention matrices math attention stores"
            if total > floor else "")
    raise ResourceError(
        f"{what} needs at least about {_gib(floor)} of memory ({each}{split}{math}; an "
        f"estimate, `python -m loopscope.tools.plan` prints it), but this process can use "
        f"{_gib(usable)} ({USABLE:.0%} of {_gib(limit.bytes)}, {limit.source}). The "
        f"estimate grows with {keys}; lower {lower}, or run where there is more memory. "
        "Nothing was run.")


def check_training(cell: CellConfig, device: torch.device) -> None:
    """Refuse a training that will not fit, before its first step (ResourceError).

    On the CPU the processes of train.processes share the machine's memory (torchrun on
    one node; LOCAL_WORLD_SIZE where torchrun was started by hand); on CUDA each has its
    own device. Runs trained side by side (train.seed_processes) share the machine, or
    the device, as many at once as CellConfig.runs_at_once.
    """
    limit = available(device)
    if limit is None:
        return
    est = training(cell, device.type == "cuda")
    m, t = cell.model, cell.train
    values = {"model.context": m.context, "train.batch_size": t.batch_size,
              "model.d_model": m.d_model, "model.loops": m.loops,
              "tokenizer.vocab_size": m.vocab_size, "train.processes": t.processes}
    keys = ", ".join(f"{k} ({values[k]})" for k in TRAIN_KEYS)
    local = cell.runs_at_once * (1 if device.type == "cuda" else
                                 int(os.environ.get("LOCAL_WORLD_SIZE", t.processes)))
    floor = {k: v for k, v in est.parts.items() if k != "attention"}
    largest = max(floor, key=lambda k: floor[k])
    _check(est.parts, local, limit, f"cell '{cell.cell}': training", keys, LOWER[largest])


def check_forward(what: CellConfig | Shape, run_on: compute.Compute, batch_size: int,
                  key: str, stage: str, reads: bool = True, n_params: int | None = None,
                  float64_readout: bool = False, act_bytes: int | None = None) -> None:
    """Refuse a measuring stage whose batches will not fit (ResourceError): `batch_size`
    windows of a cell's model (or an outside model's Shape) at its depth R, key the
    param that sets it, reads whether the stage reads the states out (logits),
    float64_readout whether it holds Lemma 1's float64 copy of the readout (diagnose).
    n_params: the loaded model's count, where the stage has it (num_params' meta-device
    build costs a second of imports in a process that has not used the meta device);
    act_bytes: per activation (default: 2 under a bf16 autocast, else 4)."""
    limit = available(run_on.device)
    if limit is None:
        return
    shape = what if isinstance(what, Shape) else cell_shape(what, n_params)
    act = act_bytes or (2 if run_on.bf16 else 4)
    parts = forward_parts(shape, batch_size, shape.loops, reads, act, float64_readout)
    keys = f"{key} ({batch_size}), {shape.keys}"
    _check(parts, 1, limit, f"{shape.label}: {stage} at {key} {batch_size}", keys, key)
