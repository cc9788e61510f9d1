"""Stage bench_exits: the adaptive runtime's realized speedup on the main paper B
backbone, each policy at its matched threshold against the honest baseline (uniform
depth min(R, M), M the smallest uniform depth that matches depth R) and against depth R,
beside the FLOP speedup of the same exits (loopscope.bench_exits, by hand
python -m loopscope.bench exits; timings, so apart from the reproducible metrics)
-> metrics/bench/exits.json. It imports the exit benchmark alone, not loopscope.bench,
so the training benchmark is no dependency of this stage."""

import sys

from loopscope.bench_exits import main
from loopscope.stage import run

if __name__ == "__main__":
    run(lambda: main(sys.argv[1:]), stage="bench_exits")
