"""What several test files share: the tiny model, its training corpus and cell, the
released layouts' checkpoint writer, loader and loop-by-loop comparison with their
published implementations, and the one from-scratch micro `dvc repro` of the
end-to-end tests (`reproduced`).

Imported as a module (`from conftest import ...`): pytest puts tests/ on sys.path.
"""

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from micro import ROOT, reproduce
from safetensors.torch import save_file
from torch import nn

from loopscope import stage
from loopscope.measure.exit_rules.exits import Policy
from loopscope.released import loader
from loopscope.released.layouts import LAYOUTS
from loopscope.weights.config import CellConfig, TrainConfig
from loopscope.weights.model import LoopedLM, ModelConfig

# Paper A's looped LM at toy size, and paper B's backbone around the same core.
TINY = ModelConfig(vocab_size=64, context=16, d_model=32, n_heads=4, n_core=1, loops=3)
BACKBONE = dataclasses.replace(TINY, n_prelude=1, n_coda=1, loops=4, block="sandwich",
                               inject="concat_adapter", state_init="noise")


def run_stage(script: str, *args: str) -> None:
    """A stage script run as dvc.yaml runs it, through the stage runner (untimed): an
    expected error ends it with SystemExit("error: ...")."""
    stage.main(["--untimed", script, str(ROOT / "stages" / f"{script}.py"), *args])


def run_outside_stage(script: str, *args: str) -> None:
    """A measuring stage's script run on an outside model, as dvc.yaml's outside_*
    stages run it: through stages/outside.py, which loads the released-models package."""
    stage.main(["--untimed", f"outside_{script}", str(ROOT / "stages" / "outside.py"),
                str(ROOT / "stages" / f"{script}.py"), *args])


