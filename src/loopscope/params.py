"""The whole of params.yaml: every section validated together, with the rules that tie
sections to each other (the cells named by policies.cells and bench.cell exist; a count
rule's grid reaches R).

The configure stage reads it whenever it changes (and on every `make repro`), so a typo
anywhere in the file fails in a second, before any tokenizer is trained or any step is
taken; the tools (`plan`, `levers`, `bench`) read it too. A stage reads only the keys
it declares, through its package's params module (loopscope.weights.params), so it
imports no other section.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopscope.base.errors import ParamsError
from loopscope.judge.params import ClaimsConfig
from loopscope.measure.exit_rules.rules import RULES, check_grid
from loopscope.measure.params import (
    BenchConfig,
    ConvergenceConfig,
    DiagnoseConfig,
    ExtractConfig,
    PoliciesConfig,
)
from loopscope.measure.recalibrate_params import RecalibrateConfig
from loopscope.render import params as render
from loopscope.render.params import ReportConfig
from loopscope.weights.config import ModelConfig, TrainConfig, choices
from loopscope.weights.outside_config import OutsideConfig
from loopscope.weights.params import (
    PARAMS,
    WHOLE,
    DataConfig,
    TokenizerConfig,
    build,
    cells_of,
    outside_of,
    read_file,
    seeds_of,
    unknown,
)
from loopscope.weights.resolve import resolve_cell

# every section: render's includes all below it, but recalibrate's, declared apart so
# that no other stage depends on it (loopscope.measure.recalibrate_params)
SECTIONS = {**render.SECTIONS, "recalibrate": (RecalibrateConfig, None)}
# Enumerated options: key path -> allowed values, from each field's Literal type.
CHOICES: dict[str, tuple[str, ...]] = {
    f"{section}.{name}": allowed
    for section, (cls, _) in SECTIONS.items() for name, allowed in choices(cls).items()}


@dataclass
class Params:
    """The whole of params.yaml, validated."""

    data: DataConfig
    tokenizer: TokenizerConfig
    model: ModelConfig
    train: TrainConfig
    extract: ExtractConfig
    diagnose: DiagnoseConfig
    convergence: ConvergenceConfig
    policies: PoliciesConfig
    bench: BenchConfig
    claims: ClaimsConfig
    report: ReportConfig
    recalibrate: RecalibrateConfig
    cells: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=list)  # empty: each cell trains with train.seed
    # released models measured beside the cells (loopscope.weights.outside_config)
    outside: dict[str, OutsideConfig] = field(default_factory=dict)


def parse_params(raw: Any) -> Params:
    """Validate a params mapping (as read from params.yaml) and every cell in it."""
    if not isinstance(raw, dict):
        raise ParamsError("params.yaml must be a mapping of sections.")
    for key in raw:
        if key not in SECTIONS and key not in WHOLE:
            raise unknown("", str(key), [*SECTIONS, *WHOLE])
    built = {name: build(name, cls, raw.get(name), check)
             for name, (cls, check) in SECTIONS.items()}
    # The model's vocabulary is the tokenizer's; one number, set in one place.
    if "vocab_size" in (raw.get("model") or {}):
        raise ParamsError("'model.vocab_size' is set by 'tokenizer.vocab_size'; remove it.")
    built["model"].vocab_size = built["tokenizer"].vocab_size
    params = Params(**built, cells=cells_of(raw.get("cells")), seeds=seeds_of(raw.get("seeds")),
                    outside=outside_of(raw.get("outside")))
    for name in params.outside:
        if name in params.cells:
            raise ParamsError(f"'outside.{name}' has the name of a cell; outside models and "
                              "cells share the output folders, so give it another name.")
    for name in params.cells:
        resolve_cell(params, name)  # validates the overrides now, not at training time
    for rule, grid in params.policies.grids.items():
        check_grid(rule, grid)
    check_policy_cells(params)
    return params


def load_params(path: str | Path = PARAMS) -> Params:
    """Read and validate the whole of params.yaml; a ParamsError names the file."""
    raw = read_file(path)
    try:
        return parse_params(raw)
    except ParamsError as err:
        raise ParamsError(f"{Path(path)}: {err}") from None


def check_policy_cells(params: Any) -> None:
    """policies.cells, bench.cell, convergence.kv_reuse and recalibrate.cells name cells
    (dvc.yaml builds stages from policies.cells and recalibrate.cells), and
    every count rule's grid reaches each policy cell's depth R (its conservative end).
    params: the whole file (loopscope.params.Params)."""
    if not params.policies.cells:
        raise ParamsError("'policies.cells' is empty; name at least one cell whose depth "
                          "policies are swept (paper B's backbone, or a paper A cell).")
    for key, names, allowed in (("policies.cells", params.policies.cells, params.cells),
                                ("bench.cell", [params.bench.cell], params.policies.cells),
                                ("convergence.kv_reuse", params.convergence.kv_reuse,
                                 params.cells),
                                ("recalibrate.cells", params.recalibrate.cells, params.cells)):
        for name in names:
            if name not in allowed:
                hint = difflib.get_close_matches(name, list(allowed), n=1)
                where = "one of policies.cells" if key == "bench.cell" else "a cell"
                raise ParamsError(f"'{key}' names '{name}', which is not {where}."
                                  + (f" Did you mean '{hint[0]}'?" if hint else "")
                                  + f" Allowed: {', '.join(allowed)}.")
    if not params.recalibrate.cells:
        raise ParamsError("'recalibrate.cells' is empty; name at least one cell to "
                          "recalibrate (the blind-spot report reads its section from them).")
    for rule in (r for r, v in RULES.items() if v.counts):
        grid = params.policies.grids.get(rule)
        for name in params.policies.cells if grid else []:
            r = resolve_cell(params, name).model.loops
            if grid[-1] < r:
                raise ParamsError(
                    f"'policies.grids.{rule}' ends at {grid[-1]:g} checks; it must reach "
                    f"R = {r} (model.loops of cell '{name}'), a count that cannot fire "
                    "before the cap, so that a setting matching depth R always exists.")


