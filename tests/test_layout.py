"""dvc.yaml against the code: every stage depends on exactly the loopscope modules it
runs (so an edit can never leave results that `dvc status` calls up to date), and the
paths it declares are the ones loopscope.paths writes."""

import ast
import json
import re
from pathlib import Path

import pytest
import yaml

from loopscope import paths

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "loopscope"
DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text())


def imported_modules(tree: ast.AST) -> set[str]:
    """loopscope modules a syntax tree imports, anywhere (also inside functions)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[0] != "loopscope":
                continue
            found |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names
                      if a.name.startswith("loopscope.")}
    return {m for m in found if (PKG / f"{m}.py").is_file()}


def source_tree(path: Path) -> ast.AST:
    """A Python file's syntax tree; for a notebook, that of its code cells together."""
    if path.suffix != ".ipynb":
        return ast.parse(path.read_text())
    cells = json.loads(path.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return ast.parse(code)


def closure(entry: Path) -> set[str]:
    """Every loopscope module the entry file runs, following imports transitively."""
    seen: set[str] = set()
    todo = list(imported_modules(source_tree(entry)))
    while todo:
        mod = todo.pop()
        if mod not in seen:
            seen.add(mod)
            todo += imported_modules(source_tree(PKG / f"{mod}.py"))
    return seen


def instances() -> list[tuple[str, dict]]:
    """Every stage of dvc.yaml, foreach stages once per item, with ${key}/${item}
    filled in (cells come from params.yaml)."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    out = []
    for name, stage in DVC["stages"].items():
        if "foreach" not in stage:
            out.append((name, stage))
            continue
        items = stage["foreach"]
        if isinstance(items, str):  # ${cells}, ${policies.cells}
            for key in items.strip("${}").split("."):
                params = params[key]
            items = params
            params = yaml.safe_load((ROOT / "params.yaml").read_text())
        for item in items:
            text = yaml.safe_dump(stage["do"]).replace("${key}", item).replace("${item}", item)
            out.append((f"{name}@{item}", yaml.safe_load(text)))
    return out


def entries(stage: dict) -> list[Path]:
    """The files a stage executes: its script, and the notebook a report stage runs."""
    script = re.search(r"stages/\w+\.py", stage["cmd"])
    found = [ROOT / script.group(0)] if script else []
    found += [ROOT / d for d in stage.get("deps", []) if str(d).endswith(".ipynb")]
    return found


def listed_modules(stage: dict) -> set[str]:
    return {Path(d).stem for d in stage.get("deps", [])
            if str(d).startswith("src/loopscope/") and str(d).endswith(".py")}


STAGES = instances()


def test_the_package_init_holds_no_code():
    """No stage lists src/loopscope/__init__.py: it must stay a docstring alone."""
    body = ast.parse((PKG / "__init__.py").read_text()).body
    assert all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


@pytest.mark.parametrize("name, stage", STAGES, ids=[n for n, _ in STAGES])
def test_stage_deps_are_exactly_the_modules_it_runs(name, stage):
    runs = set().union(*(closure(e) for e in entries(stage))) if entries(stage) else set()
    listed = listed_modules(stage)
    assert not runs - listed, f"{name}: dvc.yaml misses deps on {sorted(runs - listed)}"
    assert not listed - runs, f"{name}: dvc.yaml lists modules it never imports: " \
                              f"{sorted(listed - runs)}"
    for entry in entries(stage):
        assert str(entry.relative_to(ROOT)) in stage["deps"], f"{name}: {entry} not a dep"


def test_the_check_fails_when_a_dependency_is_deleted():
    """The test above can fail: drop one module from a stage's deps and it sees it."""
    name, stage = next((n, s) for n, s in STAGES if n.startswith("diagnose@"))
    crippled = {**stage, "deps": [d for d in stage["deps"] if d != "src/loopscope/data.py"]}
    runs = set().union(*(closure(e) for e in entries(crippled)))
    assert "data" in runs - listed_modules(crippled)


# The claims modules, and the stages that may import them: everything else measures, and
# a measurement must not rerun because a claim was reworded.
CLAIMS_MODULES = {"claims", "paper_a", "paper_b"}
JUDGING_STAGES = {"claims", "report_blind_spot", "report_convergence", "report_index"}


def claims_imported(name: str, files: list[Path]) -> set[str]:
    """The claims modules that stage `name`, executing `files`, runs but may not."""
    if name.split("@")[0] in JUDGING_STAGES:
        return set()
    return set().union(*(closure(f) for f in files)) & CLAIMS_MODULES


@pytest.mark.parametrize("name, stage", STAGES, ids=[n for n, _ in STAGES])
def test_no_measuring_stage_imports_a_claims_module(name, stage):
    found = claims_imported(name, entries(stage))
    assert not found, (f"{name} imports {sorted(found)}: measuring code takes its statistics "
                       "from loopscope.stats")


def test_the_claims_import_check_fails_on_a_measuring_stage_that_imports_one(tmp_path):
    """The test above can fail: a measuring stage's script that imports paper A's claims
    is caught, the claims stage running the same script is not."""
    script = tmp_path / "diagnose.py"
    script.write_text("from loopscope.paper_a import CellA\n")
    assert claims_imported("diagnose@backbone", [script]) == {"paper_a"}
    assert claims_imported("claims", [script]) == set()


def test_the_exit_benchmark_stage_runs_no_training_code():
    """bench_exits times trained models, which it reads as files: neither the training
    loop nor the training benchmark is among its modules, so editing them does not rerun
    it."""
    found = closure(ROOT / "stages" / "bench_exits.py") & {"bench", "bench_train", "train"}
    assert not found, f"bench_exits imports {sorted(found)}"


def outs(stage: dict) -> set[str]:
    found = set()
    for key in ("outs", "metrics", "plots"):
        for item in stage.get(key, []):
            found.add(str(next(iter(item)) if isinstance(item, dict) else item))
    return found


def test_stage_outputs_are_where_loopscope_paths_puts_them():
    cells = yaml.safe_load((ROOT / "params.yaml").read_text())["cells"]
    cell = next(iter(cells))
    stages = dict(STAGES)
    assert str(paths.CONFIGS) in outs(stages["configure"])
    assert str(paths.PREPARED) in outs(stages["prepare"])
    assert {str(paths.model_dir(cell)), str(paths.metrics_file("train", cell)),
            f"{paths.dvclive_dir(cell)}/metrics.json"} <= outs(stages[f"train@{cell}"])
    assert str(paths.config_file(cell)) in stages[f"train@{cell}"]["deps"]
    assert str(paths.EXTRACTS / cell) in outs(stages[f"extract@{cell}"])
    assert str(paths.metrics_file("diagnose", cell)) in outs(stages[f"diagnose@{cell}"])
    assert str(paths.metrics_file("throughput", cell).parent) in outs(stages["throughput"])
    assert str(paths.metrics_file("clamp", cell)) in outs(stages[f"diagnose@{cell}"])
    assert str(paths.HEADLINE) in outs(stages["headline"])
    assert str(paths.table_file("convergence", cell)) in outs(stages[f"convergence@{cell}"])
    assert str(paths.metrics_file("convergence", cell)) in outs(stages[f"convergence@{cell}"])
    backbone = yaml.safe_load((ROOT / "params.yaml").read_text())["policies"]["cells"][0]
    assert str(paths.table_file("policies", backbone)) in outs(stages[f"policies@{backbone}"])
    assert str(paths.metrics_file("policies", backbone)) in outs(stages[f"policies@{backbone}"])
    reports = [n for n in stages if n.startswith("report_")]
    assert len(reports) == 3
    for name in reports:
        report = name.removeprefix("report_")
        assert str(paths.report_html(report)) in outs(stages[name])
        assert str(paths.report_template(report)) in stages[name]["deps"]


def test_the_resume_fingerprint_covers_what_training_runs(tmp_path, monkeypatch):
    """A resume checkpoint is discarded when code that training runs changes, and kept
    when a report or a claim changes (loopscope.checkpoint.run_fingerprint)."""
    import shutil

    import torch
    from conftest import tiny_cell

    from loopscope import checkpoint
    covered = {p.stem for p in checkpoint.imported_modules("train")}
    assert {"train", "model", "config", "data", "depth", "checkpoint"} <= covered
    assert covered <= closure(ROOT / "stages" / "train.py")
    assert not covered & {"levers", "report", "paper_a", "paper_b", "stats", "claims"}
    pkg = tmp_path / "loopscope"
    shutil.copytree(PKG, pkg)
    monkeypatch.setattr(checkpoint, "PACKAGE", pkg)
    cell, tokens = tiny_cell(), torch.arange(64)
    before = checkpoint.run_fingerprint(cell, tokens)
    (pkg / "paper_a.py").write_text((pkg / "paper_a.py").read_text() + "\n# reworded\n")
    assert checkpoint.run_fingerprint(cell, tokens) == before
    (pkg / "model.py").write_text((pkg / "model.py").read_text() + "\n# edited\n")
    assert checkpoint.run_fingerprint(cell, tokens) != before
