"""The trained runs of a cell, and the run of an outside model, ready to measure.

A cell trains once per seed; every stage that measures a cell (extract, diagnose,
clamp, ...) measures each run on the same validation windows, on the device the cell
trained on, in fp32 whatever precision it trained in (loopscope.weights.compute), and pools the
runs. An outside model (a released checkpoint) is one run, measured through the same
interface on its own tokens of the same validation text, in its own precision (bf16 on a
GPU).

Where a run comes from is read from its config (configs/<name>.json: a cell's, or an
outside model's), and each source of runs is registered by name (SOURCES). This module
registers the trained cells'; loopscope.released.runs registers the outside models', so
that only the stages that measure an outside model import the released-models package
(stages/outside.py) and an edit to it reruns no trained cell's measuring.
"""

from __future__ import annotations

import copy
import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from loopscope.base import paths
from loopscope.base.errors import CheckpointError, DataError
from loopscope.looped.interface import LoopedModel
from loopscope.preflight import memory
from loopscope.stats.units import MIN_UNITS, blocks, resampling_units, window_surprisal
from loopscope.weights import compute
from loopscope.weights.checkpoint import load_model
from loopscope.weights.config import CellConfig, load_cell
from loopscope.weights.data import (
    check_context,
    document_ids,
    load_meta,
    load_tokenizer,
    load_tokens,
    window_sets,
    windows_at,
)
from loopscope.weights.outside_config import is_outside, load_outside
from loopscope.weights.tokenizer import EOS

SETS = ("probe", "choose", "report")  # paper B's disjoint window sets
@dataclass
class Windows:
    """Validation windows (inputs, targets on the run's device), where they start, the
    resampling unit of each (loopscope.stats.units), and their initial states (None: H_0 is
    the embedding)."""

    x: Tensor
    y: Tensor
    starts: np.ndarray
    docs: np.ndarray
    h0: Tensor | None
    unit: str = "document"
    parents: np.ndarray | None = None  # the document of each window, for blocks

    def token_docs(self) -> np.ndarray:
        """The resampling unit of every token, in reading order (for intervals)."""
        return np.repeat(self.docs, self.x.shape[1])

    def token_parents(self) -> np.ndarray | None:
        """The document of every token where the units are blocks within documents."""
        return None if self.parents is None else np.repeat(self.parents, self.x.shape[1])


@dataclass
class Run:
    """One run to measure: a trained run of a cell, or an outside model (a released
    checkpoint: loopscope.released.outside). Its tag (seed<N>), the model in eval mode on
    its device, the run's seed (a trained run's train.seed; an outside model's, the seed
    of its random initial states), the validation inputs and targets on that device,
    every validation token with the end-of-text id between its documents, the model's
    sizes for the memory checks, and the windows' initial states (None: H_0 is the
    prelude output; see initial_states).

    trained is how the run trained (device and precision): the throughput stage times it
    so. compute is how every other stage measures it: the same device, in fp32 (an
    outside model: in the precision it was loaded in, bf16 on a GPU)."""

    tag: str
    model: LoopedModel
    seed: int
    x: Tensor
    y: Tensor
    trained: compute.Compute
    val: Tensor  # every validation token, on the CPU
    eos: int  # the end-of-text id that ends each document of val
    shape: memory.Shape  # the model's sizes (memory.check_forward)
    h0: Tensor | None = None
    docs: np.ndarray | None = None  # the resampling unit of each of x's windows
    unit: str = "document"  # what a unit is (loopscope.stats.units)
    cell: CellConfig | None = None  # a trained run's config; None: an outside model

    @property
    def compute(self) -> compute.Compute:
        return self.trained.exact()

    @property
    def context(self) -> int:
        """The windows' length in tokens."""
        return self.x.shape[1]

    @property
    def act_bytes(self) -> int:
        """Bytes per activation: the model's weights' (fp32 4, bf16 2)."""
        return next(self.model.parameters()).element_size()

    token_docs = Windows.token_docs  # the resampling unit of every token of x

    def window_sets(self, per_set: int, what: str) -> dict[str, Windows]:
        """Paper B's three sets of `per_set` windows each (probe training, threshold
        choice, report), from disjoint documents (document_window_sets), the same
        for every cell and seed; what: the param behind per_set, for errors."""
        eos, context = self.eos, self.context
        starts = document_window_sets(self.val, eos, context, per_set, len(SETS), what)
        out = {}
        for name, at in zip(SETS, starts, strict=True):
            x, y = windows_at(self.val, context, at)
            h0 = initial_states(self.model, at, self.seed, context)
            units = resampling_units(document_ids(self.val, eos, at), at,
                                     window_surprisal(self.val.numpy(), at, context),
                                     MIN_UNITS)
            out[name] = Windows(x.to(self.compute.device), y.to(self.compute.device), at,
                                units.ids, h0, units.name, units.parents)
        return out


