"""Committed experiments: the verdicts of a `dvc exp run`, kept as data beside the
default run's, so a report can show whether a verdict survives a change that should not
move it (every seed list shifted by one, say).

An experiment's outputs live in DVC's cache and its exp refs, which a clone does not
carry; its verdicts are small. Right after `dvc exp run -n NAME -S ...` in a workspace
(or after `dvc exp apply NAME`):

    python -m loopscope.judge.experiments record NAME

writes experiments/NAME.json: the params it changed against HEAD, the commit it ran on,
its claims rows (tables/claims.json) and HEAD's (its baseline: the default judged by the
same criteria). Rows match by id. The reports read every such file (verdict_columns);
`flips` lists the verdicts that turned between holds and contradicted from an
experiment's baseline to it, which a change of seeds must never do. An experiment judged
by older criteria than the default's is compared with its own baseline, not with the
default.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from loopscope.base import paths
from loopscope.base.errors import DataError, LoopscopeError, ParamsError
from loopscope.base.files import write_json
from loopscope.base.outputs import read_json

EXPERIMENTS = paths.EXPERIMENTS
PAPERS = ("paper_a", "paper_b")
OPPOSITE = {"holds": "contradicted", "contradicted": "holds"}
# The modules whose code decides a verdict (and criteria.yaml, the declared parameters):
# what an experiment's verdicts and the default's are comparable under when equal
DECIDING = ("verdicts.py", "criteria.py", "criteria.yaml", "cells.py", "group_a.py",
            "paper_a.py", "controls_a.py", "frontier_a.py", "backbone.py", "paper_b.py",
            "policies_b.py", "settling.py")


def criteria_digest(values: Mapping[str, float]) -> str:
    """A digest of the criteria a run's claims were judged by: the code of the modules
    that decide verdicts (DECIDING), the declared parameters and their values (values:
    the claims section). Two runs judged under the same digest are comparable row by
    row; otherwise a verdict may differ by criterion, not by the run."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for name in DECIDING:
        path = here / name
        if path.is_file():
            digest.update(name.encode() + path.read_bytes())
    digest.update(json.dumps(dict(values), sort_keys=True).encode())
    return digest.hexdigest()[:16]


def cells_digest(configs: Mapping[str, Any]) -> str:
    """A digest of the cells a run judged: each cell's resolved config, by name."""
    return hashlib.sha256(json.dumps(dict(configs), sort_keys=True, default=str)
                          .encode()).hexdigest()[:16]


def stale(experiment: Mapping[str, Any], judged_with: Mapping[str, str] | None) -> bool:
    """Whether an experiment was judged under other criteria than a run's (judged_with:
    that run's claims' `judged_with`); one recorded before digests were kept is."""
    mine = (experiment.get("judged_with") or {}).get("criteria")
    return mine is None or judged_with is None or mine != judged_with.get("criteria")


def changed_params(base: Mapping[str, Any], new: Mapping[str, Any], prefix: str = ""
                   ) -> dict[str, Any]:
    """The dotted keys of `new` whose values differ from `base` (added ones too), as
    `dvc exp run -S` would name them; a removed key maps to None."""
    out: dict[str, Any] = {}
    for key in sorted(set(base) | set(new), key=str):
        a, b = base.get(key), new.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out.update(changed_params(a, b, f"{prefix}{key}."))
        elif a != b:
            out[f"{prefix}{key}"] = b
    return out


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise DataError(f"`git {' '.join(args)}` failed: {out.stderr.strip()}")
    return out.stdout


