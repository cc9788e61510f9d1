"""A run a team shares: `dvc push` to a remote, and on a fresh clone `dvc pull`, with
nothing left to rerun (docs/scaling.md, "Sharing a run: a DVC remote").

The remote is a local directory: the commands are the same for s3:// or ssh://. The run
is the session's micro `dvc repro` (conftest's `reproduced`: micro params, a small
corpus, a tmp git repo), pushed from a copy of it, so no second from-scratch run is
needed; each test clones its own from the pushed repository.
"""

import json
from pathlib import Path

import pytest
import yaml
from conftest import SHARES_REPRO
from micro import copy_state, sh

from loopscope.params import load_params
from loopscope.weights.resolve import resolve_cell

ROOT = Path(__file__).resolve().parents[1]
BACKBONES = {"backbone", "backbone_mean4"}


def test_readout_change_retrains_only_the_default_backbones(tmp_path):
    """The default params.yaml: paper A's cells pin their readout, the two backbones
    inherit it, so `dvc exp run -S model.readout=raw` retrains those two alone."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    paths = []
    for i, params in enumerate((raw, {**raw, "model": {**raw["model"], "readout": "raw"}})):
        paths.append(tmp_path / f"params{i}.yaml")
        paths[-1].write_text(yaml.safe_dump(params))
    base, changed = (load_params(p) for p in paths)
    differ = {name for name in base.cells
              if resolve_cell(base, name).to_json() != resolve_cell(changed, name).to_json()}
    assert differ == BACKBONES


def status(repo: Path) -> dict:
    return json.loads(sh(["dvc", "status", "--json"], repo).stdout)


def ran(out: str) -> set[str]:
    return {line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage")}


@pytest.fixture(scope="module")
def pushed(reproduced: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished micro run, committed, pushed to a directory remote: (repo, remote).
    A copy of `reproduced`, since committing, adding a remote and pushing change it.
    Module-scoped: the tests only clone and pull from it."""
    repo = copy_state(reproduced, tmp_path_factory.mktemp("origin") / "repo")
    sh(["git", "add", "-A"], repo)  # dvc.lock and the cache: false metrics, as committed
    sh(["git", "commit", "-qm", "run"], repo)
    remote = tmp_path_factory.mktemp("remote")
    sh(["dvc", "remote", "add", "-d", "storage", str(remote)], repo)
    sh(["git", "commit", "-qam", "remote"], repo)
    sh(["dvc", "push"], repo)
    return repo, remote


@pytest.fixture
def clone(pushed: tuple[Path, Path], tmp_path: Path) -> Path:
    """A fresh `git clone` of the pushed repository, nothing pulled: this test's own, since
    the tests pull into it and change its params."""
    repo, _ = pushed
    dest = tmp_path / "clone"
    sh(["git", "clone", "-q", str(repo), str(dest)], repo)
    return dest


@pytest.mark.slow
@SHARES_REPRO
def test_a_fresh_clone_pulls_the_run_and_reruns_nothing(pushed, clone):
    repo, remote = pushed
    assert any(p.is_file() for p in remote.rglob("*"))
    before = status(clone)  # a clone has the lock file but none of the outputs
    assert "not in cache" in json.dumps(before["train@backbone"])
    sh(["dvc", "pull"], clone)
    assert (clone / "models" / "backbone" / "seed42.pt").is_file()
    assert (clone / "reports" / "html" / "index.html").is_file()
    # everything is current: a repro runs nothing; forced, configure writes its files
    # byte for byte (the same machine resolves auto alike) and nothing after it runs
    assert status(clone) == {}
    assert ran(sh(["dvc", "repro"], clone).stdout) == set()
    assert ran(sh(["dvc", "repro", "--force", "configure"], clone).stdout) == {"configure"}
    assert status(clone) == {}


@pytest.mark.slow
@SHARES_REPRO
def test_a_readout_change_marks_only_the_backbone_stale(clone):
    """What `dvc exp run -S model.readout=raw` would rerun, without training: configure
    alone, then `dvc status`. Only the backbone's train stage sees a changed dependency
    (its downstream follows it); the paper A cells pin their readout."""
    sh(["dvc", "pull"], clone)  # the run's outputs, so status sees only what changed
    params = yaml.safe_load((clone / "params.yaml").read_text())
    params["model"]["readout"] = "raw"
    (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh(["dvc", "repro", "--single-item", "configure"], clone)
    stale = {stage for stage in status(clone) if stage.startswith("train@")}
    assert stale == {"train@backbone"}
    cells = yaml.safe_load((clone / "params.yaml").read_text())["cells"]
    assert {"terminal_normed", "perloop_normed", "perloop_raw"} <= set(cells)
