"""params.yaml: loading, validation and per-cell resolution.

Every stage that reads params.yaml calls :func:`load_params` first, so a typo or an
impossible value fails in about a second, with the key path, the bad value and what is
allowed, before any tokenizer is trained or any step is taken.

A *cell* is one trained model: a name plus a few overrides of the shared ``model:``
and ``train:`` blocks. :func:`resolve_cell` turns a cell into a complete,
content-stable config (loopscope.config.CellConfig); the ``configure`` stage writes one
file per cell, and each cell's training depends on its file alone, so a param change
reruns exactly the cells whose resolved config changed.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from loopscope import paths
from loopscope.config import CellConfig, TrainConfig, choices
from loopscope.depth import SAMPLERS
from loopscope.errors import ParamsError
from loopscope.model import ModelConfig
from loopscope.tokenizer import TokenizerKind


@dataclass
class DataConfig:
    """Where the raw corpus lives and how it is split."""

    dir: str = "data"
    val_fraction: float = 0.1  # held-out tail of every document (no validation.txt)
    hub: str = ""  # a HF hub dataset fetched into dir (empty: the embedded corpus)
    hub_config: str = ""  # the hub dataset's configuration, if it has several
    text_field: str = "text"  # the hub dataset's text column
    hub_documents: int = 0  # first N documents of each split (0: the whole split)


@dataclass
class TokenizerConfig:
    """The tokenizer trained by the prepare stage."""

    kind: TokenizerKind = "bpe"  # bpe: byte-level BPE | word: paper A's word-level regex
    vocab_size: int = 2048
    min_frequency: int = 0  # rarer pieces are not learned (word: they become <unk>)


@dataclass
class ExtractConfig:
    """The fixed validation slice whose per-loop hidden states are saved."""

    val_sequences: int = 64
    batch_size: int = 16


@dataclass
class DiagnoseConfig:
    """How much validation text the depth sweep, clamp and timing read, how deep the
    sweep runs, and the intervals and margin of paper A's verdicts."""

    val_sequences: int = 64
    batch_size: int = 16
    loops: int = 30  # the depth sweep runs this many loops (at least the cell's K)
    bootstrap: int = 1000  # document resamples behind every paper A interval
    margin_nats: float = 0.01  # a claim of no effect holds inside +-this (nats)
    timing_repeats: int = 3  # throughput: rounds (every cell and depth once); median
    timing_windows: int = 32  # throughput: the first this many of the windows are timed


def _list(*values: Any) -> Any:
    return field(default_factory=lambda: list(values))


@dataclass
class ConvergenceConfig:
    """Paper B's convergence measurements, on every cell."""

    depth_factor: int = 4  # uniform depths 1 .. factor x R, the evaluation depth
    epsilon: float = 1e-3  # a token has converged once KL stays below this
    windows: int = 128  # validation windows per set (3 sets: probe, choose, report)
    tolerance: float = 0.01  # elasticity and flatness: a change within this (nats) is none
    useful_share: float = 0.02  # useful depth: within this share of CE(1) - CE(best)
    sensitivity_nats: list[float] = _list(0.001, 0.003, 0.01, 0.02)
    sensitivity_shares: list[float] = _list(0.01, 0.02, 0.05, 0.1)
    bootstrap: int = 1000  # resamples of documents behind every interval
    batch_size: int = 16


# The exit rules a policies grid may name, with their default thresholds: the rules'
# `default` / `defaults` in loopscope.policies (tests/test_policies.py checks that the
# two agree). Listed here rather than imported, since every stage imports this module
# and dvc.yaml would then make every stage depend on the policies.
RULE_DEFAULTS: dict[str, tuple[float, ...]] = {
    "kl": (1e-3,), "kl-huginn": (1e-3, 5e-4), "minp-kl": (1e-5,), "entropy-diff": (1e-3,),
    "latent-diff": (0.03,), "cosine": (1e-3,), "argmax-stability": (5.0,), "probe": (0.5,),
}
# Rules whose threshold counts checks (whole numbers >= 1): their conservative end is a
# count of at least R, which cannot fire before the cap; every other rule's is 0.
COUNT_RULES = ("argmax-stability",)


