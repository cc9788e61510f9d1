"""docs/methods.md's table of the parameters each model option adds, checked against a
model built with that option: names and shapes (d substituted), so the page's component
prose cannot drift from the code."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from loopscope.weights.config import ModelConfig
from loopscope.weights.model import LoopedLM

METHODS = Path(__file__).resolve().parents[1] / "docs" / "methods.md"
# What each option row builds (the defaults otherwise); "every block": the default model
OPTIONS = {"every block": {}, "block: sandwich": {"block": "sandwich"},
           "ffn: gelu": {"ffn": "gelu"}, "ffn: swiglu": {"ffn": "swiglu"},
           "inject: concat_adapter": {"inject": "concat_adapter"},
           "inject: stable": {"inject": "stable"},
           "inter_loop_norm: true": {"inter_loop_norm": True},
           "readout: normed": {"readout": "normed"}}
BLOCK = ("n1.", "n2.", "n3.", "n4.", "attn.", "mlp.")  # a block's own: read in core.0


def table(text: str) -> list[tuple[str, list[str], str]]:
    """(option, parameter names, shape) of each row of the page's shapes block."""
    block = re.search(r"<!-- begin shapes.*?-->\n(.*?)<!-- end shapes -->", text, re.S)
    assert block, f"{METHODS}: no shapes block"
    rows = []
    for line in block.group(1).splitlines()[2:]:
        option, names, shape = (c.strip() for c in line.strip("|").split("|"))
        rows.append((option.strip("`"), re.findall(r"`([^`]+)`", names), shape))
    return rows


def shape_of(text: str, d: int) -> tuple[int, ...]:
    """"(4d, d)" at d -> (4d, d) as numbers."""
    return tuple(int(p.removesuffix("d") or 1) * d for p in text.strip("()").split(", "))


def built(option: str) -> dict[str, tuple[int, ...]]:
    cfg = dataclasses.replace(ModelConfig(), **OPTIONS[option])
    return {n: tuple(p.shape) for n, p in LoopedLM(cfg).named_parameters()}


@pytest.mark.parametrize("row", table(METHODS.read_text()), ids=lambda r: f"{r[0]}:{r[1][0]}")
def test_each_parameter_the_methods_page_names_has_its_shape(row):
    option, names, shape = row
    d = ModelConfig().d_model
    params = built(option)
    for name in names:
        key = f"core.0.{name}" if name.startswith(BLOCK) else name
        assert key in params, f"methods.md: {option} names `{name}`, the model has no {key}"
        assert params[key] == shape_of(shape, d), (option, name, params[key])


def test_every_parameter_an_option_adds_is_on_the_page():
    """What an option adds over the default model is named on the page, so a new
    parameter fails until the page describes it."""
    rows = table(METHODS.read_text())
    named = {(o, n) for o, names, _ in rows for n in names}
    base = built("every block")
    for option in OPTIONS:
        added = set(built(option)) - set(base)
        own = {n.removeprefix("core.0.") for n in added if not n.startswith(
            ("prelude.", "coda.", "core.1."))}
        assert {(option, n) for n in own} <= named, (option, own)


def test_a_wrong_shape_on_the_page_fails():
    wrong = METHODS.read_text().replace("| `stable.b` | (d, d) |", "| `stable.b` | (d) |")
    row = next(r for r in table(wrong) if r[1] == ["stable.b"])
    with pytest.raises(AssertionError):
        test_each_parameter_the_methods_page_names_has_its_shape(row)
