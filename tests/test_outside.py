"""Outside models: a released checkpoint as a cell kind of its own. params.yaml's
`outside:` is validated with its key paths; the configure stage resolves it; the
outside stages tokenize the validation text with the model's own tokenizer and run the
measuring stages' scripts on it (through stages/outside.py) through the looped-model interface; the
claims show its rows apart, as extensions; `plan` sizes it from its config.json and
refuses what cannot fit. Here on Huginn's layout at a tiny config
(tests/fixtures/huginn_tiny); tests/test_pipeline.py runs it through `dvc repro`."""

import json
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import run_outside_stage, run_stage

from loopscope.base import paths
from loopscope.base.errors import ParamsError, ResourceError
from loopscope.judge import outside as judged
from loopscope.judge.claims import SCHEMA
from loopscope.params import parse_params
from loopscope.preflight import memory
from loopscope.released import outside
from loopscope.tools import plan_outside
from loopscope.weights.outside_config import OutsideConfig, load_outside
from loopscope.weights.tokenizer import encode

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "huginn_tiny"
MICRO = yaml.safe_load((ROOT / "tests" / "micro_params.yaml").read_text())


def with_outside(spec: dict | None, name: str = "huginn_tiny") -> dict:
    return {**MICRO, "outside": {name: spec} if spec is not None else {}}


# ---------------------------------------------------------------------- the params


def test_an_outside_entry_is_validated_with_its_key_path():
    found = parse_params(with_outside({"adapter": "huginn", "path": str(TINY), "loops": 3}))
    cfg = found.outside["huginn_tiny"]
    assert (cfg.cell, cfg.loops, cfg.context, cfg.device) == ("huginn_tiny", 3, 0, "auto")
    assert OutsideConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("spec, name, message", [
    ({"adapter": "huginn"}, "m", "'outside.m.path' is ''; it must be the checkpoint directory"),
    ({"adapter": "huginn", "path": "x", "lops": 4}, "m", "unknown key 'outside.m.lops'. Did you "
                                                        "mean 'loops'?"),
    ({"adapter": "huginn", "path": "x", "loops": -1}, "m", "'outside.m.loops' is -1"),
    ({"path": "x"}, "m", "'outside.m' must be a mapping with an adapter and a path"),
    ({"adapter": "huginn", "path": "x"}, "backbone", "'outside.backbone' has the name of a cell"),
    ({"adapter": "huginn", "path": "x"}, "9x", "outside model name '9x' must start with a letter"),
])
def test_a_bad_outside_entry_fails_naming_the_key(spec, name, message):
    with pytest.raises(ParamsError) as err:
        parse_params(with_outside(spec, name))
    assert message in str(err.value)


def test_an_unknown_adapter_fails_at_configure_naming_the_key_and_the_layouts():
    with pytest.raises(ParamsError, match="'outside.m.adapter' is 'hugin': no such layout; "
                                          "the known ones are huginn, ouro, parcae"):
        outside.resolve(OutsideConfig("m", "hugin", str(TINY)))


def test_configure_resolves_an_outside_model_and_checks_its_directory(tmp_path):
    cfg = OutsideConfig("m", "huginn", str(TINY))
    resolved = outside.resolve(cfg)
    assert (resolved.device, resolved.precision) == ("cpu", "fp32")  # this CPU machine
    assert outside.depth(cfg) == 4 and outside.depth(OutsideConfig("m", "huginn", "x", 6)) == 6
    with pytest.raises(ParamsError, match="'outside.m.path' is .*: not a directory"):
        outside.resolve(OutsideConfig("m", "huginn", str(tmp_path / "absent")))
    assert outside.dtype_of(cfg, torch.device("cuda")) == torch.bfloat16  # auto on a GPU
    assert outside.dtype_of(cfg, torch.device("cpu")) == torch.float32


def test_its_tokens_are_its_own_tokenizers_without_added_specials():
    """The model's tokenizer over the text, the end-of-text id between documents; a
    post-processor's beginning-of-text token is not added per piece."""
    cfg = OutsideConfig("m", "huginn", str(TINY))
    tok = outside.tokenizer(cfg)
    eos, eos_id = outside.eos_token(cfg, tok)
    assert eos == "<|end_text|>"
    ids = encode(tok, ["the raven flies", "at dawn"], eos=eos_id)
    assert ids.tolist() == [*tok.encode("the raven flies").ids, eos_id,
                            *tok.encode("at dawn").ids, eos_id]
    with pytest.raises(ParamsError, match="'outside.m.eos': the tokenizer of .* has no token"):
        outside.eos_token(OutsideConfig("m", "huginn", str(TINY), eos="<nope>"), tok)


def test_the_memory_estimate_sizes_a_checkpoint_from_its_config_alone():
    """The sizes come from config.json and the model built on the meta device: the
    parameters counted there are those that load, tied head or not."""
    sizes = {}
    for layout in ("huginn_tiny", "huginn_tiny_untied"):
        cfg = OutsideConfig("m", "huginn", str(ROOT / "tests" / "fixtures" / layout))
        size, model = outside.sizing(cfg), outside.load(cfg, torch.device("cpu"))
        assert size.params == sum(p.numel() for p in model.parameters())
        assert size.readout_params == sum(p.numel() for p in model.reader().parameters())
        assert (size.d_model, size.loops) == (model.d_model, model.loops)
        sizes[layout] = size
    size = sizes["huginn_tiny_untied"]
    shape = memory.outside_shape(OutsideConfig("m", "huginn", str(TINY), context=16), size, 2)
    parts = memory.forward_parts(shape, 4, shape.loops, False, 2, float64_readout=True)
    assert parts["weights"] == size.params * 2 and shape.context == 16
    assert parts["float64 readout"] > size.readout_params * 8


