"""Docs that cannot drift: every dotted module name (loopscope, its package, its module,
down to a function or a class's member), every repository file path and every relative
link in docs/, README.md and the docstrings of src/, stages/ and tests/ names something
that exists; and docs/architecture.md's statements about the pipeline (the DAG's
folders, what an edit reruns, the params each stage reads, the files a new rule or
claim needs) are the code's."""

import ast
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "loopscope"
DOTTED = re.compile(r"\bloopscope(?:\.[A-Za-z_]\w*)+")
# A path in the repository, from one of its top folders; a glob, a placeholder (<cell>,
# {seed}, NAME) or an output the run writes where git ignores it is not a file to find.
PATH = re.compile(r"(?<![\w/.~-])((?:src|stages|tests|docs|reports|presets|experiments|tables"
                  r"|metrics|\.dvc|\.ci)/[\w./-]*\w)(?![\w*<{])")
PACKAGE_PATH = re.compile(r"(?<![\w/.-])((?:base|weights|preflight|measure|judge|render|tools)"
                          r"/\w+\.(?:py|yaml))\b")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
# Stale references in files whose edit would rerun measuring or training stages (or that
# another change owns): each is listed until its file is fixed, and the list must shrink
# with it (test_the_pending_references_are_still_there).
PENDING: set[tuple[str, str]] = set()


@cache
def members(path: Path) -> dict[str, set[str] | None]:
    """A module's top-level names; for a class, the names defined in its body."""
    found: dict[str, set[str] | None] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = None
        elif isinstance(node, ast.ClassDef):
            inner = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    inner.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    inner.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    inner |= {t.id for t in item.targets if isinstance(t, ast.Name)}
            found[node.name] = inner
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found.update({n.id: None for t in targets for n in ast.walk(t)
                          if isinstance(n, ast.Name)})
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update({(a.asname or a.name).split(".")[0]: None for a in node.names})
    return found


def resolves(dotted: str, pkg: Path = PKG) -> bool:
    """Whether a dotted name under loopscope names a package, a module, a module's
    top-level name or a member of a class defined there."""
    parts = dotted.split(".")[1:]
    here = pkg
    while parts and (here / parts[0]).is_dir():
        here = here / parts.pop(0)
    if parts and (here / f"{parts[0]}.py").is_file():
        here = here / f"{parts.pop(0)}.py"
    if not parts:
        return True
    if here.is_dir():
        return False
    names = members(here)
    if parts[0] not in names:
        return False
    inner = names[parts[0]]
    return len(parts) == 1 or inner is None or parts[1] in inner


def docstrings(path: Path) -> str:
    tree = ast.parse(path.read_text())
    return "\n".join(ast.get_docstring(n, clean=False) or "" for n in ast.walk(tree)
                     if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef)))


def ignored(rel: str) -> bool:
    """Whether git ignores a path (as a file or a folder): a run's output, such as the
    screenshots `make screenshots` writes."""
    return any(subprocess.run(["git", "check-ignore", "-q", p], cwd=ROOT).returncode == 0
               for p in (rel, rel + "/"))


def stale(text: str, where: Path, root: Path = ROOT, pkg: Path = PKG) -> list[str]:
    """What a text names that does not exist (links relative to `where`'s folder)."""
    found = [m for m in DOTTED.findall(text) if not resolves(m, pkg)]
    found += [m for m in PATH.findall(text)
              if not (root / m).exists() and not re.search(r"/[A-Z_]+(\.\w+)?$", m)
              and not ignored(m)]
    found += [m for m in PACKAGE_PATH.findall(text) if not (pkg / m).exists()]
    if where.suffix == ".md":
        found += [m for m in LINK.findall(text)
                  if not m.startswith(("http://", "https://", "mailto:"))
                  and not (where.parent / m).exists()]
    return found


DOCS = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])
CODE = sorted([*PKG.rglob("*.py"), *(ROOT / "stages").glob("*.py"),
               *(ROOT / "tests").glob("*.py")])


