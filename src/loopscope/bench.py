"""Benchmarks, measured side by side in one process and written as JSON.

    python -m loopscope.bench exits [--cell backbone] [--repeats 5] [--out FILE]
    python -m loopscope.bench train [--cells a b] [--steps 10] [--repeats 5] [--out FILE]

Timings on a shared machine are noisy, so every number that matters here is a ratio of
medians measured in the same run, configurations interleaved (loopscope.rounds). Not a
test: nothing here asserts a speed.

exits (loopscope.bench_exits): does the adaptive runtime turn a policy's saved loops into
wall-clock time? The stage bench_exits runs it (-> metrics/bench/exits.json).
train (loopscope.bench_train): how fast is a training step, per precision, and how close
does it come to this machine's matrix-multiply speed? Run by hand
(-> metrics/bench/train.json).

This module only dispatches: each benchmark is its own module with its own options, so
the bench_exits stage imports the exit benchmark alone and an edit to the training
benchmark does not rerun it.
"""

from __future__ import annotations

import argparse
from types import ModuleType

from loopscope import bench_exits, bench_train
from loopscope.stage import run

# Each benchmark's module (its main reads its own options) and its line in --help.
COMMANDS: dict[str, tuple[ModuleType, str]] = {
    "exits": (bench_exits, "adaptive runtime: realized vs ideal speedup"),
    "train": (bench_train, "training step against the machine's matmul"),
}


def main(argv: list[str] | None = None) -> None:
    """Run the named benchmark's main on the arguments after its name (its own parser
    reads them, --help included)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="bench", required=True)
    for name, (_, text) in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    args, rest = parser.parse_known_args(argv)
    module, _ = COMMANDS[args.bench]
    module.main(rest, prog=f"{parser.prog} {args.bench}")


if __name__ == "__main__":
    run(main)
