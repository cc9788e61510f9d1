"""Which outputs a rerun changed: every output's digest in dvc.lock against the same
output in another revision's dvc.lock. The proof a refactor owes ("a rerun reproduces
every output byte for byte"), by DVC's own digests.

    python -m loopscope.tools.lockdiff REV [--lock dvc.lock]

Prints how many outputs are the same, then each one that differs, is new, or is gone.
Timings differ by nature (metrics/stage_timings, train_timings, throughput, bench):
they are listed apart.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

TIMINGS = ("metrics/stage_timings/", "metrics/train_timings/", "metrics/throughput",
           "metrics/bench/")


def outputs(lock_text: str) -> dict[str, str | None]:
    """Each output's path -> its md5 in a dvc.lock's text."""
    lock = yaml.safe_load(lock_text) or {}
    return {out["path"]: out.get("md5") for body in (lock.get("stages") or {}).values()
            for out in body.get("outs", [])}


def compare(old: dict[str, str | None], new: dict[str, str | None]) -> dict[str, list[str]]:
    """The outputs by fate: same, differ (timings apart), new, gone."""
    found: dict[str, list[str]] = {k: [] for k in ("same", "differ", "timings", "new",
                                                   "gone")}
    for path in sorted(set(old) | set(new)):
        if path not in new:
            found["gone"].append(path)
        elif path not in old:
            found["new"].append(path)
        elif old[path] == new[path]:
            found["same"].append(path)
        else:
            found["timings" if path.startswith(TIMINGS) else "differ"].append(path)
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", help="the revision whose dvc.lock to compare against")
    parser.add_argument("--lock", default="dvc.lock", help="this run's lock file")
    args = parser.parse_args(argv)
    shown = subprocess.run(["git", "show", f"{args.rev}:dvc.lock"], capture_output=True,
                           text=True)
    if shown.returncode != 0:
        sys.exit(f"error: no dvc.lock at revision {args.rev!r}: {shown.stderr.strip()}")
    found = compare(outputs(shown.stdout), outputs(Path(args.lock).read_text()))
    print(f"{len(found['same'])} outputs byte for byte the same as at {args.rev}; "
          f"{len(found['differ'])} differ, {len(found['timings'])} timings differ, "
          f"{len(found['new'])} new, {len(found['gone'])} gone")
    for fate in ("differ", "new", "gone", "timings"):
        for path in found[fate]:
            print(f"  {fate}: {path}")


if __name__ == "__main__":
    main()
