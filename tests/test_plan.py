"""python -m loopscope.tools.plan: parameter counts, steps, memory estimates, the presets, and the
time estimates with their CPU calibration (the probe, the step efficiency)."""

import copy
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from loopscope.base.timings import TRAINING, cpu_model
from loopscope.measure.exit_rules.rules import TIMED
from loopscope.measure.per_loop import clamp
from loopscope.params import Params, load_params, parse_params
from loopscope.tools import budget, flops, plan_outside, probe
from loopscope.tools import plan as plan_module
from loopscope.tools.plan import (
    REPORT_SECONDS,
    STAGE_SECONDS,
    TFLOPS,
    main,
    measuring_flops,
    plan,
    plan_cell,
    train_flops_per_token,
)
from loopscope.tools.probe import STEP_EFFICIENCY, step_efficiency
from loopscope.tools.tokens import corpus_tokens
from loopscope.weights.config import CellConfig, TrainConfig
from loopscope.weights.data import Corpus, steps_for_epochs
from loopscope.weights.model import LoopedLM, ModelConfig, cost
from loopscope.weights.resolve import resolve_cell
from loopscope.weights.tokenizer import encode, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
BASE = yaml.safe_load((ROOT / "params.yaml").read_text())
PRESETS = sorted((ROOT / "presets").glob("*.yaml"))
PAPER_A_CELLS = ["terminal_normed", "terminal_raw", "perloop_normed", "perloop_raw",
                 "perloop_final_norm", "terminal_penalty", "perloop_penalty",
                 "perloop_interloop_norm"]


ROOF, FORWARD = 100.0, 20.0  # GFLOP/s the fake probe reports
REAL_ROOF, REAL_FORWARD = probe.roof_gflops, probe.forward_gflops


@pytest.fixture(autouse=True)
def fake_probe(monkeypatch):
    """plan() calibrates on the CPU; in-process tests get fixed rates at once (the CLI
    tests and test_the_real_probe_measures_this_machine run the real probe)."""
    monkeypatch.setattr(probe, "roof_gflops", lambda threads, size=2048: ROOF)
    monkeypatch.setattr(probe, "forward_gflops", lambda cfg, threads, windows: FORWARD)


def tiny_cell(**train: object) -> CellConfig:
    model = ModelConfig(vocab_size=300, context=32, d_model=32, n_heads=2, n_core=1, loops=4)
    return CellConfig(cell="t", model=model, train=TrainConfig(**train))


def total(cell: CellConfig) -> int:
    return plan_cell(cell, None, "cpu")["memory_bytes"]["total"]


def write_params(path: Path, **sections: dict) -> Path:
    raw = copy.deepcopy(BASE)
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(raw))
    return path


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loopscope.tools.plan", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_shipped_params_plan_lists_every_cell():
    result = run_cli("params.yaml")
    assert result.returncode == 0, result.stderr
    for name in load_params(ROOT / "params.yaml").cells:
        assert name in result.stdout
    assert "total" in result.stdout


