"""Provenance that stays true (loopscope.base.provenance): tables/claims.json and every
report name their inputs by the digests DVC gives them and the commit the run started
from, recorded before the run; the committed results agree with the committed dvc.lock."""

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from loopscope.base import provenance
from loopscope.base.errors import DataError

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ("blind_spot", "convergence", "index")
DIGEST = re.compile(r"<td>([^<]+)</td>\s*<td>([0-9a-f]{32}(?:\.dir)?|sha256:[0-9a-f]{16})</td>")


def workspace(root: Path) -> None:
    """A tiny repository layout: dvc.yaml with one stage, its deps, params.yaml."""
    (root / "data").mkdir()
    (root / "data" / "b.txt").write_text("b\n")
    (root / "data" / "sub").mkdir()
    (root / "data" / "sub" / "a.txt").write_text("a\n")
    (root / "code.py").write_text("print('hi')\n")
    (root / "params.yaml").write_text("cells: {x: {lr: 0.001}}\nclaims:\n  margin: 0.01\n"
                                      "  other: 2\n")
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "judge": {"cmd": "python code.py", "deps": ["code.py", "data"],
                  "params": ["cells", "claims.margin"]},
        "per@cell": {"foreach": ["a"], "do": {"cmd": "x"}}}}))


def test_a_folder_digest_is_dvcs(tmp_path):
    """DVC's digest of a folder: the md5 of the JSON list (sorted by path) of each file's
    md5 and relative path, with ".dir" appended (the committed dvc.lock's folders check
    it against DVC itself: test_the_digests_are_dvcs_on_the_committed_outputs)."""
    workspace(tmp_path)
    import hashlib
    listing = [{"md5": hashlib.md5(b"b\n").hexdigest(), "relpath": "b.txt"},
               {"md5": hashlib.md5(b"a\n").hexdigest(), "relpath": "sub/a.txt"}]
    expected = hashlib.md5(json.dumps(listing, sort_keys=True).encode()).hexdigest() + ".dir"
    assert provenance.dvc_digest(tmp_path / "data") == expected
    assert provenance.dvc_digest(tmp_path / "code.py") == hashlib.md5(
        b"print('hi')\n").hexdigest()
    with pytest.raises(DataError, match="missing; run `dvc repro`"):
        provenance.dvc_digest(tmp_path / "absent")


def test_the_record_names_every_dep_and_the_params_read(tmp_path, monkeypatch):
    workspace(tmp_path)
    monkeypatch.chdir(tmp_path)
    found = provenance.record("judge", ("cells", "claims.margin"))
    assert list(found["inputs"]) == ["code.py", "data"]
    assert found["inputs"]["data"].endswith(".dir")
    assert found["params"]["keys"] == ["cells", "claims.margin"]
    assert found["commit"] is None  # not a git checkout: said, not guessed
    assert {"python", "torch", "numpy"} <= set(found["packages"]) and found["cpu"]
    # what dvc.lock records after the run gives the same digests
    lock = {"deps": [{"path": p, "md5": d, "hash": "md5"} for p, d in found["inputs"].items()],
            "params": {"params.yaml": {"cells": {"x": {"lr": 0.001}}, "claims.margin": 0.01}}}
    assert provenance.lock_digests(lock) == (found["inputs"], found["params"]["sha256"])
    # a key the stage does not read changes nothing; one it reads changes the digest
    (tmp_path / "params.yaml").write_text("cells: {x: {lr: 0.001}}\nclaims:\n  margin: 0.01\n"
                                          "  other: 3\n")
    assert provenance.record("judge", ("cells", "claims.margin"))["params"] == found["params"]
    (tmp_path / "params.yaml").write_text("cells: {x: {lr: 0.002}}\nclaims:\n  margin: 0.01\n")
    assert provenance.record("judge", ("cells", "claims.margin"))["params"] != found["params"]
    with pytest.raises(DataError, match="no stage `per@cell`"):
        provenance.stage_deps("per@cell")


def test_the_commit_is_the_one_checked_out_and_never_marked_dirty(tmp_path, monkeypatch):
    workspace(tmp_path)
    monkeypatch.chdir(tmp_path)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (tmp_path / "code.py").write_text("print('changed')\n")  # the run's code, uncommitted
    found = provenance.record("judge", ("cells",))
    assert found["commit"] == head
    assert found["inputs"]["code.py"] == provenance.dvc_digest(tmp_path / "code.py")


# ------------------------------------------------------------------ the committed run


def lock_stages() -> dict:
    return yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]


def report_digests(html: str) -> tuple[dict[str, str], str | None]:
    """A rendered report's inputs by DVC digest and its params' digest (the table
    report_tables.inputs_html writes)."""
    found = dict(DIGEST.findall(html))
    params = [k for k, v in found.items() if v.startswith("sha256:")]
    sha = found.pop(params[0]).removeprefix("sha256:") if params else None
    return found, sha


def test_the_report_digest_reader_reads_what_inputs_html_writes():
    from loopscope.render.report_tables import inputs_html
    html = inputs_html({"inputs": {"configs": "a" * 32 + ".dir", "x.py": "b" * 32},
                        "params": {"keys": ["cells"], "sha256": "c" * 16}})
    assert report_digests(html) == ({"configs": "a" * 32 + ".dir", "x.py": "b" * 32}, "c" * 16)
    assert report_digests("<p>Computed from: commit abc (with uncommitted changes)</p>") == (
        {}, None)


@pytest.mark.committed
@pytest.mark.parametrize("name", REPORTS)
def test_each_committed_report_names_the_inputs_dvc_lock_records(name):
    """The digests a committed report shows are its stage's deps and params in the
    committed dvc.lock, and no committed report speaks of uncommitted changes (a report
    is committed after the run that rendered it)."""
    html = (ROOT / "reports" / "html" / f"{name}.html").read_text()
    assert "uncommitted" not in html
    inputs, params = report_digests(html)
    deps, sha = provenance.lock_digests(lock_stages()[f"report_{name}"])
    assert inputs == deps
    assert params == sha


@pytest.mark.committed
def test_the_committed_claims_name_the_inputs_dvc_lock_records():
    found = json.loads((ROOT / "tables" / "claims.json").read_text())["provenance"]
    deps, sha = provenance.lock_digests(lock_stages()["claims"])
    assert found["inputs"] == deps and found["params"]["sha256"] == sha
    assert subprocess.run(["git", "cat-file", "-e", f"{found['commit']}^{{commit}}"],
                          cwd=ROOT).returncode == 0, "the commit the run started from"


@pytest.mark.committed
def test_the_digests_are_dvcs_on_the_committed_outputs():
    """dvc_digest against DVC itself: every output dvc.lock records that git holds
    (cache: false) and the working tree has, folders included, has the digest DVC gave."""
    checked = 0
    for entry in lock_stages().values():
        for out in entry.get("outs", []):
            path = ROOT / out["path"]
            tracked = subprocess.run(["git", "ls-files", "--error-unmatch", out["path"]],
                                     cwd=ROOT, capture_output=True).returncode == 0
            if tracked and path.exists():
                assert provenance.dvc_digest(path) == out["md5"], out["path"]
                checked += path.is_dir() + 1
    assert checked > 10
