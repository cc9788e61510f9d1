"""Stage throughput: inference tokens/s of every cell at every depth K = 1..K_train on
diagnose.timing_windows validation windows (spread over the split), all cells timed in
this one process, interleaved over diagnose.timing_repeats rounds (the median, and each
round's); and forward FLOPs per token beside it (the frontier's cost axis). Each cell is
timed in the precision it trained in (bf16 autocast or fp32: loopscope.weights.compute),
which its metrics name.

Writes metrics/throughput/<cell>.json. A timing (it varies from run to run), so it is
kept apart from the reproducible metrics; the first seed's model of each cell is timed
(every seed has the same architecture, so the same cost).
"""

import numpy as np

from loopscope.base import paths
from loopscope.base.files import write_json
from loopscope.measure.params import load
from loopscope.measure.per_loop.throughput import Timed, throughput
from loopscope.measure.runs import trained_runs

READS = ("cells", "diagnose.timing_windows", "diagnose.timing_repeats", "diagnose.batch_size")


def main() -> None:
    params = load(READS)
    jobs, flops, precision = {}, {}, {}
    for name in params.cells:
        r = next(trained_runs(name, params.diagnose.timing_windows, "diagnose.timing_windows"))
        jobs[name] = Timed(r.model, r.x, r.model.loops, r.h0, r.trained.autocast)
        precision[name] = r.trained.precision
        cost = r.model.cost()
        flops[name] = {f"k{k}": cost.uniform(k) for k in range(1, r.model.loops + 1)}
    print(f"throughput: timing {len(jobs)} cells, {params.diagnose.timing_repeats} "
          "interleaved rounds", flush=True)
    speeds = throughput(jobs, params.diagnose.batch_size, params.diagnose.timing_repeats)
    for name, rounds in speeds.items():
        speed = {k: float(np.median(v)) for k, v in rounds.items()}
        write_json(paths.metrics_file("throughput", name),
                   {"tokens_per_s": speed, "tokens_per_s_rounds": rounds,
                    "flops_per_token": flops[name], "precision": precision[name]})
        last = f"k{jobs[name].loops}"
        print(f"throughput {name}: {speed[last]:,.0f} tokens/s at K = {jobs[name].loops} "
              f"({precision[name]})")


if __name__ == "__main__":
    main()
