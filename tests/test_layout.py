"""The layout against the code: folders are rerun reasons.

dvc.yaml reruns a stage when a file it depends on changes, so every stage depends on
exactly the loopscope modules it runs and the params keys it reads, and the packages
say why a stage reruns (docs/architecture.md):

    base < stats < looped < weights < preflight < measure < released < judge < render < tools

- a module imports from its own package and those below it, never above;
- training runs only what sets the weights (and base's error kinds and file writes): no
  pre-flight check, memory estimate, message, path or timing record;
- no measuring stage runs a judge, a renderer or a tool, nor base's readers and timings
  (their messages): rewording one reruns no measurement;
- the judges import no torch;
- no stage depends on the stage runner (loopscope.stage), which wraps them from outside.
Each rule has a test that shows it can fail.
"""

import ast
import fnmatch
import functools
import json
import re
from pathlib import Path

import pytest
import yaml

from loopscope.base import paths
from loopscope.weights.checkpoint import closure as module_closure
from loopscope.weights.checkpoint import imports

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "loopscope"
DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text())
FLOORS = ("base", "stats", "looped", "weights", "preflight", "measure", "released", "judge",
          "render", "tools")
# Top-level modules: the runner (base and preflight only, no stage depends on it) and the
# whole params file (configure and the tools; it gathers every package's sections).
TOP = {"stage": "preflight", "params": "render"}
MEASURING = ("extract", "diagnose", "throughput", "recalibrate", "convergence", "policies",
             "bench_exits", "outside_recalibrate",
             "outside_prepare", "outside_extract", "outside_diagnose", "outside_convergence",
             "outside_policies", "outside_bench_exits")
# An outside model for the stages over `outside:`, which params.yaml leaves empty: they
# are checked as one such model would build them
OUTSIDE_EXAMPLE = {"example": {"adapter": "huginn", "path": "tests/fixtures/huginn_tiny"}}
# base's modules whose messages the measuring stages must not depend on
READERS = {"base/outputs.py", "base/timings.py"}
TRAINING_BASE = {"base/errors.py", "base/files.py"}  # no message, no path, no layout
TRAINING_CONTRACT = {"looped/types.py"}  # the types LoopedLM implements the interface in


def source_tree(path: Path) -> ast.AST:
    """A Python file's syntax tree; for a notebook, that of its code cells together."""
    if path.suffix != ".ipynb":
        return ast.parse(path.read_text())
    cells = json.loads(path.read_text())["cells"]
    return ast.parse("\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code"))


def closure(*entries: Path) -> set[str]:
    """Every loopscope source file the entry files run, relative to src/loopscope."""
    return set(_closure(tuple((e, e.read_text()) for e in entries)))


@functools.cache
def _closure(entries: tuple[tuple[Path, str], ...]) -> frozenset[str]:
    """closure, once per set of entry files and their text: the stages of one kind share
    theirs (every extract@<cell> runs stages/extract.py)."""
    return frozenset(str(p.relative_to(PKG))
                     for p in module_closure([source_tree(e) for e, _ in entries]))


def instances() -> list[tuple[str, dict]]:
    """Every stage of dvc.yaml, foreach stages once per item, with ${key}/${item}
    filled in (cells come from params.yaml; the outside stages once, for
    OUTSIDE_EXAMPLE, where params.yaml names no outside model)."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    out = []
    for name, stage in DVC["stages"].items():
        if "foreach" not in stage:
            out.append((name, stage))
            continue
        items = params
        for key in stage["foreach"].strip("${}").split("."):  # ${cells}, ${policies.cells}
            items = items[key]
        if stage["foreach"] == "${outside}":
            items = items or OUTSIDE_EXAMPLE
        for item in items:
            path = items[item]["path"] if stage["foreach"] == "${outside}" else ""
            text = (yaml.safe_dump(stage["do"]).replace("${key}", item)
                    .replace("${item.path}", path).replace("${item}", item))
            out.append((f"{name}@{item}", yaml.safe_load(text)))
    return out


def entries(stage: dict) -> list[Path]:
    """The files a stage executes: its script, and the notebook a report stage runs."""
    found = [ROOT / s for s in re.findall(r"stages/\w+\.py", stage["cmd"])]
    found += [ROOT / d for d in stage.get("deps", []) if str(d).endswith(".ipynb")]
    return found


def listed(stage: dict) -> set[str]:
    return {d.removeprefix("src/loopscope/") for d in stage.get("deps", [])
            if str(d).startswith("src/loopscope/") and str(d).endswith(".py")}


STAGES = instances()
BY_NAME = dict(STAGES)


def kind(name: str) -> str:
    return name.split("@")[0]


# ------------------------------------------------------------------ deps = imports


def holds_code(init: Path) -> bool:
    """Whether a package's __init__.py holds anything but a docstring."""
    return not all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
                   for n in ast.parse(init.read_text()).body)