def document_window_sets(tokens: Tensor, eos_id: int, context: int, per_set: int,
                         sets: int, what: str) -> list[np.ndarray]:
    """Start offsets of `sets` sets of `per_set` non-overlapping windows each, drawn from
    disjoint documents: document j (in split order) belongs to set j mod sets, and a
    window to the document it starts in (document_ids). Windows of one document are
    correlated, so sets that shared documents would not be independent: a threshold
    chosen on one set and measured on another would be measured on what it was chosen
    on. A corpus of fewer documents than sets deals out blocks of consecutive windows
    instead (MIN_UNITS per set). Within a set the windows are spread evenly over its
    documents' windows. what: the param that sets per_set, for the error when a set
    runs short."""
    slots = np.arange((len(tokens) - 1) // context, dtype=np.int64) * context
    owner = document_ids(tokens, eos_id, slots)
    if len(np.unique(owner)) < sets:
        owner = blocks(owner, slots, max(1, len(slots) // (sets * MIN_UNITS)))
    owner = owner % sets
    out = []
    for i in range(sets):
        mine = slots[owner == i]
        if per_set > len(mine):
            raise DataError(
                f"{what} is {per_set}: {sets} sets of that many windows from disjoint "
                f"documents need {per_set} windows of {context} tokens in every set, but "
                f"set {i + 1}'s documents hold {len(mine)}; lower {what} or use a longer "
                "validation split.")
        out.append(mine[np.floor(np.linspace(0, len(mine), per_set, endpoint=False))
                        .astype(np.int64)])
    return out


@torch.no_grad()
def initial_states(model: LoopedModel, starts: np.ndarray, seed: int,
                   context: int | None = None) -> Tensor | None:
    """H_0 of each window (of `context` tokens, default the model's) for a model whose
    H_0 is random (random_state), drawn by the model from a generator seeded by the
    run's seed and the window's start, so every stage and the runtime see the same H_0
    for the same window; None where H_0 is the prelude output."""
    if not model.random_state:
        return None
    weight = next(model.parameters())
    shape = (1, model.context if context is None else context, model.d_model)
    rows = []
    for start in starts.tolist():
        gen = torch.Generator().manual_seed(seed * 1_000_003 + int(start))
        rows.append(model.initial_state(torch.empty(shape), gen))
    return torch.cat(rows).to(weight.device)


def measuring_threads(name: str) -> int | None:
    """The threads a cell's runs are measured on: the cell's train.threads
    (configs/<cell>.json), every one of them, whatever share a run trained on side by
    side (train.seed_processes); None where the config is not there (the run's own)."""
    config = paths.config_file(name)
    return load_cell(config).train.threads if config.is_file() else None


def trained_runs(name: str, val_sequences: int = 1, what: str = "diagnose.val_sequences",
                 only: str | None = None, threads: int | None = None) -> Iterator[Run]:
    """Each trained run of cell `name`, with val_sequences validation windows as data,
    spread evenly over the whole split (every document contributes) and the same for
    every cell and seed; what: the param behind val_sequences, for errors.

    Seeds torch with the run's seed before yielding; a noise initial state comes from
    initial_states, the same in every stage for the same window. Bounds the heap first
    (compute.tune_heap): every measuring stage starts here. only: that run alone (its
    tag, seed<N>); threads: torch's threads (default: measuring_threads).
    """
    compute.tune_heap("measure")
    files = paths.run_files(name)
    if not files:
        raise CheckpointError(f"{paths.model_dir(name)}/: no trained runs; run "
                              f"`dvc repro train@{name}`.")
    tokens = torch.from_numpy(load_tokens(paths.PREPARED, "val"))
    eos = load_tokenizer(paths.PREPARED).token_to_id(EOS)
    threads = threads or measuring_threads(name)
    for path in files if only is None else [f for f in files if f.stem == only]:
        model, cell = load_model(path)
        run_on = compute.resolve(cell.train)
        torch.manual_seed(cell.train.seed)
        torch.set_num_threads(threads or cell.train.threads)
        model.to(run_on.device)
        context = cell.model.context
        check_context(load_meta(paths.PREPARED), context)
        (starts,) = window_sets(len(tokens), context, val_sequences, 1, what)
        x, y = windows_at(tokens, context, starts)
        units = resampling_units(document_ids(tokens, eos, starts), starts,
                                 window_surprisal(tokens.numpy(), starts, context))
        yield Run(path.stem, model, cell.train.seed, x.to(run_on.device),
                  y.to(run_on.device), run_on, tokens, eos,
                  memory.cell_shape(cell, model.num_params()),
                  initial_states(model, starts, cell.train.seed), units.ids, units.name, cell)


def batch_for(name: str, batch_size: int) -> int:
    """The windows per batch a stage runs name's model at: its batch_size key's, or an
    outside model's own (outside.<name>.batch_size) where that is set."""
    if source_of(name) != "outside":
        return batch_size
    return load_outside(paths.config_file(name)).batch_size or batch_size


def exit_mode(name: str) -> str:
    """The exit semantics name's policies run under: "frozen" (ours) for a trained cell,
    an outside model's outside.<name>.exit_mode (masked.masked_forward's freeze)."""
    if source_of(name) != "outside":
        return "frozen"
    return load_outside(paths.config_file(name)).exit_mode


def with_batch(section: Any, batch_size: int) -> Any:
    """A copy of a params section (ConvergenceConfig, PoliciesConfig) whose batch_size
    is batch_size (batch_for), its other keys as they were."""
    found = copy.copy(section)
    object.__setattr__(found, "batch_size", batch_size)
    return found


RunSource = Callable[[str, int, str], Iterator[Run]]
# name -> the runs of a model of that source (name, val_sequences, what); see source_of
SOURCES: dict[str, RunSource] = {"cell": trained_runs}


def register_source(kind: str) -> Callable[[RunSource], RunSource]:
    """A decorator: func gives the runs of models whose config is of this kind."""
    def add(func: RunSource) -> RunSource:
        SOURCES[kind] = func
        return func
    return add


def source_of(name: str) -> str:
    """Where name's runs come from, read from configs/<name>.json: "outside" for an
    outside model's config (a released checkpoint), "cell" for a trained cell's (and
    where the config is not there: trained_runs says what is missing)."""
    config = paths.config_file(name)
    return "outside" if config.is_file() and is_outside(config) else "cell"


def runs_of(name: str, val_sequences: int = 1, what: str = "diagnose.val_sequences"
            ) -> Iterator[Run]:
    """The runs of a cell (trained_runs) or of an outside model (its registered source),
    by what configs/<name>.json says name is."""
    kind = source_of(name)
    if kind not in SOURCES:
        raise CheckpointError(f"{paths.config_file(name)}: '{name}' is an outside model; "
                              "its runs are loaded by the released-models package, which "
                              f"its stages run: `dvc repro outside_extract@{name}` (or any "
                              "outside_* stage; stages/outside.py)")
    return SOURCES[kind](name, val_sequences, what)


T = TypeVar("T")


def map_runs(name: str, measure: Callable[..., T], *args: Any) -> list[T]:
    """measure(run, *args) on each trained run of cell `name` (trained_runs at its
    defaults), in seed order: side by side where the cell trained its runs so
    (configs/<cell>.json's train.seed_processes), one spawned process per run on its
    share of the cell's threads, the share each run trained on; else one after another
    here, on every thread. A run's numbers depend on its thread count alone, which the
    config fixes. measure is a module-level function (the processes import it).
    An outside model's one run is measured here (its registered source)."""
    if source_of(name) != "cell":
        return [measure(run, *args) for run in runs_of(name)]
    config = paths.config_file(name)
    cell = load_cell(config) if config.is_file() else None
    files = paths.run_files(name)
    if cell is None or cell.runs_at_once < 2 or len(files) < 2:
        return [measure(run, *args) for run in trained_runs(name)]
    share = max(1, cell.train.threads // cell.runs_at_once)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(cell.runs_at_once, mp_context=context) as pool:
        jobs = [pool.submit(_measure_one, name, f.stem, share, measure, args) for f in files]
        return [job.result() for job in jobs]


def _measure_one(name: str, tag: str, threads: int, measure: Callable[..., T],
                 args: tuple[Any, ...]) -> T:
    """One run of a cell measured in a process of its own (map_runs)."""
    (run,) = trained_runs(name, only=tag, threads=threads)
    return measure(run, *args)
