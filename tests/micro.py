"""The micro repository of the end-to-end tests: a copy of the project with micro params
and a small corpus, and the commands run in it.

A helper module, not a test module: test_pipeline, test_remote and test_reliability use
it, and conftest builds the one shared from-scratch run from it (`reproduced`). Importing
a test module for its helpers instead would tie those files to its collection.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The shared run trains every cell twice, so the seed-aware code paths (pooled metrics,
# one model and log per seed) are exercised end to end.
SEEDS = [42, 43]


def sh_env() -> dict[str, str]:
    """The environment of pipeline commands: this venv's python and dvc first."""
    return {**os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def sh(cmd: list[str], cwd: Path, check: bool = True, timeout: float | None = None,
       tries: int = 1, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run cmd in cwd. timeout and tries are for read-only queries: `dvc plots diff` of
    two experiments once deadlocked (two threads in a futex wait, 8 minutes, under a
    loaded CPU) and ran in 4 s when rerun, so such a query is retried, not waited on."""
    for attempt in range(tries):
        try:
            result = subprocess.run(cmd, cwd=cwd, env={**sh_env(), **(env or {})},
                                    capture_output=True, text=True, timeout=timeout)
            break
        except subprocess.TimeoutExpired:
            if attempt == tries - 1:
                raise
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def copy_repo(dest: Path) -> Path:
    """The project's files (as git sees them) with micro params and a small corpus, in a
    fresh git repository: nothing run yet."""
    files = sh(["git", "ls-files", "--cached", "--others", "--exclude-standard"], ROOT).stdout
    for rel in files.split():
        # not the corpus, tests, or the committed results of the default run
        if rel.startswith(("data/", "tests/", "metrics/", "dvclive/", "reports/html/",
                           "tables/plots/")) \
                or rel in ("data.dvc", "dvc.lock"):
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    shutil.copy(ROOT / "tests" / "micro_params.yaml", dest / "params.yaml")
    data = dest / "data"
    data.mkdir()
    line = "To be, or not to be, that is the question: whether 'tis nobler in the mind\n"
    for i in range(3):
        (data / f"doc{i}.txt").write_text("".join(f"{i} {j} {line}" for j in range(300)))
    sh(["git", "init", "-q"], dest)
    sh(["dvc", "add", "-q", "data"], dest)
    sh(["git", "add", "-A"], dest)
    sh(["git", "commit", "-qm", "micro"], dest)
    return dest


def params_read(repo: Path) -> Path:
    """Where the from-scratch run records the params keys each stage read: a file per
    stage (loopscope.weights.params.RECORD_ENV), beside the repository."""
    return repo.parent / "params_read"


def reproduce(dest: Path) -> Path:
    """copy_repo with SEEDS, committed, then `dvc repro` from scratch: every stage run,
    each recording the params keys it read (params_read)."""
    repo = copy_repo(dest)
    params = repo / "params.yaml"
    params.write_text(params.read_text().replace("seeds: []\n", f"seeds: {SEEDS}\n"))
    sh(["git", "commit", "-qam", "two seeds"], repo)
    sh(["dvc", "repro"], repo, env={"LOOPSCOPE_PARAMS_READ": str(params_read(repo))})
    return repo


def _transient(folder: str, names: list[str]) -> set[str]:
    """What copy_state leaves out: DVC's .dvc/tmp (locks, the experiment queue's
    workspace), which a running dvc in the source may create or delete mid-copy and
    which no command needs carried over."""
    return {"tmp"} if Path(folder).name == ".dvc" and "tmp" in names else set()


def copy_state(src: Path, dest: Path) -> Path:
    """A copy of a micro repository as it stands (git with its history, the DVC cache,
    every output, at their mtimes), for a test to change without the source seeing it.
    DVC keeps its hashes keyed by the repository's path outside the repository, so the
    copy starts with none and hashes what it finds."""
    shutil.copytree(src, dest, symlinks=True, ignore=_transient)
    return dest