def random_checkpoint(directory: Path, config: dict, parameters: dict, drop: str = "",
                      extra: dict | None = None, reshape: str = "") -> dict[str, torch.Tensor]:
    """A released layout's checkpoint directory with config.json and seeded random
    weights under the given names and shapes (less `drop`, plus `extra`, `reshape` one
    row short), for the adapters' loading tests; returns the weights."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    g = torch.Generator().manual_seed(0)
    weights = {name: torch.randn(shape, generator=g) for name, shape in parameters.items()
               if name != drop}
    if reshape:
        weights[reshape] = weights[reshape][:-1]
    save_file({**weights, **(extra or {})}, str(directory / "model.safetensors"))
    return weights


def loader_of(layout: str) -> Callable[..., nn.Module]:
    """The shared loader (loopscope.released.loader) with one registered layout:
    load(directory, dtype=torch.float32, device="cpu")."""
    def load(directory: Path, dtype: Any = torch.float32, device: str = "cpu") -> nn.Module:
        return loader.load(directory, LAYOUTS[layout], dtype, device)
    return load


def check_sharded_load(directory: Path, weights: dict[str, torch.Tensor],
                       load: Callable[[Path], nn.Module], first: int = 20) -> None:
    """Split the checkpoint's model.safetensors into two shards (the first `first` names
    in sorted order, then the rest) and the index that maps them, as large released
    checkpoints are stored; then load(directory) must hold every weight, by name."""
    (directory / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[:first],
              "model-00002-of-00002.safetensors": names[first:]}
    for file, part in shards.items():
        save_file({n: weights[n] for n in part}, str(directory / file))
    index = {"weight_map": {n: f for f, part in shards.items() for n in part}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    state = load(directory).state_dict()
    assert all(torch.equal(state[n], weights[n]) for n in names)


@torch.no_grad()
def check_published_loops(model: nn.Module, ref: dict[str, np.ndarray], positions: str,
                          tol: dict[str, float], states: str = "states",
                          initial: Callable[[torch.Tensor], torch.Tensor] | None = None,
                          also: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None
                          ) -> None:
    """A released layout against its published implementation, loop by loop: the inputs
    e, then at every loop k of the reference (reference.npz, its `positions` prefix: ""
    or "spread_") the state H_k = step(carry(H_{k-1})) against ref[states][k - 1] and
    read(H_k) against the published logits. initial(e) gives H_0 where the reference
    holds none (default: its "initial"); also(k, H_k, positions) checks more per loop."""
    def at(name: str) -> torch.Tensor:
        return torch.from_numpy(ref[positions + name])

    pos = at("positions")
    e = model.inputs(torch.from_numpy(ref["tokens"]), positions=pos)
    torch.testing.assert_close(e, at("inputs"), **tol)
    h = at("initial") if initial is None else initial(e)
    for k in range(1, int(ref["steps"]) + 1):
        h = model.step(model.carry(h, first=k == 1), e, k=k, positions=pos)
        torch.testing.assert_close(h, at(states)[k - 1], **tol)
        logits = model.read(h, last=k == model.loops, positions=pos)
        torch.testing.assert_close(logits, at("logits")[k - 1], **tol)
        if also is not None:
            also(k, h, pos)


def tiny_model(**overrides) -> LoopedLM:
    """TINY with overrides, seeded init, in eval mode."""
    torch.manual_seed(0)
    return LoopedLM(dataclasses.replace(TINY, **overrides)).eval()


def tiny_tokens(b: int = 2, t: int = 16) -> torch.Tensor:
    """Random token ids (b, t) from a fixed generator."""
    return torch.randint(0, TINY.vocab_size, (b, t), generator=torch.Generator().manual_seed(1))


def tiny_corpus() -> torch.Tensor:
    """A learnable token stream: a repeating pattern with a little noise."""
    g = torch.Generator().manual_seed(0)
    base = torch.arange(4000) % 17
    return torch.where(torch.rand(4000, generator=g) < 0.05,
                       torch.randint(0, TINY.vocab_size, (4000,), generator=g), base)


def tiny_cell(model: ModelConfig = TINY, **train) -> CellConfig:
    """A cell that trains TINY (or `model`) for 30 steps in about a second."""
    base = dict(steps=30, batch_size=8, lr=3e-3, warmup_steps=3, threads=1, log_every=5)
    return CellConfig("tiny", model, TrainConfig(**{**base, **train}))


class Scripted(Policy):
    """An exit policy that exits each token after a given loop, exit_at (B, T): any
    exit pattern, for testing the exit semantics; it checks every loop."""

    def __init__(self, exit_at: torch.Tensor) -> None:
        super().__init__()
        self.exit_at = exit_at.flatten()

    def check(self, loops, h, logits, idx):
        return self.exit_at.to(idx.device)[idx] == loops


# Every test that uses `reproduced` carries this mark: `--dist loadgroup` (make test-slow)
# sends them all to one worker, so the session's one from-scratch run serves them all.
SHARES_REPRO = pytest.mark.xdist_group("micro_repro")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep `--dist loadgroup` grouping under pytest 9.2. pytest-xdist (3.8) names a test's
    group by suffixing its node id with "@<group>" on the worker, which the controller
    then splits off; pytest 9.2 keeps node ids in a structured `_id`, so xdist's suffix
    is silently lost (pytest-dev/pytest-xdist#1386) and a group's tests spread over the
    workers: each would build its own micro run. This adds the suffix where pytest 9.2
    keeps it, only on a loadgroup worker and only where xdist's own did not take."""
    if not config.getoption("loadgroup", default=False):
        return
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # an older pytest: xdist's own suffix works there
        return
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(groups)
        if groups and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = NodeId.parse(item.nodeid + suffix)


@pytest.fixture
def paper_a(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding two constructed paper A cells (report_data)."""
    from report_data import write_paper_a_cells
    monkeypatch.chdir(tmp_path)
    write_paper_a_cells()
    return tmp_path


@pytest.fixture(scope="session")
def reproduced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The micro pipeline with micro.SEEDS (every cell trains twice), `dvc repro` from
    scratch once for the session: the most expensive state of the end-to-end tests.
    Read it in place, never change it: a test that changes the repository, or runs a dvc
    command that writes (repro, exp, push), works on micro.copy_state of it."""
    return reproduce(tmp_path_factory.mktemp("reproduced"))