def doublings(anchor: float, low: int, high: int) -> list[float]:
    """0, then anchor x 2^k for k = low..high: a grid through the default whose steps
    are 2x, down to the conservative end."""
    return [0.0] + [anchor * 2.0 ** k for k in range(low, high + 1)]


def default_grids() -> dict[str, list[float]]:
    """The threshold grids params.yaml ships (see its policies section)."""
    return {"kl": doublings(1e-3, -6, 7), "kl-huginn": doublings(1e-3, -6, 7),
            "minp-kl": doublings(1e-5, -2, 12), "entropy-diff": doublings(1e-3, -4, 8),
            "latent-diff": doublings(0.03, -5, 4), "cosine": doublings(1e-3, -6, 6),
            "argmax-stability": [1.0, 2.0, 3.0, 4.0, 5.0, 8.0],
            "probe": doublings(0.5, -9, 0)}


@dataclass
class PoliciesConfig:
    """Paper B's depth policies: threshold grids, the matching rule, the check schedule."""

    cells: list[str] = _list()  # the cells whose policies are swept (at least one)
    match_nats: float = 0.01  # matched quality: mean CE within this of uniform depth R
    grids: dict[str, list[float]] = field(default_factory=default_grids)  # rule -> thresholds
    first: int = 1  # first loop with a check
    every: int = 1  # loops between checks
    cross_epsilon: float = 1e-3  # A1 on every cell, capped at depth_factor x R
    batch_size: int = 16


@dataclass
class BenchConfig:
    """The exit benchmark (python -m loopscope.bench exits)."""

    cell: str = ""  # the cell timed (one of policies.cells)
    repeats: int = 5  # timed rounds per configuration (>= 3); the median is reported
    decode_tokens: int = 64  # tokens decoded per stream


@dataclass
class ReportConfig:
    """Which notebooks the report stage renders."""

    timeout_s: int = 600


SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "tokenizer": TokenizerConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "extract": ExtractConfig,
    "diagnose": DiagnoseConfig,
    "convergence": ConvergenceConfig,
    "policies": PoliciesConfig,
    "bench": BenchConfig,
    "report": ReportConfig,
}

# Enumerated options: key path -> allowed values, from each field's Literal type.
CHOICES: dict[str, tuple[str, ...]] = {
    f"{section}.{name}": allowed
    for section, cls in SECTIONS.items() for name, allowed in choices(cls).items()}

# Sections a cell may override.
CELL_SECTIONS = ("model", "train")
CELL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


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
    report: ReportConfig
    cells: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=list)  # empty: each cell trains with train.seed


def _seeds(raw: Any, key: str = "seeds") -> list[int]:
    """An optional seeds list (top-level `seeds`, or a cell's own `cells.<name>.seeds`,
    which replaces it for that cell): the cell trains once per seed."""
    if raw is None:
        return []
    if (not isinstance(raw, list)
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in raw)
            or len(set(raw)) != len(raw)):
        raise ParamsError(f"'{key}' is {raw!r}; it must be a list of distinct integers >= 0 "
                          "(or left out or empty: a cell's own falls back to the top-level "
                          "'seeds', that to train.seed).")
    return list(raw)


def _unknown(path: str, key: str, known: list[str]) -> ParamsError:
    where = f"{path}.{key}" if path else key
    hint = difflib.get_close_matches(key, known, n=1)
    did_you_mean = f" Did you mean '{hint[0]}'?" if hint else ""
    return ParamsError(
        f"unknown key '{where}'.{did_you_mean} Known keys here: {', '.join(sorted(known))}."
    )