def test_every_package_init_holds_no_code():
    """No stage lists a package's __init__.py: importing one runs nothing, so it can
    change no output; it must stay a docstring alone for that to hold."""
    assert not [init for init in PKG.rglob("__init__.py") if holds_code(init)]


def test_the_init_check_fails_on_code(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text('"""a package"""\nfrom loopscope.base import paths\n')
    assert holds_code(init)
    init.write_text('"""a package"""\n')
    assert not holds_code(init)


@pytest.mark.parametrize("name, stage", STAGES, ids=[n for n, _ in STAGES])
def test_stage_deps_are_exactly_the_modules_it_runs(name, stage):
    runs = closure(*entries(stage))
    missing = sorted(runs - listed(stage))
    assert not missing, f"{name}: dvc.yaml misses deps on {missing}"
    assert not listed(stage) - runs, f"{name}: dvc.yaml lists modules it never imports: " \
                                     f"{sorted(listed(stage) - runs)}"
    for entry in entries(stage):
        assert str(entry.relative_to(ROOT)) in stage["deps"], f"{name}: {entry} not a dep"


def test_the_check_fails_when_a_dependency_is_deleted():
    """The test above can fail: drop one module from a stage's deps and it sees it."""
    name, stage = next((n, s) for n, s in STAGES if n.startswith("diagnose@"))
    crippled = {**stage, "deps": [d for d in stage["deps"]
                                  if d != "src/loopscope/weights/data.py"]}
    assert "weights/data.py" in closure(*entries(crippled)) - listed(crippled)


# ------------------------------------------------------------------- the floors


def floor(rel: str) -> str:
    """The package of a source file relative to src/loopscope ("measure/per_loop/sweep.py")."""
    top = rel.split("/")[0]
    return TOP[top.removesuffix(".py")] if top.endswith(".py") else top


def climbs(rel: str, pkg: Path = PKG) -> list[str]:
    """The modules a source file (in package folder pkg) imports from a package above
    its own."""
    mine = FLOORS.index(floor(rel))
    found = []
    for module in imports(ast.parse((pkg / rel).read_text())):
        target = module.removeprefix("loopscope.").replace(".", "/")
        target = target + ".py" if (pkg / f"{target}.py").is_file() else target + "/__init__.py"
        if FLOORS.index(floor(target)) > mine:
            found.append(module)
    return found


SOURCES = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                 if p.name != "__init__.py")


@pytest.mark.parametrize("rel", SOURCES)
def test_no_module_imports_from_a_package_above_its_own(rel):
    assert not climbs(rel), f"{rel} ({floor(rel)}) imports {climbs(rel)} from above"


def test_the_floor_check_fails_on_a_module_that_climbs(tmp_path):
    """The test above can fail: a weights module that imports a judge is caught."""
    fake = tmp_path / "loopscope"
    (fake / "weights").mkdir(parents=True)
    (fake / "judge").mkdir()
    (fake / "judge" / "verdicts.py").write_text("")
    (fake / "weights" / "model.py").write_text("from loopscope.judge.verdicts import effect\n")
    assert climbs("weights/model.py", fake) == ["loopscope.judge.verdicts"]


# ------------------------------------------------------------ closures by reason


def training_leaks(files: set[str]) -> set[str]:
    """What a training closure holds beyond what sets the weights."""
    return {f for f in files if floor(f) != "weights" and f not in TRAINING_BASE
            and f not in TRAINING_CONTRACT}


def measuring_leaks(files: set[str]) -> set[str]:
    """What a measuring closure holds of the judges, renderers, tools or base's readers."""
    return {f for f in files if floor(f) in ("judge", "render", "tools") or f in READERS
            or f in ("stage.py", "params.py")}


