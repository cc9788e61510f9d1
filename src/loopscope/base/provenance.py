"""What a stage's output was computed from, in terms a reader can check against dvc.lock.

A stage that writes a result meant to be read on its own (tables/claims.json, each
report) records, before it runs:
- `inputs`: every dependency dvc.yaml lists for the stage, by the digest DVC gives it
  (`dvc_digest`: the md5 of a file's bytes; for a folder, the md5 of the JSON list of
  its files' md5s, with ".dir" appended). After the run dvc.lock records the same
  digests for the stage's deps, so a committed result and the committed dvc.lock can
  be compared (`lock_digests`);
- `params`: the keys it reads and the sha256 of their values (`params_digest`), the
  same over dvc.lock's `params:` of the stage;
- `commit`: the commit checked out when the stage started. A result is committed after
  the run, in a child of that commit, so the commit names the code the run started
  from, and the inputs' digests (the code's files among them) say exactly what ran.

Kept in base, below the judges and the renderers, so the claims stage and the reports
record provenance alike; it reads no output through loopscope.base.outputs.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from loopscope.base.errors import DataError
from loopscope.base.machine import cpu_identity, cpu_model

DVC_YAML = Path("dvc.yaml")
PACKAGES = ("torch", "numpy", "pandas", "dvc")  # what a result's numbers depend on


def file_md5(path: Path) -> str:
    digest = hashlib.md5()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def dvc_digest(path: Path) -> str:
    """The digest DVC records for a dependency: a file's md5, or a folder's (the md5 of
    the sorted JSON list of {md5, relpath} of every file under it, plus ".dir")."""
    if path.is_file():
        return file_md5(path)
    if not path.is_dir():
        raise DataError(f"{path}: a dependency of this stage is missing; run `dvc repro` "
                        "(it builds every dependency first).")
    entries = sorted(({"md5": file_md5(f), "relpath": f.relative_to(path).as_posix()}
                      for f in path.rglob("*") if f.is_file()), key=lambda e: e["relpath"])
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode()).hexdigest() + ".dir"


def stage_deps(stage: str) -> list[str]:
    """The deps dvc.yaml lists for a stage (one without foreach: claims, report_*)."""
    stages = yaml.safe_load(DVC_YAML.read_text())["stages"]
    if stage not in stages or "foreach" in stages[stage]:
        raise DataError(f"{DVC_YAML}: no stage `{stage}` (without foreach) to name the "
                        "inputs of.")
    return [str(d) for d in stages[stage].get("deps", [])]


def params_digest(values: dict[str, Any]) -> str:
    """The sha256 (16 hex digits) of the params a stage read, {dotted key: value} as
    dvc.lock records them: equal values give equal digests whatever else params.yaml
    holds."""
    text = json.dumps(values, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_params(keys: tuple[str, ...] | list[str], params: Path = Path("params.yaml")
                ) -> dict[str, Any]:
    """{dotted key: value} of params.yaml for the keys a stage reads."""
    found = yaml.safe_load(params.read_text())
    out = {}
    for key in keys:
        node = found
        for part in key.split("."):
            node = node[part]
        out[key] = node
    return out


def commit() -> str | None:
    """The commit checked out (None outside a git checkout). Never marked dirty: a
    result is committed after the run that made it, so a mark would always be there;
    the inputs' digests say what the working tree held."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def packages() -> dict[str, str]:
    """Python's version and the installed versions of PACKAGES (from their metadata:
    torch is not imported)."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def record(stage: str, keys: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """The provenance of a stage's result, taken before it runs (module doc): commit,
    inputs, params, date, package versions and CPU."""
    return {"stage": stage, "commit": commit(),
            "inputs": {d: dvc_digest(Path(d)) for d in stage_deps(stage)},
            "params": {"keys": list(keys), "sha256": params_digest(read_params(keys))},
            "date": datetime.date.today().isoformat(), "packages": packages(),
            "cpu": cpu_model(), "cpu_identity": cpu_identity()}


def lock_digests(entry: dict[str, Any]) -> tuple[dict[str, str], str]:
    """A dvc.lock stage entry's deps by digest, and its params' digest: what `record`
    gave for the same run."""
    deps = {d["path"]: d["md5"] for d in entry.get("deps", [])}
    return deps, params_digest(entry.get("params", {}).get("params.yaml", {}))