def test_bad_params_exits_1_naming_the_key_before_any_work(tmp_path):
    bad = copy.deepcopy(BASE)
    bad["model"]["readout"] = "sideways"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(bad))
    result = run_cli("params.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""  # nothing planned, no corpus looked at
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "'model.readout'" in lines[0]


@pytest.mark.parametrize("model", [
    ModelConfig(vocab_size=300, context=32, d_model=32, n_heads=2, n_core=2),
    ModelConfig(vocab_size=300, context=32, d_model=32, n_heads=2, n_prelude=1, n_core=2,
                n_coda=1, block="sandwich", inject="concat_adapter", state_init="noise",
                inter_loop_norm=True),
])
def test_parameter_count_matches_the_model(model):
    cell = CellConfig(cell="t", model=model, train=TrainConfig())
    assert plan_cell(cell, None)["params"] == LoopedLM(model).num_params()


def test_memory_grows_with_batch_loops_and_per_loop_loss():
    base = tiny_cell(batch_size=16)
    assert total(tiny_cell(batch_size=32)) > total(base)
    deeper = dataclasses.replace(base, model=dataclasses.replace(base.model, loops=8))
    assert total(deeper) > total(base)
    assert total(tiny_cell(batch_size=16, loss="per_loop")) > total(
        tiny_cell(batch_size=16, loss="final"))
    # truncated backprop keeps fewer loops; fp32 activations cost more than bf16
    assert total(tiny_cell(batch_size=16, backprop_loops=2)) < total(base)
    assert total(tiny_cell(batch_size=16, precision="fp32")) > total(
        tiny_cell(batch_size=16, precision="bf16"))


def test_lognormal_depth_has_mean_loops_and_a_deeper_tail():
    model = dataclasses.replace(tiny_cell().model, loops=8)
    cell = CellConfig("t", model, TrainConfig(depth="lognormal", depth_sigma=0.5))
    planned = plan_cell(cell, None, "cpu")
    assert abs(planned["depth_mean"] - 8) < 0.1 and planned["depth_p99"] > 8
    assert plan_cell(cell, None, "cpu")["depth_p99"] == planned["depth_p99"]  # fixed seed
    fixed = plan_cell(dataclasses.replace(cell, train=TrainConfig()), None, "cpu")
    assert (fixed["depth_mean"], fixed["depth_p99"]) == (8.0, 8)


def test_epoch_steps_from_prepared_meta(tmp_path, monkeypatch):
    params = write_params(tmp_path / "params.yaml",
                          train={"steps": 0, "epochs": 2, "stride": 64, "batch_size": 8})
    (tmp_path / "prepared").mkdir()
    meta = {"vocab_size": BASE["tokenizer"]["vocab_size"],
            "splits": {"train": {"tokens": 100_000}, "val": {"tokens": 1000}}}
    (tmp_path / "prepared" / "meta.json").write_text(json.dumps(meta))
    monkeypatch.chdir(tmp_path)
    result = plan("params.yaml")
    assert "meta.json" in result["corpus"]["source"]
    context = BASE["model"]["context"]
    for name, cell in result["cells"].items():
        own = BASE["cells"][name].get("train", {}).get("steps")  # a cell's own steps stay
        assert cell["steps"] == (own or steps_for_epochs(2, 100_000, context, 64, 8))
        assert cell["windows_per_epoch"] == (100_000 - context - 2) // 64 + 1
    assert result["total"]["steps"] == sum(c["steps"] * c["runs"] for c in result["cells"].values())
    assert params.is_file()


def test_meta_with_another_vocabulary_is_not_used(tmp_path, monkeypatch):
    write_params(tmp_path / "params.yaml")
    (tmp_path / "prepared").mkdir()
    meta = {"vocab_size": 999, "splits": {"train": {"tokens": 100_000}}}
    (tmp_path / "prepared" / "meta.json").write_text(json.dumps(meta))
    monkeypatch.chdir(tmp_path)
    assert plan("params.yaml")["corpus"]["train_tokens"] is None


def test_meta_of_another_tokenizer_kind_is_not_used(tmp_path, monkeypatch):
    write_params(tmp_path / "params.yaml")
    (tmp_path / "prepared").mkdir()
    meta = {"vocab_size": BASE["tokenizer"]["vocab_size"], "tokenizer_kind": "word",
            "source": "files", "splits": {"train": {"tokens": 100_000}}}
    (tmp_path / "prepared" / "meta.json").write_text(json.dumps(meta))
    monkeypatch.chdir(tmp_path)
    result = plan("params.yaml")
    assert result["corpus"]["train_tokens"] is None
    assert "tokenizer_kind" in result["corpus"]["source"]


def test_meta_of_the_same_hub_dataset_is_used(tmp_path, monkeypatch):
    hub = {"hub": "roneneldan/TinyStories", "hub_config": "", "hub_documents": 1000}
    write_params(tmp_path / "params.yaml", data=hub)
    (tmp_path / "prepared").mkdir()
    meta = {"vocab_size": BASE["tokenizer"]["vocab_size"], "tokenizer_kind": "bpe",
            "source": "hub", "hub": {"name": hub["hub"], "config": "", "documents": 1000},
            "splits": {"train": {"tokens": 54_321}}}
    (tmp_path / "prepared" / "meta.json").write_text(json.dumps(meta))
    monkeypatch.chdir(tmp_path)
    assert plan("params.yaml")["corpus"]["train_tokens"] == 54_321
    write_params(tmp_path / "params.yaml", data={**hub, "hub_documents": 2000})
    assert plan("params.yaml")["corpus"]["train_tokens"] is None


def test_estimate_from_raw_text(tmp_path, monkeypatch):
    words = "the quick brown fox jumps over a lazy dog while seven kings sing".split()
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        lines = (" ".join(words[(j * 7 + i) % len(words):] + words[:3]) for j in range(300))
        (data / f"doc{i}.txt").write_text("\n".join(lines) + "\n")
    write_params(tmp_path / "params.yaml", tokenizer={"vocab_size": 300})
    monkeypatch.chdir(tmp_path)
    got = corpus_tokens(load_params("params.yaml"), Path("prepared"))
    assert got.source.startswith("estimate")
    # what the prepare stage would count
    train = list(Corpus(data, BASE["data"]["val_fraction"]).documents("train"))
    true = len(encode(train_tokenizer(train, 300), train))
    assert abs(got.tokens - true) / true < 0.15


def test_estimate_from_a_hub_corpus(tmp_path, monkeypatch):
    """A hub corpus: train.txt is the train split, one document per paragraph."""
    words = "once upon a time a small cat found a red ball in the big garden".split()
    stories = [" ".join(words[i % 7:] + words[: i % 5]) + "." for i in range(600)]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.txt").write_text("\n\n".join(stories) + "\n")
    (tmp_path / "data" / "validation.txt").write_text("\n\n".join(stories[:20]) + "\n")
    write_params(tmp_path / "params.yaml", tokenizer={"vocab_size": 300},
                 data={"hub": "roneneldan/TinyStories"})
    monkeypatch.chdir(tmp_path)
    got = corpus_tokens(load_params("params.yaml"), Path("prepared"))
    assert got.source.startswith("estimate") and "(train.txt)" in got.source
    true = len(encode(train_tokenizer(stories, 300), stories))  # ids + one EOS per story
    assert abs(got.tokens - true) / true < 0.15


def test_not_fetched_prints_the_fetch_command(tmp_path, monkeypatch, capsys):
    write_params(tmp_path / "params.yaml",
                 data={"hub": "Salesforce/wikitext", "hub_config": "wikitext-103-raw-v1"})
    write_params(tmp_path / "other.yaml")
    monkeypatch.chdir(tmp_path)
    main(["params.yaml"])
    out = capsys.readouterr().out
    assert "hub dataset Salesforce/wikitext is not fetched" in out
    assert "`python -m loopscope.weights.corpus`" in out
    main(["other.yaml"])
    assert "`python -m loopscope.weights.corpus --params other.yaml`" in capsys.readouterr().out
    main(["params.yaml", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["corpus"]["train_tokens"] is None
    assert all(c["steps"] == BASE["cells"][name].get("train", {}).get("steps",
                                                                    BASE["train"]["steps"])
               for name, c in result["cells"].items())


def test_presets_exist():
    assert {p.stem for p in PRESETS} >= {"paper_a_44m", "paper_a_129m",
                                         "paper_b_tinystories", "paper_b_fineweb_edu"}


# Parameter counts the papers give, checked on what LoopedLM builds from each preset
# (paper A's counts imply a gated FFN, hence ffn: swiglu there).
SIZES = {"paper_a_44m": (43.5e6, 44.5e6), "paper_a_129m": (127.5e6, 130.5e6),
         "paper_b": (120e6, 150e6)}


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_preset_loads_and_plans_to_the_papers_size(path):
    params = load_params(path)
    low, high = next(v for k, v in SIZES.items() if path.stem.startswith(k))
    for name in params.cells:
        result = plan_cell(resolve_cell(params, name), None, "cuda")
        assert low <= result["params"] <= high, (name, result["params"])
        assert result["memory_bytes"]["total"] > 0
    if path.stem.startswith("paper_a"):
        assert list(params.cells) == PAPER_A_CELLS
        assert params.seeds == [42, 101, 202]
    else:
        assert list(params.cells) == ["backbone"]


def test_training_flops_count_forward_and_backward_through_the_kept_loops():
    cell = tiny_cell(loss="final", steps=10, batch_size=2)
    c = cost(cell.model)
    assert train_flops_per_token(cell) == pytest.approx(3 * c.uniform(4))
    truncated = tiny_cell(loss="final", backprop_loops=1)
    assert train_flops_per_token(truncated) == pytest.approx(
        c.uniform(4) + 2 * c.uniform(1))
    per_loop = tiny_cell(loss="per_loop")
    assert train_flops_per_token(per_loop) == pytest.approx(3 * (c.uniform(4) + 3 * c.readout))


def test_time_is_estimated_on_a_gpu_at_the_assumed_rate_and_on_a_cpu_at_its_calibration():
    cell = tiny_cell(loss="final", steps=1000, batch_size=8)
    flops = 3 * cost(cell.model).uniform(4) * 1000 * 8 * 32
    assert plan_cell(cell, None, "cuda")["hours"] == pytest.approx(flops / TFLOPS / 1e12 / 3600)
    assert plan_cell(cell, None, "cpu")["hours"] is None  # no calibration given
    assert plan_cell(cell, None, "cpu", cpu_gflops=10.0)["hours"] == pytest.approx(
        flops / 10e9 / 3600)
    assert plan_cell(cell, None, "cpu", tflops=1.0)["hours"] == pytest.approx(
        flops / 1e12 / 3600)


def test_the_paper_b_preset_plans_one_gpu_in_hours_not_days():
    """Paper B's ~135M backbone at mean depth 8 (E[r] = 9, Huginn's sampler), prelude,
    core and coda: its TinyStories run is a day or less on one GPU at the assumed rate."""
    result = plan(ROOT / "presets" / "paper_b_tinystories.yaml", "cuda")
    cell = result["cells"]["backbone"]
    assert cell["depth_mean"] == pytest.approx(9.0, abs=0.1)
    assert 1 < result["total"]["hours"] < 48
    out = run_cli(str(ROOT / "presets" / "paper_b_tinystories.yaml"), "--device", "cuda")
    assert "device-hours at an assumed 50 TFLOP/s" in out.stdout
    assert run_cli("--tflops", "0").returncode == 2


def test_the_probe_feeds_the_cpu_hours_of_training_and_measuring(tmp_path, monkeypatch):
    """No `bench train` result here: the step efficiency is STEP_EFFICIENCY, so training
    runs at STEP_EFFICIENCY x the roof, measuring at the probed forward rate plus the
    stages' start-up."""
    write_params(tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    result = plan("params.yaml", "cpu")
    cal = result["calibration"]
    assert (cal["roof_gflops"], cal["efficiency"]) == (ROOF, STEP_EFFICIENCY)
    assert "STEP_EFFICIENCY" in cal["efficiency_source"]
    assert cal["cpu"] == cpu_model() and cal["threads"] == BASE["train"]["threads"]
    resolved = load_params(tmp_path / "params.yaml")
    for name, c in result["cells"].items():
        assert c["rate_source"] == "calibrated"
        at_once = resolve_cell(resolved, name).runs_at_once  # side by side: each its roof
        assert c["hours"] == pytest.approx(c["train_flops"] / (STEP_EFFICIENCY * ROOF * 1e9)
                                           / at_once / 3600)
        assert c["measure_hours"] == pytest.approx(sum(c["measure_flops"].values())
                                                   / (FORWARD * 1e9) / 3600)
    total = result["total"]
    assert total["hours"] == pytest.approx(sum(c["hours"] * c["runs"]
                                               for c in result["cells"].values()))
    measuring = result["measuring"]
    stages = measuring["stages"]
    startup = STAGE_SECONDS * (sum(stages.values()) - 3) + REPORT_SECONDS * 3
    assert measuring["startup_seconds"] == pytest.approx(startup)
    assert measuring["hours"] == pytest.approx(
        sum(c["measure_hours"] for c in result["cells"].values()) + startup / 3600)


def test_a_faster_probe_gives_fewer_hours(tmp_path, monkeypatch):
    write_params(tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    slow = plan("params.yaml", "cpu")
    monkeypatch.setattr(probe, "roof_gflops", lambda threads, size=2048: 2 * ROOF)
    monkeypatch.setattr(probe, "forward_gflops", lambda cfg, threads, windows: 4 * FORWARD)
    fast = plan("params.yaml", "cpu")
    assert fast["total"]["hours"] == pytest.approx(slow["total"]["hours"] / 2)
    startup = slow["measuring"]["startup_seconds"] / 3600
    assert fast["measuring"]["hours"] - startup == pytest.approx(
        (slow["measuring"]["hours"] - startup) / 4)
    # --tflops replaces the calibration; no probe, no CPU times
    given = plan("params.yaml", "cpu", tflops=1.0)
    assert given["calibration"] is None
    assert given["total"]["hours"] == pytest.approx(given["total"]["train_flops"] / 1e12 / 3600)
    assert plan("params.yaml", "cpu", probe=None)["total"]["hours"] is None


def test_the_step_efficiency_comes_from_a_bench_train_result(tmp_path, monkeypatch):
    result = {"matmul_size": 1024, "cells": {
        name: {"fp32": {"ratio_to_matmul": r}} for name, r in (("a", 0.3), ("b", 0.4),
                                                              ("c", 0.6))}}
    path = tmp_path / "train.json"
    path.write_text(json.dumps(result))
    efficiency, source, size = step_efficiency(path)
    assert (efficiency, size) == (0.4, 1024) and str(path) in source and "0.30-0.60" in source
    assert step_efficiency(tmp_path / "missing.json")[0] == STEP_EFFICIENCY
    path.write_text("{not json")
    assert step_efficiency(path)[0] == STEP_EFFICIENCY
    # plan reads metrics/bench/train.json where it runs, and probes the roof it names
    sizes = []
    monkeypatch.setattr(probe, "roof_gflops",
                        lambda threads, size=2048: sizes.append(size) or ROOF)
    write_params(tmp_path / "params.yaml")
    (tmp_path / "metrics" / "bench").mkdir(parents=True)
    (tmp_path / "metrics" / "bench" / "train.json").write_text(json.dumps(result))
    monkeypatch.chdir(tmp_path)
    cal = plan("params.yaml", "cpu")["calibration"]
    assert set(sizes) == {1024} and cal["efficiency"] == 0.4
    assert cal["train_gflops"] == 0.4 * ROOF


@pytest.mark.committed
def test_the_committed_bench_train_result_is_read():
    efficiency, source, size = step_efficiency(ROOT / "metrics" / "bench" / "train.json")
    assert 0.2 < efficiency < 0.9 and size == 2048 and "ratio_to_matmul" in source


def test_the_real_probe_measures_this_machine():
    assert REAL_ROOF(1, 128) > 0
    assert REAL_FORWARD(tiny_cell().model, 1, 2) > 0
    assert cpu_model()


def test_measuring_flops_follow_the_params(tmp_path):
    """Deeper sweeps, more windows and seeds cost more; the policies run on
    policies.cells, the exit benchmark on bench.cell, only."""
    params = load_params(write_params(tmp_path / "a.yaml"))
    deeper = load_params(write_params(tmp_path / "b.yaml", diagnose={"sweep_depth": 60},
                                      convergence={"windows": 128}))
    for name in params.cells:
        cell = resolve_cell(params, name)
        base, more = measuring_flops(params, name, cell), measuring_flops(deeper, name, cell)
        assert more["diagnose"] > base["diagnose"] and more["convergence"] > base["convergence"]
        assert more["extract"] == base["extract"]
        assert ("policies" in base) == (name in params.policies.cells)
        assert ("bench_exits" in base) == (name == params.bench.cell)
        assert all(v > 0 for v in base.values())
    two = resolve_cell(params, "perloop_normed")  # two seeds: twice one seed's passes
    one = dataclasses.replace(two, seeds=[42])
    got, single = (measuring_flops(params, "perloop_normed", c) for c in (two, one))
    assert got["diagnose"] == pytest.approx(2 * single["diagnose"])
    assert got["throughput"] == single["throughput"]  # the first run only
    assert flops.CLAMP_PASSES == len(clamp.CLAMP_MODES)
    assert flops.BENCH_POLICIES == len(TIMED) == 4


def test_measuring_stages_are_dvc_yaml_s():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    counted = {**{s: "${cells}" for s in plan_module.PER_CELL_STAGES},
               **{s: "${policies.cells}" for s in plan_module.POLICY_STAGES},
               **{s: "${recalibrate.cells}" for s in plan_module.RECALIBRATE_STAGES},
               **{s: None for s in plan_module.ONCE_STAGES + plan_module.REPORT_STAGES},
               **{s: "${outside}" for s in plan_outside.STAGES}}
    training = set(TRAINING)
    assert set(stages) == set(counted) | training
    for name, foreach in counted.items():
        assert stages[name].get("foreach") == foreach, name
    params = load_params(ROOT / "params.yaml")
    n = plan_module.measuring_stages(params)
    assert sum(n.values()) == (3 * len(params.cells) + len(params.policies.cells)
                               + len(params.recalibrate.cells) + 6 + 3)


def test_the_hours_are_filled_on_this_cpu_and_brief_prints_the_totals():
    """The CLI runs the real probe: the table's total hours, the time and measuring
    lines, and --brief's two lines naming this CPU and its threads."""
    out = run_cli("params.yaml", "--device", "cpu").stdout
    total = next(line for line in out.splitlines() if line.startswith("total "))
    assert "?" not in total.split()[2]  # steps, then hours
    assert f"of training on {cpu_model()}, 2 threads" in out and "GFLOP/s" in out
    assert "measuring: " in out
    brief = run_cli("params.yaml", "--device", "cpu", "--brief")
    lines = brief.stdout.strip().splitlines()
    assert brief.returncode == 0 and len(lines) == 2, brief.stderr
    assert lines[0].startswith("estimated: training ") and " h, measuring " in lines[0]
    assert lines[0].endswith(f" on {cpu_model()}, 2 threads")


def test_brief_on_a_gpu_names_the_assumed_rate(capsys):
    main([str(ROOT / "params.yaml"), "--device", "cuda", "--brief"])
    gpu = capsys.readouterr().out
    assert gpu.startswith("estimated: training ") and "at an assumed 50 TFLOP/s" in gpu
    assert "23 runs from scratch" in gpu
    with pytest.raises(SystemExit):
        main([str(ROOT / "params.yaml"), "--json", "--brief"])


def test_help_describes_the_tool_in_whole_sentences(capsys):
    """`plan --help` gives the docstring's first paragraph whole, not its first line."""
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("usage: python -m loopscope.tools.plan")
    assert "what training and measuring its cells would cost, without training." in out


# ------------------------------------------------------- --budget-hours (tools.budget)

TINY = ROOT / "tests" / "fixtures" / "huginn_tiny"
SLOW = 1e-6  # TFLOP/s: 1 MFLOP/s, so the tiny Huginn's stages take hours and a budget binds


def with_tiny_outside(path: Path | None = None) -> Params:
    """The shipped params with the tiny Huginn fixture as an outside model (written to
    path too, where given)."""
    raw = {**copy.deepcopy(BASE), "outside": {"huginn_tiny": {"adapter": "huginn",
                                                              "path": str(TINY)}}}
    if path is not None:
        path.write_text(yaml.safe_dump(raw))
    return parse_params(raw)


def fitted_at(params: Params, hours: float, root: Path) -> dict:
    planned = plan_outside.plan_outside(params, "cuda", SLOW)
    return budget.fit_all(params, planned, hours, root)["huginn_tiny"]


def priced(params: Params, values: dict[str, int]) -> float:
    """The hours plan itself prices these sizes at (plan_outside.plan_one)."""
    chosen = budget.with_values(params, values)
    return plan_outside.plan_one(chosen, params.outside["huginn_tiny"], "cuda", SLOW,
                                 None)["measure_hours"]


def test_the_budget_chooses_sizes_that_fit_it_and_spends_it(tmp_path):
    """No committed metrics under tmp_path: the floors are the units' own (30 windows a
    set, 10 spread windows), depth factor 3, the sweep to R."""
    params = with_tiny_outside()
    full = fitted_at(params, 1e9, tmp_path)
    floor_hours = fitted_at(params, 0.0, tmp_path)["hours"]
    assert full["moves"] == [] and full["chosen"] == budget.values_of(params)
    hours = (full["hours"] + floor_hours) / 2  # binds, and the floors fit it
    got = fitted_at(params, hours, tmp_path)
    assert got["fits"] and got["moves"]
    assert priced(params, got["chosen"]) == pytest.approx(got["hours"])
    assert got["hours"] <= hours < full["hours"]
    floors = {k: v for k, (v, _) in got["floors"].items()}
    assert floors == {"convergence.windows": 30, "diagnose.val_sequences": 10,
                      "extract.val_sequences": 10, "convergence.depth_factor": 3,
                      "diagnose.sweep_depth": 4}
    assert all(got["chosen"][k] >= floors[k] for k in budget.KEYS)
    key = got["moves"][-1][0]  # raised back as far as it fits: one more would not
    assert priced(params, {**got["chosen"], key: got["chosen"][key] + 1}) > hours
    lines = budget.budget_lines({"huginn_tiny": got})
    assert "outside huginn_tiny: fits: " in lines[1]
    assert any("params.yaml fragment (shared keys" in line for line in lines)


def test_a_budget_below_the_floors_is_reported_not_clipped(tmp_path):
    params = with_tiny_outside()
    got = fitted_at(params, 1e-3, tmp_path)
    start = budget.values_of(params)
    assert got["fits"] is False and got["hours"] > 1e-3
    assert got["chosen"] == {k: min(v, start[k]) for k, (v, _) in got["floors"].items()}
    assert got["hours"] == pytest.approx(priced(params, got["chosen"]))
    text = "\n".join(budget.budget_lines({"huginn_tiny": got}))
    assert "does not fit 0.001 h: even at the floors it prices" in text
    assert f"the floors need --budget-hours {math.ceil(got['hours'] * 100) / 100:.2f}" in text
    assert "params.yaml fragment" not in text


def test_the_floors_and_widths_follow_the_reference_run():
    """At 52 units per 96 windows a set, 30 units need 56 windows; at 40 units per 128
    spread windows, 10 need 32; the widths grow as sqrt(windows then / windows now)."""
    ref = budget.Reference("backbone", "seed42", {budget.SETS: 96, budget.SPREAD: 128},
                           {budget.SETS: 52, budget.SPREAD: 40},
                           {name: 0.04 for name, *_ in budget.INTERVALS})
    floors = budget.floors(32, ref)
    assert floors[budget.SETS][0] == 56 and floors[budget.SPREAD][0] == 32
    assert floors["extract.val_sequences"][0] == 32
    assert floors["diagnose.sweep_depth"][0] == 32
    rows = budget.buys(ref, {budget.SETS: 24, budget.SPREAD: 128})
    sets = [r for r in rows if r["key"] == budget.SETS]
    assert sets and all(r["width"] == pytest.approx(0.08) and r["units"] == 13 for r in sets)
    assert all(r["width"] == pytest.approx(0.04) for r in rows if r["key"] == budget.SPREAD)


def test_search_never_passes_a_floor_nor_raises_a_key():
    cost = {"a": 3.0, "b": 1.0}

    def price(values: dict[str, int]) -> float:
        return sum(cost[k] * v for k, v in values.items())

    values, moves = budget.search(price, {"a": 64, "b": 64}, {"a": 10, "b": 100}, 50.0)
    assert values["b"] == 64 and values["a"] == 10 and price(values) > 50  # at its floor
    assert moves and all(k == "a" for k, _, _ in moves)
    values, moves = budget.search(price, {"a": 64, "b": 64}, {"a": 1, "b": 1}, 200.0)
    assert price(values) <= 200 < price({**values, moves[-1][0]: values[moves[-1][0]] + 1})


def test_the_reference_of_a_one_run_backbone_is_its_pooled_intervals(tmp_path):
    """A backbone of one seed writes no per-run intervals: its own are that run's."""
    iv = {"value": 0.1, "lo": 0.05, "hi": 0.15, "units": 13}
    files = {"convergence": {"tokens": 96 * 128, "units": 48,
                             "convergence": {"share_after_r": iv}},
             "diagnose": {"val_tokens": 128 * 128, "units": 40},
             "clamp": {m: {"delta_ce_last": iv} for m in ("remove_radial", "freeze_loop1")},
             "policies": {"kl": {"loops_ratio_iv": iv}}}
    for kind, found in files.items():
        (tmp_path / "metrics" / kind).mkdir(parents=True)
        (tmp_path / "metrics" / kind / "backbone.json").write_text(json.dumps(found))
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "backbone.json").write_text(json.dumps({"model": {"context": 128}}))
    ref = budget.reference(load_params(ROOT / "params.yaml"), tmp_path)
    assert ref is not None and ref.cell == "backbone" and ref.run == "(its one run)"
    assert ref.windows == {budget.SETS: 96, budget.SPREAD: 128}
    assert ref.units == {budget.SETS: 48, budget.SPREAD: 40}
    assert all(w == pytest.approx(0.1) for w in ref.widths.values())
    assert budget.floors(8, ref)[budget.SETS][0] == 60  # 30 units at 2 windows a unit


@pytest.mark.committed
def test_the_committed_run_is_the_budget_s_reference():
    ref = budget.reference(load_params(ROOT / "params.yaml"), ROOT)
    assert ref is not None and ref.cell == "backbone"
    assert ref.units[budget.SETS] >= 30 and all(w > 0 for w in ref.widths.values())


def test_budget_hours_prints_the_sizes_and_writes_the_params(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with_tiny_outside(tmp_path / "params.yaml")
    main(["params.yaml", "--device", "cuda", "--budget-hours", "1"])
    out = capsys.readouterr().out
    assert out.startswith("budget: 1 h for each outside model's stages at an assumed 50")
    assert "outside huginn_tiny: fits: " in out and "nothing lowered" in out
    full = fitted_at(load_params("params.yaml"), 1e9, tmp_path)["hours"]
    hours = f"{full / 2:.6f}"
    main(["params.yaml", "--device", "cuda", "--tflops", str(SLOW), "--budget-hours", hours,
          "--write", "small.yaml"])
    assert "written: small.yaml" in capsys.readouterr().out
    small = load_params("small.yaml")
    assert priced(small, budget.values_of(small)) <= float(hours)
    main(["params.yaml", "--tflops", str(SLOW), "--budget-hours", "0.001", "--write", "x.yaml"])
    assert "not written: x.yaml" in capsys.readouterr().out and not Path("x.yaml").exists()
    for wrong in (["--write", "y.yaml"], ["--budget-hours", "1", "--write", "params.yaml"]):
        with pytest.raises(SystemExit):  # no budget; the source itself (its comments)
            main(["params.yaml", *wrong])
