"""Committed experiments: recorded from a workspace only where an experiment ran and its
claims are current, and read back as verdict columns that show every turn between holds
and contradicted."""

import json
import subprocess

import pytest
import yaml

from loopscope.base import paths
from loopscope.base.errors import DataError, ParamsError
from loopscope.base.files import write_json
from loopscope.judge.experiments import (
    changed_params,
    flips,
    record,
    recorded,
    run_counts,
    verdict_columns,
)


def rows(*verdicts: str, group: str = "ours") -> list[dict]:
    return [{"id": f"A.claim{i}.{group}", "claim": f"claim {i}", "group": group,
             "verdict": v} for i, v in enumerate(verdicts)]


def test_changed_params_names_what_dvc_exp_run_set():
    base = {"cells": {"a": {"seeds": [42, 43], "train": {"loss": "final"}}, "b": {}},
            "seeds": [42]}
    new = {"cells": {"a": {"seeds": [43, 44], "train": {"loss": "final"}},
                     "b": {"seeds": [43]}}, "seeds": [42]}
    assert changed_params(base, new) == {"cells.a.seeds": [43, 44], "cells.b.seeds": [43]}
    assert changed_params(base, base) == {}
    assert changed_params({"x": 1, "y": 2}, {"x": 1}) == {"y": None}


def test_verdict_columns_show_flips_and_count_every_run():
    default = rows("holds", "contradicted", "inconclusive", "holds")
    shifted = rows("contradicted", "contradicted", "holds", "inconclusive")
    table = verdict_columns(default, {"shifted": {"claims": shifted[:3],  # claim 3 not judged
                                                  "baseline": default}})
    assert list(table["shifted"]) == ["contradicted", "contradicted", "holds", "-"]
    assert list(table["shifted base"]) == ["holds", "contradicted", "inconclusive", "holds"]
    turned = flips(table, "shifted")  # holds -> contradicted only, not -> inconclusive
    assert list(turned["claim"]) == ["claim 0"]
    same = verdict_columns(default, {"same": {"claims": default, "baseline": default}})
    assert flips(same, "same").empty
    counts = run_counts(table)
    assert list(counts.columns) == ["default", "shifted base", "shifted"]
    assert counts.loc["holds"].tolist() == [2, 2, 1]
    assert counts.loc["contradicted"].tolist() == [1, 1, 2]
    # the same claim in two recipe groups stays two rows, matched by id
    both = default[:1] + rows("contradicted", group="reference")
    other = {"claims": rows("holds", group="reference"), "baseline": both}
    assert list(verdict_columns(both, {"e": other})["e"]) == ["-", "holds"]


def test_an_experiment_is_compared_with_its_own_baseline_not_todays_default():
    """An experiment judged by older criteria: its verdict differs from today's default,
    but not from the default judged alike at its commit, so nothing turned."""
    today = rows("contradicted")
    then = rows("holds")
    table = verdict_columns(today, {"old": {"claims": rows("holds"), "baseline": then}})
    assert flips(table, "old").empty


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A git repository with a committed params.yaml, as dvc exp run leaves it."""
    monkeypatch.chdir(tmp_path)
    params = {"cells": {"a": {"seeds": [42, 43]}}, "seeds": [42]}
    paths.PARAMS.write_text(yaml.safe_dump(params))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], check=True)
    write_json(paths.CLAIMS, {"paper_a": rows("holds"), "paper_b": rows("holds")})
    subprocess.run([*git, "add", "params.yaml", str(paths.CLAIMS)], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    write_json(paths.CLAIMS, {"paper_a": rows("holds"), "paper_b": rows("inconclusive")})
    return params


def lock(cells: dict) -> None:
    paths.Path("dvc.lock").write_text(yaml.safe_dump(
        {"stages": {"claims": {"params": {"params.yaml": {"cells": cells}}}}}))


def test_record_keeps_the_experiments_params_commit_and_claims(workspace):
    with pytest.raises(ParamsError, match="equals HEAD's"):
        record("nothing_ran")
    shifted = {"a": {"seeds": [43, 44]}}
    paths.PARAMS.write_text(yaml.safe_dump({**workspace, "cells": shifted}))
    lock(workspace["cells"])  # the claims stage still judged the old cells
    with pytest.raises(DataError, match="dvc repro claims"):
        record("stale")
    lock(shifted)
    path = record("seeds_plus_one")
    saved = json.loads(path.read_text())
    assert saved["params"] == {"cells.a.seeds": [43, 44]}
    assert len(saved["base_commit"]) == 40
    assert saved["claims"]["paper_b"] == rows("inconclusive")
    assert saved["baseline"]["paper_b"] == rows("holds")  # HEAD's, judged alike
    assert list(recorded()) == ["seeds_plus_one"]