def record(name: str) -> Path:
    """Write experiments/NAME.json from the workspace: the params changed against HEAD,
    HEAD's commit, tables/claims.json, and HEAD's own claims (the default judged by the
    same code: the experiment's baseline). Refuses a workspace whose params equal
    HEAD's (nothing was run) or whose claims were computed from other cells than
    params.yaml holds (the claims stage is stale)."""
    params = yaml.safe_load(paths.PARAMS.read_text())
    changed = changed_params(yaml.safe_load(_git("show", "HEAD:params.yaml")), params)
    if not changed:
        raise ParamsError(f"{paths.PARAMS} equals HEAD's: no experiment in this workspace; "
                          f"run `dvc exp apply {name}` (or the `dvc exp run`) first.")
    lock = yaml.safe_load(paths.DVC_LOCK.read_text())
    judged = lock["stages"]["claims"]["params"]["params.yaml"].get("cells")
    if judged != params.get("cells"):
        raise DataError("dvc.lock: the claims stage was computed from other cells than "
                        f"{paths.PARAMS} holds; run `dvc repro claims` first.")
    claims = read_json(paths.CLAIMS, "claims")
    base = json.loads(_git("show", f"HEAD:{paths.CLAIMS}"))
    commit = _git("rev-parse", "HEAD").strip()
    path = EXPERIMENTS / f"{name}.json"
    if claims.get("judged_with", {}).get("criteria") != base.get("judged_with", {}).get(
            "criteria"):
        raise DataError(f"{paths.CLAIMS}: the experiment was judged under other criteria than "
                        f"HEAD's committed claims; commit the default's rerun claims first "
                        "(`dvc repro claims` on HEAD), then record.")
    write_json(path, {"experiment": name, "base_commit": commit, "params": changed,
                      "judged_with": claims.get("judged_with"),
                      "claims": {p: claims[p] for p in PAPERS},
                      "baseline": {p: base[p] for p in PAPERS},
                      "criteria": f"the claims' criteria as of {commit[:7]}: the experiment "
                                  "and its baseline (the default at that commit) are "
                                  "judged alike"})
    return path


def recorded() -> dict[str, dict[str, Any]]:
    """Every committed experiment, by name."""
    return {p.stem: json.loads(p.read_text())
            for p in sorted(EXPERIMENTS.glob("*.json"))}


def verdict_columns(default: list[dict[str, Any]],
                    experiments: Mapping[str, Mapping[str, list[dict[str, Any]]]]
                    ) -> pd.DataFrame:
    """A row per claim of the default run (by id): its group, the default's
    verdict, and for each experiment its baseline's ("NAME base": the default at the
    experiment's commit, judged by the same criteria as it) and its own ("-" where it
    has no such row). experiments: name -> {"claims": rows, "baseline": rows}."""
    def by_id(rows: list[dict[str, Any]]) -> dict[str, str]:
        return {r["id"]: r["verdict"] for r in rows}
    found = {name: (by_id(e["baseline"]), by_id(e["claims"])) for name, e in experiments.items()}
    return pd.DataFrame([{"id": row["id"], "claim": row["claim"], "group": row["group"],
                          "default": row["verdict"],
                          **{col: v.get(row["id"], "-") for name, (base, mine) in found.items()
                             for col, v in ((f"{name} base", base), (name, mine))}}
                         for row in default])


def flips(table: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows of verdict_columns whose verdict turned between holds and contradicted
    from experiment `name`'s baseline to the experiment (the same criteria)."""
    turned = [OPPOSITE.get(a) == b for a, b in zip(table[f"{name} base"], table[name],
                                                    strict=True)]
    return table[turned]


def run_counts(table: pd.DataFrame) -> pd.DataFrame:
    """Per run (the default, each experiment and its baseline): how many rows hold, are
    contradicted, inconclusive or not shown."""
    runs = [c for c in table.columns if c not in ("id", "claim", "group")]
    return (pd.DataFrame({r: table[r].value_counts() for r in runs}).fillna(0).astype(int)
            .reindex(["holds", "contradicted", "inconclusive", "not shown"], fill_value=0))


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "record":
        path = record(argv[1])
        print(f"wrote {path}")
    else:
        raise LoopscopeError("usage: python -m loopscope.judge.experiments record NAME")


if __name__ == "__main__":
    main(sys.argv[1:])