@pytest.mark.parametrize("name, stage", [s for s in STAGES if kind(s[0]) == "train"],
                         ids=[n for n, _ in STAGES if kind(n) == "train"])
def test_training_runs_only_what_sets_the_weights(name, stage):
    """A reworded message, a memory estimate, a path or a timing record retrains
    nothing: training's closure is weights/ and base's error kinds and file writes."""
    assert not training_leaks(closure(*entries(stage)))


@pytest.mark.parametrize("name, stage", [s for s in STAGES if kind(s[0]) in MEASURING],
                         ids=[n for n, _ in STAGES if kind(n) in MEASURING])
def test_no_measuring_stage_runs_a_judge_a_renderer_or_a_reader(name, stage):
    assert not measuring_leaks(closure(*entries(stage)))


# ------------------------------------------------------------------- the walls
# Released checkpoints and the exit runtime are folders of their own, so that an edit to
# either reruns only the stages that run it.

RELEASED_STAGES = {"configure"}  # validates the outside entries through their layouts
BENCH_STAGES = {"bench_exits", "outside_bench_exits"}


def stages_listing(folder: str, stages: list[tuple[str, dict]] = STAGES) -> set[str]:
    """The stages whose deps hold a file of src/loopscope/<folder>/."""
    return {name for name, stage in stages
            if any(str(d).startswith(f"src/loopscope/{folder}/") for d in stage.get("deps", []))}


def test_an_edit_to_a_released_layout_reruns_only_the_outside_stages():
    """An edit to any file of the released-models package leaves every trained cell's
    stages up to date: only configure (whose cell configs come out byte for byte, so
    nothing downstream of it reruns) and the outside stages list it."""
    listing = stages_listing("released")
    assert listing, "no stage depends on the released-models package"
    assert {kind(n) for n in listing} - RELEASED_STAGES <= {
        k for k in MEASURING + ("outside_prepare",) if k.startswith("outside_")}
    assert not [n for n in listing if "@" in n and not n.startswith("outside_")]


def test_an_edit_to_the_runtime_reruns_only_the_bench_stages():
    listing = stages_listing("measure/bench")
    assert listing and {kind(n) for n in listing} <= BENCH_STAGES, listing


def test_the_walls_see_a_stage_that_climbs_them():
    """The two tests above can fail: a trained cell's stage that lists a layout, or a
    policies stage that lists the runtime, is seen."""
    fake = [("extract@x", {"deps": ["src/loopscope/released/huginn.py"]}),
            ("policies@x", {"deps": ["src/loopscope/measure/bench/runtime.py"]})]
    assert stages_listing("released", fake) == {"extract@x"}
    assert stages_listing("measure/bench", fake) == {"policies@x"}


def outputs_of(stages: list[tuple[str, dict]]) -> set[str]:
    """Every path a stage writes (outs, metrics, plots), as written in dvc.yaml."""
    found = set()
    for _, stage in stages:
        for key in ("outs", "metrics", "plots"):
            for out in stage.get(key, []):
                found.add(next(iter(out)) if isinstance(out, dict) else str(out))
    return found


# Committed files there that no stage writes, each with its writer
NOT_STAGE_OUTPUTS = {
    "tables/claims.schema.json": "the claims' JSON schema, kept by hand beside claims.json",
    "metrics/bench/train*.json": "the training benchmark: python -m loopscope.tools.bench train",
    "*/.gitignore": "DVC's own, beside the outputs it caches",
}


def strays(root: Path, folders: tuple[str, ...], stages: list[tuple[str, dict]]) -> list[str]:
    """Files under the folders that no stage of dvc.yaml writes (nor lies under a folder
    one writes), other than NOT_STAGE_OUTPUTS: what a removed foreach item leaves
    behind, which DVC does not prune."""
    written = outputs_of(stages)
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*")):
            rel = str(path.relative_to(root))
            if (path.is_file() and not any(fnmatch.fnmatch(rel, p) for p in NOT_STAGE_OUTPUTS)
                    and not any(rel == w or rel.startswith(w.rstrip("/") + "/")
                                for w in written)):
                found.append(rel)
    return found


def test_every_committed_metric_and_table_belongs_to_a_stage():
    """Nothing under metrics/ or tables/ is left over from a stage that is gone (the
    judges would read it as current)."""
    assert not strays(ROOT, ("metrics", "tables"), STAGES)