def _coerce(path: str, value: Any, default: Any, hint: Any = None) -> Any:
    """Check one value against the type of its default (for a list, the element type
    of its hint); ints are accepted as floats."""
    kind = type(default)
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif kind is dict:  # a mapping of names to lists of numbers (policies.grids)
        if not isinstance(value, dict):
            raise ParamsError(f"'{path}' must be a mapping of names to lists of numbers, "
                              f"got {value!r}.")
        return {str(k): _coerce(f"{path}.{k}", v, []) for k, v in value.items()}
    elif kind is list and typing.get_args(hint) == (str,):
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    elif kind is list:
        ok = isinstance(value, list) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        value = [float(v) for v in value] if ok else value
    else:
        ok = isinstance(value, kind)
    if not ok:
        items = "names" if typing.get_args(hint) == (str,) else "numbers"
        what = f"list of {items}" if kind is list else kind.__name__
        hint = (" (YAML reads 1e-3 as text: write 1.0e-3)"
                if re.search(r"\de-?\d", str(value)) else "")
        raise ParamsError(f"'{path}' must be a {what}, got {value!r}{hint}.")
    allowed = CHOICES.get(path)
    if allowed is not None and value not in allowed:
        raise ParamsError(
            f"'{path}' is {value!r}; allowed values: {', '.join(allowed)}."
        )
    return value


