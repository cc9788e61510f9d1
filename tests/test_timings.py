"""What a stage cost, as data: the stage runner (loopscope.stage.execute) writes
metrics/stage_timings/<stage>.json and
loopscope.base.timings sums training against measuring."""

import json
import sys

import pytest

from loopscope import stage
from loopscope.base import errors, timings


def test_run_writes_the_stage_timings_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["policies.py", "backbone"])
    stage.execute(lambda: None, stage="policies@backbone")
    got = json.loads((tmp_path / "metrics/stage_timings/policies@backbone.json").read_text())
    assert set(got) == {"seconds", "peak_memory_bytes", "cpu", "cpu_identity", "cores"}
    assert got["seconds"] > 0 and got["peak_memory_bytes"] > 2**20
    assert got["cpu"] == timings.cpu_model() and got["cores"] >= 1
    assert got["cpu_identity"] == timings.cpu_identity()


def test_a_failed_stage_writes_no_timings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def fails() -> None:
        raise errors.DataError("prepared/val.bin: not found")
    with pytest.raises(SystemExit, match="prepared/val.bin"):
        stage.execute(fails, stage="extract@backbone")
    assert not (tmp_path / "metrics").exists()


def test_only_rank_0_writes_under_torchrun(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "1")
    stage.execute(lambda: None, stage="train@backbone")
    assert not (tmp_path / "metrics").exists()


def test_training_and_measuring_are_summed_apart():
    def t(seconds):
        return {"seconds": seconds, "peak_memory_bytes": 2**30, "cpu": "Test CPU", "cores": 2}
    found = {"configure": t(2), "prepare": t(8), "train@a": t(600), "train@b": t(390),
             "policies@b": t(100), "report_index": t(50), "summary": t(50)}
    s = timings.summarize(found)
    assert s["training_seconds"] == 1000 and s["measuring_seconds"] == 200
    assert s["measuring_over_training"] == 0.2 and s["cpus"] == ["Test CPU"]
    text = timings.table(found)
    assert "training  16.7 min, measuring 3.3 min (0.20 of training)" in text
    assert text.index("train@a") < text.index("policies@b")  # training first
    assert timings.summarize({"claims": t(5)})["measuring_over_training"] is None


def test_every_stage_declares_its_timings_file():
    """dvc.yaml declares each stage's timings file as an uncached metric, so DVC neither
    loses it nor counts it among the reproducible outputs."""
    from test_layout import instances
    for name, spec in instances():
        if name == "configure":  # forced by every make repro: a file would change each time
            continue
        declared = [next(iter(m)) for m in spec.get("metrics", []) if isinstance(m, dict)]
        assert str(timings.timings_file(name)) in declared, name
