"""Stage outside_<job>@<name>: a measuring stage's own script run on an outside model (a
released checkpoint, params.yaml's `outside:`).

    python stages/outside.py stages/<job>.py <name> [ARGS]

The measuring scripts find a model's runs through loopscope.measure.runs, which knows
the trained cells only; importing loopscope.released.runs registers the outside models'
source of runs there. So the released-models package is a dependency of the outside
stages alone, and an edit to a layout reruns no trained cell's measuring.
"""

import runpy
import sys

import loopscope.released.runs  # noqa: F401  registers the outside models' runs


def main(argv: list[str]) -> None:
    if not argv or not argv[0].endswith(".py"):
        raise SystemExit("usage: python stages/outside.py stages/<job>.py <name> [ARGS]")
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
