"""An outside model: a released looped model measured beside the trained cells, named in
params.yaml's `outside:` section by the adapter that reads its checkpoint directory and
the directory, instead of a training recipe.

    outside:
      huginn_0125: {adapter: huginn, path: checkpoints_outside/huginn-0125, loops: 32}

Nothing trains it: the configure stage validates the entry (the keys here, the adapter's
name, the directory and its config.json) and writes it, resolved, to
configs/<name>.json, which the outside stages read (dvc.yaml's `outside_*` stages, over
`outside:`); its validation text is tokenized with its own tokenizer.json
(`outside_prepare@<name>`). This module holds what that file contains and imports no
torch, so the judges read it too; loading the model is loopscope.released.outside's.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from loopscope.base.errors import ParamsError

OutsideDevice = Literal["auto", "cpu", "cuda"]
OutsidePrecision = Literal["auto", "fp32", "bf16"]
OutsideExitMode = Literal["frozen", "published"]


@dataclass
class OutsideConfig:
    """One outside model, resolved: what configs/<name>.json holds. Each field is an
    `outside.<name>.<field>` key of params.yaml (adapter and path required)."""

    cell: str = ""  # its name under `outside:`, the name of its outputs (like a cell's)
    # the layout of the checkpoint directory: a registered layout's name
    # (loopscope.released.layouts: huginn, ouro), checked by the configure stage
    adapter: str = "huginn"
    path: str = ""  # the checkpoint directory (config.json, safetensors, tokenizer.json)
    loops: int = 0  # R, the depth it is read at; 0: the checkpoint's own (Huginn's mean)
    context: int = 0  # the windows' length in its tokens; 0: the model's own context
    eos: str = ""  # the end-of-text token between documents; "": the adapter's own
    # windows per batch in its measuring stages (0: the stages' own batch_size keys):
    # a released model's readout is large, and Lemma 1's float64 copy of it is larger
    batch_size: int = 0
    seed: int = 42  # the seed of its random initial states (its run is seed<seed>)
    threads: int = 2  # torch's CPU threads
    device: OutsideDevice = "auto"  # auto: cuda where there is one
    precision: OutsidePrecision = "auto"  # auto: bf16 on cuda, fp32 on the CPU
    # the exit semantics its policies run under: frozen (ours: an exited token's state,
    # keys and values stay its exit loop's) or published (every token runs to the cap
    # and reads its output at its exit loop, as Ouro's own early exit does; the layouts
    # that publish it: loopscope.released.layouts)
    exit_mode: OutsideExitMode = "frozen"

    def check(self, require: Any) -> None:
        """The ranges types alone do not catch: require(key, condition, rule)."""
        require("path", bool(self.path), "the checkpoint directory (a path)")
        for name in ("loops", "context"):
            require(name, getattr(self, name) >= 0, ">= 0 (0: the checkpoint's own)")
        require("batch_size", self.batch_size >= 0, ">= 0 (0: the stages' own batch_size)")
        require("seed", self.seed >= 0, ">= 0")
        require("threads", self.threads >= 1, ">= 1")

    def to_json(self) -> str:
        """Content-stable bytes, marked as an outside model's config."""
        return json.dumps({"outside": dataclasses.asdict(self)}, indent=2,
                          sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> OutsideConfig:
        return cls(**json.loads(text)["outside"])


def is_outside(path: str | Path) -> bool:
    """Whether a config written by the configure stage is an outside model's (to_json
    marks it) rather than a cell's."""
    try:
        return "outside" in json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ParamsError(f"{path}: not a readable config ({err}); rerun `dvc repro "
                          "configure`.") from None


def load_outside(path: str | Path) -> OutsideConfig:
    """Read an outside model's config written by the configure stage."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: outside model config not found; run `dvc repro` to "
                          "write it.")
    try:
        return OutsideConfig.from_json(path.read_text())
    except (KeyError, TypeError, ValueError) as err:
        raise ParamsError(f"{path}: not an outside model's config ({err}); rerun "
                          "`dvc repro configure`.") from None
