"""The run of an outside model, registered as loopscope.measure.runs' source "outside":
importing this module is what lets the measuring stages' scripts measure a released
checkpoint (stages/outside.py imports it; the trained cells' stages never do).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from loopscope.base import paths
from loopscope.base.errors import DataError
from loopscope.measure.runs import Run, initial_states, register_source
from loopscope.preflight import memory
from loopscope.released import loader, outside
from loopscope.stats.units import resampling_units, window_surprisal
from loopscope.weights import compute
from loopscope.weights.data import document_ids, load_meta, load_tokens, window_sets, windows_at
from loopscope.weights.outside_config import load_outside


@register_source("outside")
def outside_runs(name: str, val_sequences: int = 1, what: str = "diagnose.val_sequences"
                 ) -> Iterator[Run]:
    """The run of outside model `name` (configs/<name>.json: loopscope.released.outside),
    as trained_runs gives a cell's: its own tokens of the validation text
    (prepared_outside/<name>/, the outside_prepare stage's) cut into val_sequences
    windows of outside.<name>.context tokens (default: the model's context) spread over
    the whole split, its random initial states drawn from outside.<name>.seed, on its
    device in its precision (fp32 on the CPU, bf16 on a GPU). One run: tag seed<seed>.
    config.json is read once: the loaded model carries its config (`.cfg`), which sizes
    the memory checks."""
    compute.tune_heap("measure")
    cfg = load_outside(paths.config_file(name))
    prepared = paths.outside_prepared(name)
    meta = load_meta(prepared)
    tokens = torch.from_numpy(load_tokens(prepared, "val"))
    device = outside.device_of(cfg)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    model = outside.load(cfg, device)
    context = cfg.context or model.context
    if context > model.context:
        raise DataError(f"'outside.{name}.context' is {context}, longer than the model's "
                        f"context {model.context}; lower it.")
    if len(tokens) < context + 1:
        raise DataError(f"{prepared}/val.bin holds {len(tokens)} tokens, fewer than one "
                        f"window of {context} + 1; lower outside.{name}.context or use a "
                        "longer validation split.")
    (starts,) = window_sets(len(tokens), context, val_sequences, 1, what)
    x, y = windows_at(tokens, context, starts)
    eos = int(meta["eos_id"])
    units = resampling_units(document_ids(tokens, eos, starts), starts,
                             window_surprisal(tokens.numpy(), starts, context))
    weight_bytes = next(model.parameters()).element_size()
    size = loader.sizing(outside.layout_of(cfg), model.cfg, cfg.loops or None)
    shape = memory.outside_shape(cfg, size, weight_bytes)
    yield Run(paths.seed_tag(cfg.seed), model, cfg.seed, x.to(device), y.to(device),
              compute.Compute(device, False), tokens, eos, shape,
              initial_states(model, starts, cfg.seed, context), units.ids, units.name)
