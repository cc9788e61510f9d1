"""Stage bench_exits: the adaptive runtime's realized speedup on the main paper B
backbone, each policy at its matched threshold against the honest baseline (uniform
depth min(R, M), M the smallest uniform depth that matches depth R) and against depth R,
beside the FLOP speedup of the same exits (loopscope.measure.bench.bench_exits; by hand,
python -m loopscope.tools.bench exits), each mode's timings checked (uniform depth R
within R/B of uniform depth B's time) and named in the last line where they fail; a
progress bar counts the rounds. Timings, so apart from the reproducible metrics:

    python stages/bench_exits.py --cell <cell> --policies metrics/policies/<cell>.json
        --out metrics/bench/exits.json

For an outside model (stage outside_bench_exits@<name>, through stages/outside.py): the
same for its run, which the runtime reaches through the looped-model interface alone,
into metrics/bench/exits_<name>.json.

The policies file is a dependency of the stage in dvc.yaml, so DVC has it in place
before this runs; it is read as plain JSON, keeping the reader of outputs (and its
messages for files that are missing) out of this measuring stage.
"""

import argparse
import json
import sys
from pathlib import Path

from loopscope.base.files import write_json
from loopscope.measure.bench.bench_exits import READS, exits, headline
from loopscope.measure.params import load


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="time the exit runtime")
    for name in ("cell", "policies", "out"):
        parser.add_argument(f"--{name}", required=True)
    args = parser.parse_args(argv)
    result = exits(load(READS), args.cell, json.loads(Path(args.policies).read_text()))
    write_json(args.out, result)
    print(f"{headline(result)} -> {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