def test_the_stray_check_sees_a_leftover(tmp_path):
    (tmp_path / "metrics" / "policies").mkdir(parents=True)
    (tmp_path / "metrics" / "policies" / "gone.json").write_text("{}")
    (tmp_path / "metrics" / "policies" / "kept.json").write_text("{}")
    stages = [("policies@kept", {"metrics": [{"metrics/policies/kept.json": {}}]})]
    assert strays(tmp_path, ("metrics",), stages) == ["metrics/policies/gone.json"]


def test_the_closure_rules_fail_on_a_leak(tmp_path):
    """The two tests above can fail: a training script that checks memory, and a
    measuring one that judges or reads outputs, are caught."""
    train = tmp_path / "train.py"
    train.write_text("from loopscope.preflight import memory\n"
                     "from loopscope.weights import train\n")
    assert "preflight/memory.py" in training_leaks(closure(train))
    diagnose = tmp_path / "diagnose.py"
    diagnose.write_text("from loopscope.judge.verdicts import effect\n")
    assert "judge/verdicts.py" in measuring_leaks(closure(diagnose))
    diagnose.write_text("from loopscope.base.outputs import read_metrics\n")
    assert measuring_leaks(closure(diagnose)) == {"base/outputs.py"}


def torch_importers(files: set[str]) -> set[str]:
    """The files that import torch."""
    def imports_torch(rel: str) -> bool:
        for node in ast.walk(ast.parse((PKG / rel).read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "torch" or n.startswith("torch.") for n in names):
                return True
        return False
    return {f for f in files if imports_torch(f)}


def test_the_judges_import_no_torch():
    """The judges read metrics and tables; what they run holds no torch import, so the
    claims stage starts in a fraction of a second and a judge cannot run a model."""
    judges = [PKG / rel for rel in SOURCES if floor(rel) == "judge"]
    found = torch_importers(closure(*judges) | {str(p.relative_to(PKG)) for p in judges})
    assert not found, f"the judges run torch through {sorted(found)}"
    assert torch_importers({"weights/model.py"})  # the check sees a torch import


@pytest.mark.parametrize("name, stage", STAGES, ids=[n for n, _ in STAGES])
def test_no_stage_depends_on_the_runner(name, stage):
    """Every stage runs through the runner, from outside its script."""
    assert stage["cmd"].startswith("python -m loopscope.stage ")
    assert "stage.py" not in closure(*entries(stage))


def test_the_exit_benchmark_stage_runs_no_training_code():
    """bench_exits times trained models, which it reads as files."""
    found = closure(ROOT / "stages" / "bench_exits.py") & {
        "tools/bench.py", "tools/bench_train.py", "weights/train.py"}
    assert not found, f"bench_exits imports {sorted(found)}"


# ------------------------------------------------------------------ params per key


def declared(stage_name: str, stage: dict) -> tuple[str, ...]:
    """READS of the stage's script (a report's entry by its name), as a module constant
    or imported from the library."""
    script = [e for e in entries(stage) if e.name != "outside.py"][0]  # the job's own
    tree = ast.parse(script.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "READS"
                                                for t in node.targets):
            value = ast.literal_eval(node.value)
            return tuple(value[stage["cmd"].split()[-1]] if isinstance(value, dict) else value)
        if isinstance(node, ast.ImportFrom) and any(a.name == "READS" for a in node.names):
            return tuple(__import__(node.module, fromlist=["READS"]).READS)
    raise AssertionError(f"{script} declares no READS")


@pytest.mark.parametrize("name, stage",
                         [s for s in STAGES if kind(s[0]) not in ("configure", "train")],
                         ids=[n for n, _ in STAGES if kind(n) not in ("configure", "train")])
def test_a_stage_lists_exactly_the_params_keys_it_reads(name, stage):
    """dvc.yaml's params of a stage are its script's READS, the keys its params view
    lets it read (loopscope.weights.params.load: any other key raises), so a param
    change reruns exactly the stages that read it. The end-to-end run also records
    what each stage really read (tests/test_pipeline.py)."""
    assert list(stage.get("params", [])) == list(declared(name, stage))


def test_training_reads_no_params_and_configure_validates_the_whole_file():
    cell = next(n for n in BY_NAME if kind(n) == "train")
    assert "params" not in BY_NAME[cell]
    from loopscope.params import SECTIONS
    assert set(BY_NAME["configure"]["params"]) == {*SECTIONS, "cells", "seeds", "outside"}


def test_the_params_check_fails_on_an_undeclared_key():
    """A stage whose dvc.yaml params lack a key its READS has is caught."""
    name, stage = next((n, s) for n, s in STAGES if n.startswith("diagnose@"))
    crippled = {**stage, "params": stage["params"][:-1]}
    assert list(crippled["params"]) != list(declared(name, crippled))


def test_no_claims_parameter_reaches_a_measuring_stage():
    """The claims' free parameters (claims:) are read by the claims and the reports."""
    for name, stage in STAGES:
        if any(str(p).startswith("claims") for p in stage.get("params", [])):
            assert kind(name) in ("configure", "claims") or kind(name).startswith("report_")


# ------------------------------------------------------------------------- paths


def outs(stage: dict) -> set[str]:
    found = set()
    for key in ("outs", "metrics", "plots"):
        for item in stage.get(key, []):
            found.add(str(next(iter(item)) if isinstance(item, dict) else item))
    return found


def option(cmd: str, name: str) -> str:
    """The value of --name in a stage's command."""
    return re.search(rf"--{name} (\S+)", cmd).group(1)


def test_the_train_command_names_the_paths_loopscope_paths_puts_them_at():
    """Training holds no layout: its paths come from dvc.yaml's cmd, these."""
    cell = next(iter(yaml.safe_load((ROOT / "params.yaml").read_text())["cells"]))
    stage = BY_NAME[f"train@{cell}"]
    cmd = stage["cmd"]
    assert option(cmd, "config") == str(paths.config_file(cell))
    assert option(cmd, "prepared") == str(paths.PREPARED)
    assert option(cmd, "model").format(seed=42) == str(paths.model_file(cell, 42))
    assert option(cmd, "resume").format(seed=42) == str(paths.resume_file(cell, 42))
    assert option(cmd, "live") == str(paths.dvclive_dir(cell))
    assert option(cmd, "metrics") == str(paths.metrics_file("train", cell))
    assert option(cmd, "timings") == str(paths.metrics_file(paths.TRAIN_TIMINGS, cell))
    assert Path(option(cmd, "model").format(seed=42)).stem == paths.seed_tag(42)
    assert {str(paths.model_dir(cell)), option(cmd, "metrics"), option(cmd, "timings"),
            f"{option(cmd, 'live')}/metrics.json"} <= outs(stage)
    assert option(cmd, "config") in stage["deps"]


def test_stage_outputs_are_where_loopscope_paths_puts_them():
    cells = yaml.safe_load((ROOT / "params.yaml").read_text())["cells"]
    cell = next(iter(cells))
    assert str(paths.CONFIGS) in outs(BY_NAME["configure"])
    assert str(paths.PREPARED) in outs(BY_NAME["prepare"])
    assert str(paths.EXTRACTS / cell) in outs(BY_NAME[f"extract@{cell}"])
    assert str(paths.metrics_file("diagnose", cell)) in outs(BY_NAME[f"diagnose@{cell}"])
    assert str(paths.metrics_file("throughput", cell).parent) in outs(BY_NAME["throughput"])
    assert str(paths.metrics_file("clamp", cell)) in outs(BY_NAME[f"diagnose@{cell}"])
    assert str(paths.HEADLINE) in outs(BY_NAME["headline"])
    assert str(paths.CLAIMS) in outs(BY_NAME["claims"])
    assert str(paths.table_file("convergence", cell)) in outs(BY_NAME[f"convergence@{cell}"])
    assert str(paths.metrics_file("convergence", cell)) in outs(BY_NAME[f"convergence@{cell}"])
    backbone = yaml.safe_load((ROOT / "params.yaml").read_text())["policies"]["cells"][0]
    assert str(paths.table_file("policies", backbone)) in outs(BY_NAME[f"policies@{backbone}"])
    assert str(paths.metrics_file("policies", backbone)) in outs(BY_NAME[f"policies@{backbone}"])
    bench = BY_NAME["bench_exits"]["cmd"]
    assert option(bench, "out") == str(paths.bench_file("exits"))
    assert option(bench, "policies") == str(paths.metrics_file("policies", "${bench.cell}"))
    reports = [n for n in BY_NAME if n.startswith("report_")]
    assert len(reports) == 3
    for name in reports:
        report = name.removeprefix("report_")
        assert str(paths.report_html(report)) in outs(BY_NAME[name])
        assert str(paths.report_template(report)) in BY_NAME[name]["deps"]


def test_the_resume_fingerprint_covers_what_training_runs(tmp_path, monkeypatch):
    """A resume checkpoint is discarded when code that training runs changes, and kept
    when a report or a claim changes (loopscope.weights.checkpoint.run_fingerprint)."""
    import shutil

    import torch
    from conftest import tiny_cell

    from loopscope.weights import checkpoint
    covered = {str(p.relative_to(PKG)) for p in
               checkpoint.imported_modules("loopscope.weights.train")}
    assert {"weights/train.py", "weights/model.py", "weights/config.py", "weights/data.py",
            "weights/depth.py", "weights/checkpoint.py"} <= covered
    assert covered <= closure(ROOT / "stages" / "train.py")
    assert not training_leaks(covered)
    pkg = tmp_path / "loopscope"
    shutil.copytree(PKG, pkg)
    monkeypatch.setattr(checkpoint, "PACKAGE", pkg)
    cell, tokens = tiny_cell(), torch.arange(64)
    before = checkpoint.run_fingerprint(cell, tokens)
    claims = pkg / "judge" / "paper_a.py"
    claims.write_text(claims.read_text() + "\n# reworded\n")
    assert checkpoint.run_fingerprint(cell, tokens) == before
    model = pkg / "weights" / "model.py"
    model.write_text(model.read_text() + "\n# edited\n")
    assert checkpoint.run_fingerprint(cell, tokens) != before


def missing_keys(params: dict) -> list[str]:
    """The params keys dvc.yaml's stages list that a params file lacks (DVC refuses to
    run a stage whose params are missing, so every key must be written out)."""
    found = []
    for key in sorted({str(p) for _, stage in STAGES for p in stage.get("params", [])}):
        node = params
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                found.append(key)
                break
            node = node[part]
    return found


@pytest.mark.parametrize("path", ["params.yaml", "tests/micro_params.yaml",
                                  *sorted(f"presets/{p.name}" for p in
                                          (ROOT / "presets").glob("*.yaml"))])
def test_every_params_file_writes_out_every_key_a_stage_reads(path):
    assert not missing_keys(yaml.safe_load((ROOT / path).read_text())), path


def test_the_key_check_fails_on_a_params_file_without_one():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    del params["claims"]["margin_nats"]
    assert missing_keys(params) == ["claims.margin_nats"]


# ------------------------------------------------------------------------- sizes

MODULE_LINES, FUNCTION_LINES = 600, 60  # a module is one job; a function fits a screen


def oversized(path: Path) -> list[str]:
    """The module (over MODULE_LINES) and functions (over FUNCTION_LINES) of a file."""
    text = path.read_text()
    found = [f"{path.name}: {len(text.splitlines())} lines"] if (
        len(text.splitlines()) > MODULE_LINES) else []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > FUNCTION_LINES:
                found.append(f"{path.name}: {node.name} {n} lines")
    return found


@pytest.mark.parametrize("path", sorted([*PKG.rglob("*.py"), *(ROOT / "stages").glob("*.py")]),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_stay_small(path):
    assert not oversized(path)


def test_the_size_check_fails_on_a_long_function(tmp_path):
    long = tmp_path / "long.py"
    long.write_text("def f():\n" + "    x = 1\n" * FUNCTION_LINES)
    assert oversized(long) == ["long.py: f 61 lines"]


# ------------------------------------------------------------------ the committed run


@pytest.mark.committed
def test_every_stage_in_dvc_lock_is_a_stage_of_dvc_yaml():
    """dvc.lock records the committed run: a stage it lists that dvc.yaml no longer has
    (a stage merged into another) would give a reader two hashes for one file."""
    lock = yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]
    assert not stale_stages(lock)


def stale_stages(lock: dict) -> list[str]:
    """The stages of a dvc.lock that dvc.yaml does not build."""
    return sorted(set(lock) - set(BY_NAME))


def test_the_lock_check_fails_on_a_stage_dvc_yaml_lacks():
    assert stale_stages({"clamp@backbone": {}, "claims": {}}) == ["clamp@backbone"]


# ------------------------------------------------------------------------- names

# One concept, one name: the old synonyms, gone from the code, the reports and the docs
SYNONYMS = {r"\breference_depth\b": "r", r"\bshare_after_reference\b": "share_after_r",
            r"\bce_reference\b": "ce_r", r"masked reference": "masked forward",
            r"\bdiagnose\.loops\b": "diagnose.sweep_depth",
            r"\bR\b[:,]? \(?the training depth": "R, the evaluation depth"}


def old_names(text: str) -> list[str]:
    """The old synonyms a text still uses."""
    return [old for old in SYNONYMS if re.search(old, text)]


NAMED = sorted([*PKG.rglob("*.py"), *(ROOT / "stages").glob("*.py"),
                *(ROOT / "reports").glob("*.ipynb"), *(ROOT / "docs").rglob("*.md"),
                *(ROOT / "docs").rglob("*.json"), ROOT / "params.yaml", ROOT / "README.md"])


@pytest.mark.parametrize("path", NAMED, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_old_synonym_is_left(path):
    found = old_names(path.read_text())
    assert not found, f"{path}: {', '.join(f'{o!r} (say {SYNONYMS[o]})' for o in found)}"


def test_the_name_check_fails_on_an_old_synonym():
    assert old_names('m["reference_depth"]; the masked reference') == [
        r"\breference_depth\b", r"masked reference"]


# ------------------------------------------------------------- metrics keys

# One naming rule for every key of a metrics file a stage writes: letters, digits and
# _ - . + only. No space, slash or parenthesis, which `dvc exp show --keep` patterns and
# shell arguments cannot name plainly; a dot stays inside stable ids (claims' "A.drift.ours")
# and depths ("1.5R"), where DVC's flattened column names keep the key whole.
METRIC_KEY = re.compile(r"[A-Za-z0-9_.+-]+")


def bad_keys(value: object, where: str = "") -> list[str]:
    """The keys of a metrics file's JSON that break METRIC_KEY, as slash paths."""
    if isinstance(value, dict):
        return [f"{where}/{k}" for k in value if not METRIC_KEY.fullmatch(str(k))] + [
            bad for k, v in value.items() for bad in bad_keys(v, f"{where}/{k}")]
    if isinstance(value, list):
        return [bad for v in value for bad in bad_keys(v, where)]
    return []


def stage_metrics() -> list[str]:
    """Every committed metrics file a stage of dvc.yaml declares (`metrics:`)."""
    found = set()
    for _, stage in STAGES:
        for out in stage.get("metrics", []):
            path = next(iter(out)) if isinstance(out, dict) else str(out)
            if (ROOT / path).is_file():
                found.add(path)
    return sorted(found)


@pytest.mark.parametrize("path", stage_metrics())
def test_every_metrics_key_a_stage_writes_is_addressable(path):
    assert not bad_keys(json.loads((ROOT / path).read_text())), path


def test_the_key_rule_sees_a_space_and_a_slash():
    found = bad_keys({"whitespace_minus": {"content word": 1, "ok_key": 2},
                      "list": [{"a/b": 0}], "A.drift.ours": 1})
    assert found == ["/whitespace_minus/content word", "/list/a/b"]


# ------------------------------------------------------------------- no circle


def import_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """Each source module (relative path) -> the loopscope modules it imports, anywhere
    in it (inside functions too), as relative paths."""
    graph = {}
    for path in pkg.rglob("*.py"):
        if path.name == "__init__.py":
            continue
        found = set()
        for module in imports(ast.parse(path.read_text())):
            rel = module.removeprefix("loopscope.").replace(".", "/")
            target = pkg / f"{rel}.py"
            if target.is_file():
                found.add(str(target.relative_to(pkg)))
        graph[str(path.relative_to(pkg))] = found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of a graph (each as the modules round it), by depth-first search."""
    found, state = [], {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_no_module_imports_back_one_that_imports_it():
    """No import circle, inside a package either (plan and plan_outside once imported
    each other; the FLOP model is tools/flops.py now)."""
    assert circles(import_graph()) == []


def test_the_circle_check_sees_a_circle():
    graph = {"tools/plan.py": {"tools/plan_outside.py"},
             "tools/plan_outside.py": {"tools/plan.py"}, "base/paths.py": set()}
    assert circles(graph) == [["tools/plan.py", "tools/plan_outside.py", "tools/plan.py"]]