def _build(section: str, cls: type, raw: Any) -> Any:
    """Build a section dataclass from a mapping, rejecting unknown keys and bad types."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ParamsError(f"'{section}' must be a mapping of keys to values, got {raw!r}.")
    defaults = cls()
    known = [f.name for f in fields(cls)]
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in raw.items():
        if key not in known:
            raise _unknown(section, str(key), known)
        values[key] = _coerce(f"{section}.{key}", value, getattr(defaults, key), hints[key])
    obj = cls(**values)
    _check_ranges(section, obj)
    return obj


def _require(cond: bool, path: str, value: Any, rule: str) -> None:
    if not cond:
        raise ParamsError(f"'{path}' is {value!r}; it must be {rule}.")


def _check_ranges(section: str, obj: Any) -> None:
    """Ranges that types alone do not catch."""
    def req(name: str, cond: bool, rule: str) -> None:
        _require(cond, f"{section}.{name}", getattr(obj, name), rule)

    if isinstance(obj, DataConfig):
        req("val_fraction", 0.0 < obj.val_fraction < 0.5, "between 0 and 0.5 (exclusive)")
        req("hub_documents", obj.hub_documents >= 0, ">= 0 (0: the whole split)")
        req("text_field", bool(obj.text_field), "a column name")
        if obj.hub_config:
            req("hub", bool(obj.hub), "set when data.hub_config is set")
    elif isinstance(obj, TokenizerConfig):
        low = 260 if obj.kind == "bpe" else 8
        req("vocab_size", low <= obj.vocab_size <= 1_000_000,
            f"at least {low} ({'256 bytes plus specials' if obj.kind == 'bpe' else 'specials'}"
            ") and at most 1000000")
        req("min_frequency", obj.min_frequency >= 0, ">= 0")
    elif isinstance(obj, ModelConfig):
        for name in ("d_model", "n_heads", "n_core", "loops", "context", "vocab_size"):
            req(name, getattr(obj, name) >= 1, ">= 1")
        for name in ("n_prelude", "n_coda"):
            req(name, getattr(obj, name) >= 0, ">= 0")
        req("d_model", obj.d_model % obj.n_heads == 0,
            f"divisible by model.n_heads ({obj.n_heads})")
        req("dropout", 0.0 <= obj.dropout < 1.0, "in [0, 1)")
    elif isinstance(obj, TrainConfig):
        for name in ("batch_size", "threads", "log_every", "checkpoint_every", "stride",
                     "processes"):
            req(name, getattr(obj, name) >= 1, ">= 1")
        req("epochs", obj.epochs >= 0, ">= 0")
        if obj.epochs > 0:
            req("steps", obj.steps == 0, "0 when train.epochs is set (set one of the two)")
        else:
            req("steps", obj.steps >= 1, ">= 1 (or 0 with train.epochs > 0)")
            req("warmup_steps", obj.warmup_steps <= obj.steps,
                f"at most train.steps ({obj.steps})")
        req("batch_size", obj.batch_size % obj.processes == 0,
            f"divisible by train.processes ({obj.processes}): it is the global batch")
        req("depth_sigma", obj.depth_sigma > 0, "> 0")
        req("backprop_loops", obj.backprop_loops >= 0, ">= 0 (0: all loops)")
        req("lr", obj.lr > 0, "> 0")
        req("norm_penalty", obj.norm_penalty >= 0, ">= 0")
        req("weight_decay", obj.weight_decay >= 0, ">= 0")
        req("grad_clip", obj.grad_clip > 0, "> 0")
        req("warmup_steps", obj.warmup_steps >= 0, ">= 0")
        req("min_lr_ratio", 0.0 <= obj.min_lr_ratio <= 1.0, "in [0, 1]")
        req("betas", len(obj.betas) == 2 and all(0.0 <= b < 1.0 for b in obj.betas),
            "two numbers in [0, 1), AdamW's [beta1, beta2]")
        req("seed", obj.seed >= 0, ">= 0")
    elif isinstance(obj, (ExtractConfig, DiagnoseConfig)):
        req("val_sequences", obj.val_sequences >= 1, ">= 1")
        req("batch_size", obj.batch_size >= 1, ">= 1")
        if isinstance(obj, DiagnoseConfig):
            req("timing_repeats", obj.timing_repeats >= 1, ">= 1")
            req("timing_windows", obj.timing_windows >= 1, ">= 1")
            req("loops", 1 <= obj.loops <= 1000, "in [1, 1000]")
            req("bootstrap", obj.bootstrap >= 100, ">= 100 (fewer gives unstable intervals)")
            req("margin_nats", obj.margin_nats > 0, "> 0")
    elif isinstance(obj, ConvergenceConfig):
        req("depth_factor", obj.depth_factor >= 1, ">= 1")
        req("epsilon", obj.epsilon > 0, "> 0")
        for name in ("windows", "bootstrap", "batch_size"):
            req(name, getattr(obj, name) >= 1, ">= 1")
        req("tolerance", obj.tolerance >= 0, ">= 0")
        req("useful_share", 0 < obj.useful_share < 1, "in (0, 1)")
        req("sensitivity_nats", all(v >= 0 for v in obj.sensitivity_nats),
            "a list of tolerances >= 0 (nats)")
        req("sensitivity_shares", all(0 < v < 1 for v in obj.sensitivity_shares),
            "a list of shares in (0, 1)")
    elif isinstance(obj, PoliciesConfig):
        req("match_nats", obj.match_nats > 0, "> 0")
        req("grids", bool(obj.grids), "a mapping of at least one rule to its thresholds")
        for rule, grid in obj.grids.items():
            _check_grid(rule, grid)
        for name in ("first", "every", "batch_size"):
            req(name, getattr(obj, name) >= 1, ">= 1")
        req("cross_epsilon", obj.cross_epsilon > 0, "> 0")
    elif isinstance(obj, BenchConfig):
        req("repeats", obj.repeats >= 3, ">= 3 (every mode is a median of interleaved rounds)")
        req("decode_tokens", obj.decode_tokens >= 1, ">= 1")
    elif isinstance(obj, ReportConfig):
        req("timeout_s", obj.timeout_s >= 1, ">= 1")


def _check_grid(rule: str, grid: list[float]) -> None:
    """One rule's threshold grid: ascending, steps at most 2x apart, the rule's default(s)
    in it, down to the conservative end (0 for a distance or probability: nothing is
    below it, so no token exits and the rule is uniform depth R), so that a setting
    matching depth R always exists and the matched one lies close to the margin. A count
    rule's end (at least R) needs the cells: _check_policy_cells."""
    path = f"policies.grids.{rule}"
    if rule not in RULE_DEFAULTS:
        hint = difflib.get_close_matches(rule, list(RULE_DEFAULTS), n=1)
        raise ParamsError(f"'policies.grids' names an unknown rule '{rule}'."
                          + (f" Did you mean '{hint[0]}'?" if hint else "")
                          + f" Known rules: {', '.join(RULE_DEFAULTS)} (A0, uniform depth, "
                          "is always measured and has no grid).")
    _require(bool(grid), path, grid, "a non-empty list of thresholds")
    _require(all(b > a for a, b in zip(grid, grid[1:], strict=False)), path, grid,
             "sorted ascending, without repeats")
    if rule in COUNT_RULES:
        _require(all(v >= 1 and v == int(v) for v in grid), path, grid,
                 "whole numbers of stable checks, >= 1")
    else:
        _require(grid[0] >= 0, path, grid, "thresholds >= 0")
        _require(grid[0] == 0, path, grid,
                 "down to 0, the conservative end (nothing is below 0: no token exits, "
                 "uniform depth R), so that a setting matching depth R always exists")
    if rule == "probe":
        _require(grid[-1] < 1, path, grid, "probabilities below 1")
    positive = [v for v in grid if v > 0]
    for a, b in zip(positive, positive[1:], strict=False):
        if b > 2 * a * (1 + 1e-9):
            raise ParamsError(f"'{path}' jumps from {a:g} to {b:g} ({b / a:.3g}x); "
                              "consecutive thresholds must be at most 2x apart, so that the "
                              "matched setting lies close to the matching margin.")
    for d in RULE_DEFAULTS[rule]:
        if not any(abs(v - d) <= 1e-9 * d for v in grid):
            raise ParamsError(f"'{path}' lacks the rule's default threshold {d:g} "
                              f"(defaults: {', '.join(f'{x:g}' for x in RULE_DEFAULTS[rule])}); "
                              "add it, so that the default is evaluated.")


