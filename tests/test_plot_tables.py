"""The long tables behind dvc.yaml's plots: one row per cell and loop, values copied
from the metrics files, and a clear error naming a missing one."""

import json

import pandas as pd
import pytest

from loopscope.base import paths
from loopscope.base.errors import DataError
from loopscope.render.plot_tables import tables


def write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """Two cells' diagnose and convergence metrics and one policies table."""
    monkeypatch.chdir(tmp_path)
    for cell, scale in (("a", 1.0), ("b", 10.0)):
        write(paths.metrics_file("diagnose", cell), {
            "norm_mean": {"k2": 2 * scale, "k1": scale},  # out of order on purpose
            "ppl_at_depth": {"k1": 90.0, "k2": 80.0},
            "radial_fraction": {"k1": 1e-9, "k2": 2e-9}})
        write(paths.metrics_file("convergence", cell), {
            "ce_at_depth": {"k1": 5.0, "k2": 4.5, "k3": 4.4},
            "kl": {"k2": 0.1, "k3": 0.01},
            "state_change": {"k1": 1.0, "k2": 0.3, "k3": 0.1}})
    path = paths.table_file("policies", "a")
    path.parent.mkdir(parents=True)
    pd.DataFrame({"set": ["choose", "report", "report"], "rule": ["kl", "kl", "uniform"],
                  "threshold": [0.01, 0.01, 2.0], "mean_loops": [1.5, 1.6, 2.0],
                  "ce": [4.6, 4.7, 4.5], "flops": [1.0, 1.0, 2.0],
                  "flops_ratio": [0.5, 0.55, 1.0]}).to_parquet(path)
    return tmp_path


def test_tables_hold_every_cell_per_loop_in_order(workspace):
    found = tables(["a", "b"], ["a"])
    norm = found["norm"]
    assert norm.to_dict("records") == [
        {"series": "a", "loop": 1, "norm": 1.0}, {"series": "a", "loop": 2, "norm": 2.0},
        {"series": "b", "loop": 1, "norm": 10.0}, {"series": "b", "loop": 2, "norm": 20.0}]
    assert list(found["ppl"]["depth"]) == [1, 2, 1, 2]
    conv = found["convergence"].query("series == 'b'").set_index("loop")
    assert pd.isna(conv.loc[1, "kl"]) and conv.loc[3, "kl"] == 0.01  # no KL before loop 2
    assert list(conv["ce"]) == [5.0, 4.5, 4.4]
    frontier = found["frontier"]
    assert list(frontier["series"]) == ["a kl", "a uniform"]  # report windows only
    assert list(frontier["mean_loops"]) == [1.6, 2.0]


def test_a_missing_metrics_file_is_named(workspace):
    paths.metrics_file("convergence", "b").unlink()
    with pytest.raises(DataError, match=r"metrics/convergence/b.json: not found; run "
                                        r"`dvc repro convergence@b`"):
        tables(["a", "b"], ["a"])