# ------------------------------------------------------ the stages on an outside model


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory with the micro params holding huginn_tiny as an outside
    model, a small corpus, its config as configure writes it, and every outside stage
    run on it (in this process, as dvc.yaml runs them)."""
    work = tmp_path_factory.mktemp("outside")
    here = Path.cwd()
    shutil.copytree(TINY, work / "checkpoint")
    spec = {"adapter": "huginn", "path": "checkpoint", "loops": 4}
    (work / "params.yaml").write_text(yaml.safe_dump(with_outside(spec)))
    data = work / "data"
    data.mkdir()
    words = "the raven flies over hills at dawn and memory returns with news for the old king"
    for i in range(3):
        (data / f"doc{i}.txt").write_text("".join(f"{words} {j}\n" for j in range(200)))
    try:
        import os
        os.chdir(work)
        cfg = outside.resolve(parse_params(yaml.safe_load(Path("params.yaml").read_text()))
                              .outside["huginn_tiny"])
        paths.CONFIGS.mkdir()
        paths.config_file("huginn_tiny").write_text(cfg.to_json())
        run_stage("prepare_outside", "huginn_tiny")
        for script in ("extract", "diagnose", "convergence", "policies"):
            run_outside_stage(script, "huginn_tiny")
    finally:
        os.chdir(here)
    return work


def test_the_validation_text_is_tokenized_with_the_models_tokenizer(measured):
    meta = json.loads((measured / "prepared_outside" / "huginn_tiny" / "meta.json").read_text())
    tok = outside.tokenizer(OutsideConfig("m", "huginn", str(TINY)))
    assert meta["eos"] == "<|end_text|>" and meta["vocab_size"] == tok.get_vocab_size()
    assert set(meta["splits"]) == {"val"} and meta["documents"] == 3
    assert not (measured / "prepared").exists()  # the project's prepared/ is not touched


def test_every_measuring_stage_ran_on_the_outside_model(measured):
    tag = "seed42"  # outside.<name>.seed: its random initial states' seed
    extract = json.loads((measured / "extracts" / "huginn_tiny" / tag / "meta.json").read_text())
    assert extract["loops"] == 4 and extract["d_model"] == 32
    diag = json.loads((measured / "metrics" / "diagnose" / "huginn_tiny.json").read_text())
    assert set(diag["ppl_at_depth"]) == {"k1", "k2", "k3", "k4"}
    assert all(np.isfinite(v) for v in diag["radial_fraction_token"].values())
    clamp = json.loads((measured / "metrics" / "clamp" / "huginn_tiny.json").read_text())
    assert set(clamp) == {"freeze_loop1", "remove_radial"}
    conv = json.loads((measured / "metrics" / "convergence" / "huginn_tiny.json").read_text())
    # the regime reads the model's own training depth: Huginn's m and E[r] = m + 1
    assert (conv["r"], conv["nominal_mean"], conv["sampler_mean"]) == (4, 4.0, 5.0)
    assert conv["max_depth"] == 8  # convergence.depth_factor x R
    table = pd.read_parquet(measured / "tables" / "convergence" / "huginn_tiny.parquet")
    assert set(table["type"]) - {"special"}  # typed by the model's own tokenizer
    policies = json.loads((measured / "metrics" / "policies" / "huginn_tiny.json").read_text())
    assert policies["r"] == 4 and "kl" in policies


def test_the_claims_show_the_outside_model_as_extension_rows(measured, monkeypatch):
    monkeypatch.chdir(measured)
    values = {"regime": 0.75}
    found = judged.outside_records(["huginn_tiny"], values, None)
    record = found["huginn_tiny"]
    assert record["kind"] == "extension" and record["r"] == 4
    assert record["regime"]["state"] in ("in", "edge", "outside")
    rows = {r["statistic"]: r for r in record["rows"]}
    assert rows["useful depth"]["lo"] is not None  # an interval where the stage gives one
    assert rows["perplexity at R"]["lo"] is None
    schema = json.loads((ROOT / "tables" / SCHEMA).read_text())
    jsonschema.validate(found, {"$defs": schema["$defs"], **schema["properties"]["outside"]})
    beside = judged.outside_records(["huginn_tiny"], values, "huginn_tiny")
    assert beside["huginn_tiny"]["rows"][0]["beside"] == {
        "huginn_tiny": rows["perplexity at R"]["value"]}
    assert load_outside(paths.config_file("huginn_tiny")).adapter == "huginn"


# ------------------------------------------------------------------------- plan


def test_plan_sizes_an_outside_model_and_refuses_what_cannot_fit(monkeypatch):
    params = parse_params(with_outside({"adapter": "huginn", "path": str(TINY)}))
    planned = plan_outside.plan_outside(params, device="cpu", roof_gflops=10.0)["huginn_tiny"]
    assert planned["device"] == "cpu" and planned["precision"] == "fp32" and planned["checked"]
    assert planned["r"] == 4 and planned["measure_hours"] > 0
    assert set(planned["measure_flops"]) == set(planned["memory_gib"]) == {
        "extract", "diagnose", "convergence", "policies", "bench_exits", "recalibrate"}
    assert "outside huginn_tiny (huginn" in plan_outside.outside_lines({"huginn_tiny": planned})[0]
    gpu = plan_outside.plan_outside(params, device="cuda")["huginn_tiny"]
    assert (gpu["precision"], gpu["rate_source"]) == ("bf16", "assumed")
    monkeypatch.setattr(memory, "available", lambda device: memory.Limit(1 << 16, "a test"))
    with pytest.raises(ResourceError, match="outside model 'huginn_tiny': outside_extract at "
                                            "extract.batch_size"):
        plan_outside.plan_outside(params, device="cpu")
