"""What one cell's training run is: the train options and the resolved cell config.

A *cell* is one trained model. The configure stage resolves each cell of params.yaml
(see loopscope.params) to a CellConfig and writes it to configs/<cell>.json; training
and every stage that measures a model read that file alone. This module holds only what
those files contain, so adding a params.yaml section for a later stage retrains nothing.

Every option string is declared once, as a Literal type on its field; params
validation derives the allowed values from these types (`choices`).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

from loopscope.base.errors import ParamsError

# The options of a model, declared once; params validation derives the allowed values.
Readout = Literal["normed", "raw", "final_norm"]
BlockKind = Literal["prenorm", "sandwich"]
Inject = Literal["none", "add", "concat_adapter", "stable"]
StateInit = Literal["embed", "noise"]
FFN = Literal["gelu", "swiglu"]
Init = Literal["gpt2", "huginn", "paper_a"]
Read = Literal["all", "last", "none"]  # which loops a forward pass reads out


@dataclass
class ModelConfig:
    """The shape of a LoopedLM (loopscope.weights.model): every variant is a value here.
    It lives beside the train options rather than in model.py so that whatever reads a
    cell's config (the claims, the reports) does so without importing torch."""

    vocab_size: int = 2048
    context: int = 128
    d_model: int = 128
    n_heads: int = 4
    n_prelude: int = 0
    n_core: int = 2
    n_coda: int = 0
    loops: int = 4
    readout: Readout = "normed"  # raw before the last loop for final_norm
    block: BlockKind = "prenorm"
    inter_loop_norm: bool = False  # RMSNorm what loop k feeds loop k+1 (see LoopedLM.carry)
    inject: Inject = "none"  # prelude output re-injected at every loop (stable: Parcae's)
    state_init: StateInit = "embed"  # embed (H_0 = prelude output) | noise
    ffn: FFN = "gelu"  # gelu: two 4d matrices | swiglu: gated, three 4d matrices
    init: Init = "gpt2"  # gpt2 | huginn | paper_a: weights, embedding scale (init_weights)
    dropout: float = 0.0


TokenizerKind = Literal["bpe", "word"]  # bpe: byte-level BPE | word: paper A's regex
Loss = Literal["final", "per_loop"]  # loss placement
# Which loops the loss reads out, by loss placement (training, and the memory estimate).
READS: dict[Loss, Read] = {"per_loop": "all", "final": "last"}
DepthName = Literal["fixed", "lognormal"]  # loopscope.weights.depth.SAMPLERS
DepthMean = Literal["loops", "loops_plus_one"]  # E[r] of the lognormal sampler
DeviceName = Literal["auto", "cpu", "cuda"]
Precision = Literal["auto", "fp32", "bf16"]
Schedule = Literal["cosine", "constant"]  # the learning rate after the warm-up
DecayOn = Literal["matrices", "all"]  # the parameters AdamW's weight decay applies to


@dataclass
class TrainConfig:
    """The training recipe of one cell (model shape lives in ModelConfig)."""

    loss: Loss = "per_loop"  # final (last loop only) | per_loop
    norm_penalty: float = 0.0  # lambda * mean over loops of mean(H_k^2)
    depth: DepthName = "fixed"  # fixed: model.loops every step | lognormal: sampled (paper B)
    depth_sigma: float = 0.5  # sigma of the log-normal rate (depth: lognormal)
    depth_mean: DepthMean = "loops"  # loops: E[r] = model.loops | loops_plus_one: Huginn's
    backprop_loops: int = 0  # gradients through the last N loops only (0: all loops)
    steps: int = 600  # optimizer steps (0: derived from epochs)
    epochs: float = 0.0  # passes over the training windows (0: use steps)
    stride: int = 1  # training windows start at multiples of this (1: anywhere)
    batch_size: int = 16
    lr: float = 3e-3
    schedule: Schedule = "cosine"  # after the warm-up: cosine to min_lr_ratio * lr | constant lr
    min_lr_ratio: float = 0.1  # the cosine's floor (unused by a constant schedule)
    warmup_steps: int = 50  # linear warm-up from lr / warmup_steps (0: none)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW's (beta1, beta2)
    weight_decay: float = 0.01
    decay_on: DecayOn = "matrices"  # matrices (not gains, biases) | all: every parameter
    collapse_guard: bool = True  # stop a run whose states collapse (train.check_collapse)
    grad_clip: float = 1.0
    seed: int = 42
    threads: int = 2
    device: DeviceName = "auto"  # auto (cuda if present) | cpu | cuda
    precision: Precision = "auto"  # auto (bf16 autocast on cuda, fp32 on cpu) | fp32 | bf16
    compile: bool = False  # torch.compile the model
    processes: int = 1  # data-parallel processes (torchrun + DDP); batch_size is global
    # a cell's seeds trained at once, each run in its own process on threads /
    # seed_processes threads (two small runs side by side use two cores better than one
    # run on both); 1: one seed after another on every thread; not under train.processes
    seed_processes: int = 1
    log_every: int = 10
    checkpoint_every: int = 50  # steps between resume checkpoints (checkpoints/<cell>/)

    @property
    def samples_depth(self) -> bool:
        """Whether each step's depth is drawn (paper B's randomized depth) rather than
        fixed: every sampler but `fixed` draws (loopscope.weights.depth.SAMPLERS, whose
        `varies` says the same; tests/test_scale.py)."""
        return self.depth != "fixed"


def choices(cls: type) -> dict[str, tuple[str, ...]]:
    """Field name -> allowed values, for each field of a dataclass typed with a Literal."""
    hints = typing.get_type_hints(cls)
    return {f.name: typing.get_args(hints[f.name]) for f in fields(cls)
            if typing.get_origin(hints[f.name]) is Literal}


@dataclass
class CellConfig:
    """Everything one cell's training needs, fully resolved.

    seeds: the training runs of this cell, one per seed (train.seed is the first); a
    run's own config is for_seed(seed).
    """

    cell: str
    model: ModelConfig
    train: TrainConfig
    seeds: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.seeds:
            self.seeds = [self.train.seed]

    @property
    def runs_at_once(self) -> int:
        """How many of the cell's runs train side by side (train.seed_processes, at most
        one per seed); one at a time under data parallelism (train.processes > 1)."""
        if self.train.processes > 1:
            return 1
        return max(1, min(self.train.seed_processes, len(self.seeds)))

    def for_seed(self, seed: int) -> CellConfig:
        """The config of this cell's training run with the given seed: where its seeds
        train side by side (runs_at_once), on its share of train.threads, the thread
        count its numerics are a function of (recorded in the run's own config)."""
        threads = max(1, self.train.threads // self.runs_at_once)
        return CellConfig(cell=self.cell, model=self.model, seeds=[seed],
                          train=dataclasses.replace(self.train, seed=seed, threads=threads))

    def to_json(self) -> str:
        """Content-stable bytes: same config, same file, so DVC sees no change."""
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> CellConfig:
        raw = json.loads(text)
        return cls(cell=raw["cell"], model=ModelConfig(**raw["model"]),
                   train=TrainConfig(**raw["train"]), seeds=raw.get("seeds", []))


def load_cell(path: str | Path) -> CellConfig:
    """Read a resolved cell config written by the configure stage."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: cell config not found; run `dvc repro` to write it.")
    return CellConfig.from_json(path.read_text())
