"""README.md as a front page: short, every path it names exists, and the cheap commands
it shows run on the committed state."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CHEAP = ("python -m loopscope.tools.plan", "dvc status", "dvc metrics show", "dvc plots show")


def commands() -> list[str]:
    """README's code-block lines that start with one of the cheap commands (comments off)."""
    blocks = re.findall(r"```\n(.*?)```", README, re.S)
    lines = [line.split("#")[0].strip() for b in blocks for line in b.splitlines()]
    return [line for line in lines if line.startswith(CHEAP)]


def test_readme_is_a_front_page():
    assert len(README.splitlines()) <= 200
    for heading in ("## Verdicts at a glance", "## Open the committed reports now",
                    "## Two commands", "## Recipes", "## Documentation"):
        assert heading in README
    # the glossary comes before the terms are used in the verdicts
    assert README.index("## Words used below") < README.index("## Verdicts at a glance")


def test_the_front_door_gives_the_commands_and_the_counts_before_the_glossary():
    glossary = README.index("## Words used below")
    assert README.index("<!-- begin counts") < glossary
    assert README.index("## Two commands") < glossary
    assert README.index("make repro") < glossary and README.index("make test") < glossary


def flat(text: str) -> str:
    """Text with its line breaks and runs of spaces as single spaces (titles wrap)."""
    return re.sub(r"\s+", " ", text.replace('\\n",\n    "', " "))


@pytest.mark.parametrize("page", ["README.md", "reports/index.ipynb",
                                  "reports/blind_spot.ipynb", "reports/convergence.ipynb"])
def test_the_papers_are_named_by_title(page):
    """A reader can look a paper up: the front page and every report give its title (the
    one tables/claims.json records)."""
    from loopscope.judge.claims import PAPERS
    text = flat((ROOT / page).read_text())
    own = {"reports/blind_spot.ipynb": ["paper_a"], "reports/convergence.ipynb": ["paper_b"]}
    for paper in own.get(page, ["paper_a", "paper_b"]):
        assert PAPERS[paper]["title"] in text, f"{page} does not name {paper}"


def test_every_path_readme_names_exists():
    links = [m.split("#")[0] for m in re.findall(r"\]\(([^)\s]+)\)", README)
             if not m.startswith(("http://", "https://"))]
    named = re.findall(r"(?<![\w/~.])((?:docs|reports|presets|metrics|tables)/[\w./-]*\w)",
                       README)
    assert links and named
    missing = sorted({p for p in links + named if not (ROOT / p).exists()})
    assert missing == []


def marked(command: str) -> pytest.param:
    """A command as a test parameter; one that runs dvc is marked slow, as every test
    that runs dvc is (`make test` leaves them out)."""
    return pytest.param(command, marks=[pytest.mark.slow] if command.startswith("dvc ") else [])


@pytest.mark.committed
@pytest.mark.xdist_group("dvc_in_the_repository")  # one worker: dvc locks the repository
@pytest.mark.parametrize("command", [marked(c) for c in commands()])
def test_readme_cheap_commands_run_on_the_committed_state(command, tmp_path):
    argv = shlex.split(command)
    if argv[0] == "python":
        argv[0] = sys.executable
    else:
        argv = [sys.executable, "-m", *argv]
        if argv[3:4] == ["plots"]:
            argv += ["-o", str(tmp_path / "dvc_plots")]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{command}:\n{out.stdout}\n{out.stderr}"
    if argv[-2:] == ["plots", "show"] or "plots" in argv:
        assert (tmp_path / "dvc_plots" / "index.html").is_file()


def test_the_cheap_commands_are_all_in_readme():
    assert {c for c in CHEAP if any(cmd.startswith(c) for cmd in commands())} == set(CHEAP)