def found_stale() -> set[tuple[str, str]]:
    out = set()
    for path in DOCS + CODE:
        text = path.read_text() if path.suffix == ".md" else docstrings(path)
        out |= {(str(path.relative_to(ROOT)), m) for m in stale(text, path)}
    return out


def test_every_name_path_and_link_in_the_docs_and_docstrings_exists():
    assert found_stale() - PENDING == set()


def test_the_pending_references_are_still_there():
    """A fixed reference leaves PENDING: the list names only what is still stale."""
    assert PENDING <= found_stale()


def test_the_check_catches_what_is_gone(tmp_path):
    text = ("Load with `loopscope.measure.diagnostics.load_extract(path)` or "
            "loopscope.measure.per_loop.extract.gone, see tests/test_claims.py and "
            "[methods](nowhere.md); loopscope.measure.per_loop.extract.load_extract, "
            "loopscope.judge.verdicts.Claim.record and tests/test_docs.py exist; "
            "experiments/NAME.json and metrics/bench/train*.json are patterns.")
    assert stale(text, ROOT / "docs" / "x.md") == [
        "loopscope.measure.diagnostics.load_extract", "loopscope.measure.per_loop.extract.gone",
        "tests/test_claims.py", "nowhere.md"]
    assert stale("loopscope.judge.verdicts.Claim.nothing", ROOT / "x.py") == [
        "loopscope.judge.verdicts.Claim.nothing"]


# ---------------------------------------------------- docs/architecture.md against the code

ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()
STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
FLOORS = ("base", "stats", "looped", "weights", "preflight", "measure", "released", "judge",
          "render", "tools")


def dag_labels(text: str) -> dict[str, set[str]]:
    """The mermaid DAG's nodes: stage name -> the package folders its label names."""
    nodes = re.findall(r'\w+\["(\w+)(?:@\w+)?<br/>([^"]*)"\]', text)
    return {name: set(re.findall(r"(\w+)/", packages)) for name, packages in nodes}


def script_packages(stage: str) -> set[str]:
    """The packages of the loopscope modules a stage's script imports itself."""
    cmd = STAGES[stage].get("do", STAGES[stage])["cmd"]
    found = set()
    trees = [ast.parse((ROOT / s).read_text()) for s in re.findall(r"stages/\w+\.py", cmd)]
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("loopscope."):
            part = node.module.split(".")[1]
            found.add(part)
    return found & set(FLOORS)


def mislabelled(labels: dict[str, set[str]]) -> list[str]:
    """The DAG's nodes whose label names no package, or one its script does not import."""
    return [stage for stage, named in labels.items()
            if not named or not named <= script_packages(stage)]


def test_the_dag_labels_each_stage_with_packages_its_script_runs():
    """Each node of the DAG names the package its script's library lives in: one the
    script imports (an edit there reruns the stage)."""
    labels = dag_labels(ARCHITECTURE)
    assert set(labels) == {name for name in STAGES}
    assert mislabelled(labels) == []


def test_the_dag_label_check_fails_on_a_wrong_folder():
    wrong = ARCHITECTURE.replace('claims["claims<br/>judge/"]', 'claims["claims<br/>render/"]')
    assert wrong != ARCHITECTURE
    assert mislabelled(dag_labels(wrong)) == ["claims"]


def package_table() -> dict[str, set[str]]:
    """'Folders are rerun reasons': each package's row, the stages its last column names
    (in backticks, `train@` as train; "the reports" as the three report stages)."""
    rows = re.findall(r"^\| `(\w+)/` \|.*\| ([^|]*) \|$", ARCHITECTURE, re.M)
    out = {}
    for package, reruns in rows:
        named = {s.rstrip("@*") for s in re.findall(r"`([\w@*]+)`", reruns)}
        if "the reports" in reruns:
            named |= {"report_blind_spot", "report_convergence", "report_index"}
        out[package] = named & set(STAGES)
    return out


def rerun_by(package: str) -> set[str]:
    """The stages whose deps list a module of the package (foreach stages by name)."""
    prefix = f"src/loopscope/{package}/"
    return {name for name, stage in STAGES.items()
            if any(str(d).startswith(prefix) for d in stage.get("do", stage).get("deps", []))}


