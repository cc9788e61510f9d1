"""Stage bench_exits: the adaptive runtime's realized speedup against its ideal, on the
main paper B backbone (python -m loopscope.bench exits; timings, so apart from the
reproducible metrics) -> metrics/bench/exits.json."""

import sys

from loopscope.bench import main
from loopscope.errors import run

if __name__ == "__main__":
    run(lambda: main(sys.argv[1:]))
