"""A third released layout in one file: the registry (loopscope.released.layouts) and
the one loader (loopscope.released.loader) take a layout that is written here, in the
test suite alone, without an edit to the package: registered by its decorator, loaded
from a tiny checkpoint directory (config.json, safetensors, tokenizer.json) with every
name and shape checked, sized from its config on the meta device, read at a depth
passed in, and run loop by loop through the looped-model interface."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from torch import nn

from loopscope.base.errors import CheckpointError, ParamsError
from loopscope.looped.interface import LoopedModel, run_loops
from loopscope.looped.types import Cost, Spec, Specified
from loopscope.released import loader, outside
from loopscope.released.layouts import LAYOUTS, layout, register
from loopscope.weights.outside_config import OutsideConfig


@dataclass(frozen=True)
class ToyConfig:
    """A layout's config.json reader: the sizes the loader and the memory checks read."""

    d_model: int
    n_heads: int
    intermediate: int
    vocab_size: int
    context: int
    mean_recurrence: int

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ToyConfig:
        return cls(**{k: int(raw[k]) for k in ("d_model", "n_heads", "intermediate",
                                               "vocab_size", "context", "mean_recurrence")})


def no_rotary(model: nn.Module, files: Any, device: Any) -> None:
    """This layout has no table to build after loading."""


@register("toy", config=ToyConfig, eos="<eos>", title="the toy's", after_load=no_rotary)
class ToyLM(Specified, nn.Module):
    """H_k = tanh(W [H_{k-1}, e]) from H_0 = 0; read: the tied head over an RMS norm."""

    def __init__(self, cfg: ToyConfig, loops: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.core = nn.Linear(2 * cfg.d_model, cfg.d_model)
        self.spec = Spec(loops=loops or cfg.mean_recurrence, d_model=cfg.d_model,
                         context=cfg.context, prelude_blocks=0, kv_blocks=0, coda_blocks=0,
                         readout_eps=1e-6, random_state=False,
                         nominal_mean=cfg.mean_recurrence,
                         sampler_mean=float(cfg.mean_recurrence))

    exit_score = None

    def inputs(self, idx, positions=None, kvs=None):
        return self.embed(idx)

    def initial_state(self, e, generator=None):
        return torch.zeros_like(e)

    def carry(self, h, first=False):
        return h

    def step(self, h, e, kvs=None, k=None, positions=None):
        return torch.tanh(self.core(torch.cat([h, e], dim=-1)))

    def read(self, h, last=True, positions=None, kvs=None):
        return self.reader()(h, last)

    def reader(self) -> nn.Module:
        return ToyReader(self)

    def cost(self) -> Cost:
        d, v = self.cfg.d_model, self.cfg.vocab_size
        return Cost(prelude=0.0, loop=2 * 2 * d * d, readout=2 * d * v)


class ToyReader(nn.Module):
    def __init__(self, model: ToyLM) -> None:
        super().__init__()
        self.embed = model.embed

    def forward(self, h, last=True):
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return h @ self.embed.weight.T


CONFIG = {"d_model": 8, "n_heads": 2, "intermediate": 16, "vocab_size": 12, "context": 8,
          "mean_recurrence": 3}


def checkpoint(path: Path, **changes: Any) -> Path:
    """A tiny checkpoint directory of the toy layout, weights from a seeded model."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = {**CONFIG, **changes}
    (path / "config.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    save_file({k: v.contiguous() for k, v in ToyLM(ToyConfig(**cfg)).state_dict().items()},
              str(path / "model.safetensors"))
    words = ["<eos>", *[f"w{i}" for i in range(cfg["vocab_size"] - 1)]]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    return path


def test_a_layout_written_in_the_tests_registers_loads_and_runs_loop_by_loop(tmp_path):
    assert layout("toy").model is ToyLM and "toy" in LAYOUTS
    directory = checkpoint(tmp_path / "toy")
    model = loader.load(directory, LAYOUTS["toy"])
    assert isinstance(model, LoopedModel) and isinstance(model.cfg, ToyConfig)
    torch.manual_seed(0)
    reference = ToyLM(ToyConfig(**CONFIG)).eval()
    idx = torch.tensor([[1, 2, 3, 4, 5]])
    _, ours = run_loops(model, idx, 3)
    _, theirs = run_loops(reference, idx, 3)
    for k in range(3):  # every loop's state and logits, bit for bit
        assert torch.equal(ours[k], theirs[k])
        assert torch.equal(model.read(ours[k]), reference.read(theirs[k]))
    assert model.tokenizer.token_to_id("<eos>") == 0


def test_an_outside_entry_of_the_new_layout_goes_through_the_outside_stages_api(tmp_path):
    directory = checkpoint(tmp_path / "toy")
    cfg = OutsideConfig("mine", "toy", str(directory), loops=5)
    assert outside.depth(cfg) == 5 and outside.resolve(cfg).device == "cpu"
    model = outside.load(cfg, torch.device("cpu"))
    assert model.loops == 5  # the read depth passed in, held in the spec
    assert outside.eos_token(cfg, outside.tokenizer(cfg)) == ("<eos>", 0)
    size = outside.sizing(cfg)  # counted on the meta device, equal to what loads
    assert size.params == sum(p.numel() for p in model.parameters())
    assert size.readout_params == model.embed.weight.numel() and size.loops == 5


def test_the_loader_names_the_file_and_parameter_that_do_not_fit(tmp_path):
    directory = checkpoint(tmp_path / "toy")
    (directory / "config.json").write_text(json.dumps({**CONFIG, "d_model": 6}))
    with pytest.raises(CheckpointError, match="does not fit the toy's layout|do not fit the "
                                              "toy's layout: .*embed.weight has shape"):
        loader.load(directory, LAYOUTS["toy"])
    (directory / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match="config.json: not readable JSON"):
        loader.load(directory, LAYOUTS["toy"])


def test_the_registry_refuses_an_unknown_name_and_a_second_layout_of_one_name():
    with pytest.raises(ParamsError, match="'outside.m.adapter' is 'tyo': no such layout; "
                                          "the known ones are huginn, ouro, parcae, toy"):
        layout("tyo", "outside.m.adapter")
    with pytest.raises(ValueError, match="'toy' is registered already"):
        register("toy", config=ToyConfig, eos="<eos>", title="x")(type("Other", (), {}))
