"""What a report was computed from: commit, params digest, torch version, training
precision, seeds and date. Kept apart from the report runner (loopscope.render.report)
so the notebooks read it without importing papermill, and torch's version is read from
the installed package's metadata, not by importing torch."""

from __future__ import annotations

import datetime
import hashlib
import subprocess
from importlib import metadata

from loopscope.base import paths
from loopscope.weights.config import load_cell


def training_precision() -> str:
    """The precision the cells trained in, from configs/ (configure resolves auto), e.g.
    "fp32" or "bf16 (backbone, backbone_mean4), fp32 (the other 8)"."""
    by: dict[str, list[str]] = {}
    for f in sorted(paths.CONFIGS.glob("*.json")):
        by.setdefault(load_cell(f).train.precision, []).append(f.stem)
    if len(by) <= 1:
        return next(iter(by), "unknown (no configs/)")
    rest = max(by, key=lambda p: len(by[p]))
    named = [f"{p} ({', '.join(c)})" for p, c in by.items() if p != rest]
    return ", ".join(named) + f", {rest} (the other {len(by[rest])})"


def commit() -> str:
    """The short commit, marked where src/, stages/, the notebooks or the params differ
    from it."""
    try:
        found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                               text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                "src", "stages", "reports/*.ipynb", "params.yaml", "dvc.yaml"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return found + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def provenance(seeds: list[int]) -> dict[str, str]:
    """What a report was computed from (measurements are fp32 whatever training was)."""
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    return {"commit": commit(),
            "params.yaml sha256": hashlib.sha256(paths.PARAMS.read_bytes()).hexdigest()[:16],
            "torch": torch,
            "training precision": training_precision() + " (measured in fp32)",
            "seeds": ", ".join(map(str, seeds)),
            "date": datetime.date.today().isoformat()}