@pytest.mark.parametrize("package", ["judge", "render"])
def test_the_package_table_names_every_stage_an_edit_reruns(package):
    """For judge/ and render/, whose rows list stages by name: an edit to one of the
    package's modules reruns exactly the stages the row names (through the params
    modules, configure too)."""
    assert package_table()[package] == rerun_by(package)


def test_adding_a_rule_or_a_claim_names_every_file_to_touch():
    """The recipes name the files the code needs touched: an exit rule's threshold in
    tests/test_runtime.py (THRESHOLDS), a claim's parameters in criteria.yaml."""
    rule = ARCHITECTURE[ARCHITECTURE.index("## Add a depth policy"):
                        ARCHITECTURE.index("## Add a claim")]
    assert "tests/test_runtime.py" in rule and "THRESHOLDS" in rule
    assert "THRESHOLDS" in (ROOT / "tests" / "test_runtime.py").read_text()
    claim = ARCHITECTURE[ARCHITECTURE.index("## Add a claim"):]
    assert "judge/criteria.yaml" in claim
    assert (PKG / "judge" / "criteria.yaml").is_file()


def documented_params(text: str) -> dict[str, set[str]]:
    """The stage table's `reads params` column, by stage: each backticked key, `.name`
    short for the section of the key before it, `section.*` a wildcard; a row of
    several stages gives each its part of the column (split at ";"), or the whole
    column. configure (the whole file) is left out."""
    table = text[text.index("| stage | runs | reads params |"):]
    table = table[:table.index("\n\n")]
    out: dict[str, set[str]] = {}
    for line in table.splitlines()[2:]:
        first, _, keys = (c.strip() for c in line.strip("|").split(" | "))
        stages = [s.split("@")[0] for s in re.findall(r"`([\w@<>]+)`", first)]
        if first.startswith("reports"):
            stages = [s for s in STAGES if s.startswith("report_")]
        parts = keys.split(";")
        parts = parts if len(parts) == len(stages) else [keys] * len(stages)
        for stage, part in zip(stages, parts, strict=True):
            found, section = set(), ""
            for key in re.findall(r"`([\w.*]+)`", part):
                if key.startswith("."):
                    key = section + key
                section = key.split(".")[0] if "." in key else section
                found.add(key)
            if stage != "configure":
                out[stage] = found
    return out


def params_mismatch(documented: dict[str, set[str]]) -> dict[str, tuple[set, set]]:
    """Per stage: dvc.yaml's params the table misses, and keys it names dvc.yaml lacks."""
    out = {}
    for stage, keys in documented.items():
        listed = set(STAGES[stage].get("do", STAGES[stage]).get("params", []))
        wild = [k[:-1] for k in keys if k.endswith(".*")]
        missed = {k for k in listed if k not in keys and not k.startswith(tuple(wild))}
        extra = {k for k in keys - listed
                 if not (k.endswith(".*") and any(x.startswith(k[:-1]) for x in listed))}
        if missed or extra:
            out[stage] = (missed, extra)
    return out


def test_the_stage_table_names_the_params_each_stage_reads():
    documented = documented_params(ARCHITECTURE)
    assert set(documented) == set(STAGES) - {"configure"}
    assert params_mismatch(documented) == {}


def test_the_stage_table_check_fails_on_a_key_it_misses():
    wrong = ARCHITECTURE.replace("| `summary` | when the claims, metrics and tables it reads "
                                 "change | `cells` |", "| `summary` | x | `policies.cells` |")
    assert wrong != ARCHITECTURE
    assert params_mismatch(documented_params(wrong)) == {
        "summary": ({"cells"}, {"policies.cells"})}


def test_the_development_page_lists_every_test_file():
    """docs/development.md's table of test files names each one, and no other."""
    text = (ROOT / "docs" / "development.md").read_text()
    named = set(re.findall(r"`(test_\w+\.py)`", text))
    assert named == {p.name for p in (ROOT / "tests").glob("test_*.py")}
