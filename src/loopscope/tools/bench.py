"""Benchmarks, measured side by side in one process and written as JSON.

    python -m loopscope.tools.bench exits [--cell backbone] [--repeats 5] [--out FILE]
    python -m loopscope.tools.bench train [--cells a b] [--steps 10] [--repeats 5] [--out FILE]

Timings on a shared machine are noisy, so every number that matters here is a ratio of
medians measured in the same run, configurations interleaved (loopscope.measure.bench.rounds).
Not a test: nothing here asserts a speed.

exits (loopscope.measure.bench.bench_exits): does the adaptive runtime turn a policy's saved
loops into wall-clock time? The stage bench_exits runs the same benchmark
(-> metrics/bench/exits.json).
train (loopscope.tools.bench_train): how fast is a training step, per precision, and how
close does it come to this machine's matrix-multiply speed? Run by hand
(-> metrics/bench/train.json).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from loopscope.base import paths
from loopscope.base.files import write_json
from loopscope.base.outputs import read_metrics
from loopscope.measure.bench import bench_exits
from loopscope.measure.params import load
from loopscope.stage import execute
from loopscope.tools import bench_train


def exits_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """`bench exits`'s options."""
    parser = argparse.ArgumentParser(prog=prog, description=bench_exits.__doc__.splitlines()[0])
    parser.add_argument("--cell", help="a trained cell of policies.cells (default: bench.cell)")
    parser.add_argument("--repeats", type=int, help="timed rounds, >= 3 (default: bench.repeats)")
    parser.add_argument("--out", default=str(paths.bench_file("exits")))
    return parser


def exits(argv: list[str], prog: str | None = None) -> None:
    """`bench exits`: the exit benchmark on --cell (default: bench.cell), written to
    --out, its headline printed."""
    args = exits_parser(prog).parse_args(argv)
    params = load((*bench_exits.READS, "bench.cell"))
    cell = args.cell or params.bench.cell
    result = bench_exits.exits(params, cell, read_metrics("policies", cell), args.repeats)
    write_json(args.out, result)
    print(f"{bench_exits.headline(result)} -> {args.out}")


# Each benchmark's entry (it reads its own options) and its line in --help.
COMMANDS: dict[str, tuple[Callable[[list[str], str], None], str]] = {
    "exits": (lambda argv, prog: exits(argv, prog),
              "adaptive runtime: realized vs ideal speedup"),
    "train": (lambda argv, prog: bench_train.main(argv, prog=prog),
              "training step against the machine's matmul"),
}


def main(argv: list[str] | None = None) -> None:
    """Run the named benchmark on the arguments after its name (its own parser reads
    them, --help included)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="bench", required=True)
    for name, (_, text) in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    args, rest = parser.parse_known_args(argv)
    entry, _ = COMMANDS[args.bench]
    entry(rest, f"{parser.prog} {args.bench}")


if __name__ == "__main__":
    execute(main)