def parse_params(raw: Any) -> Params:
    """Validate a params mapping (as read from params.yaml) and every cell in it."""
    if not isinstance(raw, dict):
        raise ParamsError("params.yaml must be a mapping of sections.")
    known = list(SECTIONS) + ["cells", "seeds"]
    for key in raw:
        if key not in known:
            raise _unknown("", str(key), known)
    built = {name: _build(name, cls, raw.get(name)) for name, cls in SECTIONS.items()}
    # The model's vocabulary is the tokenizer's; one number, set in one place.
    if "vocab_size" in (raw.get("model") or {}):
        raise ParamsError("'model.vocab_size' is set by 'tokenizer.vocab_size'; remove it.")
    built["model"] = dataclasses.replace(built["model"], vocab_size=built["tokenizer"].vocab_size)
    cells = raw.get("cells")
    if not isinstance(cells, dict) or not cells:
        raise ParamsError("'cells' must map at least one cell name to its overrides.")
    params = Params(**built, cells={}, seeds=_seeds(raw.get("seeds")))
    for name, overrides in cells.items():
        if not isinstance(name, str) or not CELL_NAME.match(name):
            raise ParamsError(
                f"cell name {name!r} must start with a letter and use only letters, "
                "digits and '_'."
            )
        overrides = overrides or {}
        if not isinstance(overrides, dict):
            raise ParamsError(f"'cells.{name}' must be a mapping, got {overrides!r}.")
        for section in overrides:
            if section not in (*CELL_SECTIONS, "seeds"):
                raise _unknown(f"cells.{name}", str(section), [*CELL_SECTIONS, "seeds"])
        params.cells[name] = overrides
        resolve_cell(params, name)  # validates the overrides now, not at training time
    _check_policy_cells(params)
    return params


def _check_policy_cells(params: Params) -> None:
    """policies.cells and bench.cell name cells (dvc.yaml builds stages from them), and
    every count rule's grid reaches each policy cell's depth R (its conservative end)."""
    if not params.policies.cells:
        raise ParamsError("'policies.cells' is empty; name at least one cell whose depth "
                          "policies are swept (paper B's backbone, or a paper A cell).")
    for key, names, allowed in (("policies.cells", params.policies.cells, params.cells),
                                ("bench.cell", [params.bench.cell], params.policies.cells)):
        for name in names:
            if name not in allowed:
                hint = difflib.get_close_matches(name, list(allowed), n=1)
                where = "a cell" if key == "policies.cells" else "one of policies.cells"
                raise ParamsError(f"'{key}' names '{name}', which is not {where}."
                                  + (f" Did you mean '{hint[0]}'?" if hint else "")
                                  + f" Allowed: {', '.join(allowed)}.")
    for rule in COUNT_RULES:
        grid = params.policies.grids.get(rule)
        for name in params.policies.cells if grid else []:
            r = resolve_cell(params, name).model.loops
            if grid[-1] < r:
                raise ParamsError(
                    f"'policies.grids.{rule}' ends at {grid[-1]:g} checks; it must reach "
                    f"R = {r} (model.loops of cell '{name}'), a count that cannot fire "
                    "before the cap, so that a setting matching depth R always exists.")


def load_params(path: str | Path = paths.PARAMS) -> Params:
    """Read and validate params.yaml; raise ParamsError naming the file on any problem."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: file not found (run from the repository root).")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {err}") from err
    try:
        return parse_params(raw)
    except ParamsError as err:
        raise ParamsError(f"{path}: {err}") from None


def resolve_cell(params: Params, name: str) -> CellConfig:
    """Apply a cell's overrides to the shared model and train blocks, and validate."""
    if name not in params.cells:
        raise ParamsError(f"unknown cell '{name}'; cells: {', '.join(params.cells)}.")
    overrides = params.cells[name]
    sections = {}
    for section in CELL_SECTIONS:
        base = dataclasses.asdict(getattr(params, section))
        extra = overrides.get(section) or {}
        if not isinstance(extra, dict):
            raise ParamsError(f"'cells.{name}.{section}' must be a mapping, got {extra!r}.")
        if section == "model" and "vocab_size" in extra:
            raise ParamsError(f"'cells.{name}.model.vocab_size' is set by "
                              "'tokenizer.vocab_size'; remove it.")
        for key in extra:
            if key not in base:
                raise _unknown(f"cells.{name}.{section}", str(key), list(base))
        if section == "train":
            # A cell's own training length replaces the shared one, in either unit.
            if "steps" in extra and "epochs" not in extra:
                base["epochs"] = 0.0
            if "epochs" in extra and "steps" not in extra:
                base["steps"] = 0
        try:
            sections[section] = _build(section, SECTIONS[section], {**base, **extra})
        except ParamsError as err:
            raise ParamsError(f"in cell '{name}': {err}") from None
    seeds = _seeds(overrides.get("seeds"), f"cells.{name}.seeds") or params.seeds
    if seeds:
        if "seed" in (overrides.get("train") or {}):
            where = f"'cells.{name}.seeds'" if "seeds" in overrides else "the top-level 'seeds'"
            raise ParamsError(f"'cells.{name}.train.seed' has no effect while {where} list "
                              f"is set ({seeds}); remove one of them.")
        sections["train"] = dataclasses.replace(sections["train"], seed=seeds[0])
    _check_cell(name, sections["model"], sections["train"])
    return CellConfig(cell=name, **sections, seeds=list(seeds))


def _check_cell(name: str, model: ModelConfig, train: TrainConfig) -> None:
    """Rules that tie the model and train blocks of one cell together."""
    where = f"in cell '{name}': "
    why = SAMPLERS[train.depth].check(model.loops)
    if why:
        raise ParamsError(f"{where}'model.loops' is {model.loops}; with train.depth "
                          f"'{train.depth}' {why}.")
    if train.stride > model.context:
        raise ParamsError(f"{where}'train.stride' is {train.stride}; it must be at most "
                          f"model.context ({model.context}), or tokens are never trained on.")
