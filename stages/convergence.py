"""Stage convergence@<cell>: paper B's per-token convergence of every cell.

Runs each trained run of the cell to uniform depth convergence.depth_factor x R (R:
the evaluation depth, model.loops) on the `report` windows, reading out every loop, and writes
metrics/convergence/<cell>.json (elasticity, KL and state change per loop, the
convergence loop and A1's exit loop overall and by token type, saturation, each with
its interval, and A1's exits capped at the maximum depth: the cross-analysis with
paper A, whose best uniform depth is picked on the `choose` windows) and
tables/convergence/<cell>.parquet (one row per token: its type, convergence loop, first
loop below epsilon, cross-analysis exit loop, its CE at depth 1 and R, the settle-depth
oracle's settle loops, plain and at policies.oracle_margin, and depth R's prediction:
the policies stage reads them). For the cells of convergence.kv_reuse (and every outside
model), the cost of final-loop key/value reuse at R and 2R
(loopscope.measure.trajectory.reuse). Intervals resample documents, pooled over the
cell's seeds.

A position's token type (the `type` column and the statistics by type) is that of its
target, the token it predicts, typed by the whole word it is part of in the text of
the window (loopscope.measure.trajectory.token_types.window_types; "special" for the
end-of-text token, which the statistics leave out). The convergence loop of a position is that of
its prediction, the next-token distribution whose KL between loops paper B reads and exits
on, so its "whitespace shallowest, content words deepest" is about the tokens being
predicted: typing the input would charge "the" with the depth it takes to predict the
word after it. The token_id column is the input token.

For an outside model (stage outside_convergence@<name>, through stages/outside.py):
the same for its run, its token types read through its own tokenizer
(prepared_outside/<name>/tokenizer.json) over the same validation text.
"""

import sys

from loopscope.base import paths
from loopscope.measure.params import load
from loopscope.measure.runs import batch_for, map_runs, source_of, with_batch
from loopscope.measure.save import write_outputs
from loopscope.measure.trajectory.convergence import (
    RunConvergence,
    cell_metrics,
    cell_table,
    headline,
    measure_run,
)
from loopscope.weights.data import load_tokenizer

READS = ("convergence.depth_factor", "convergence.epsilon", "convergence.windows",
         "convergence.useful_share", "convergence.sensitivity_nats",
         "convergence.sensitivity_shares", "convergence.sensitivity_epsilons",
         "convergence.bootstrap", "convergence.batch_size", "convergence.kv_reuse",
         "policies.cross_epsilon", "policies.oracle_margin")


def main(name: str) -> None:
    params = load(READS)
    cfg, cross_epsilon = params.convergence, params.policies.cross_epsilon
    cfg = with_batch(cfg, batch_for(name, cfg.batch_size))
    outside_model = source_of(name) == "outside"
    tok = load_tokenizer(paths.outside_prepared(name) if outside_model else paths.PREPARED)
    kv_reuse = outside_model or name in cfg.kv_reuse
    runs: list[RunConvergence] = map_runs(name, measure_run, tok, cfg, cross_epsilon, kv_reuse)
    for run in runs:
        print(f"convergence {name} seed{run.seed}: {run.describe()}", flush=True)
    metrics = cell_metrics(runs, cfg, cross_epsilon, name)
    table = cell_table(runs, cfg.epsilon, params.policies.oracle_margin)
    write_outputs("convergence", name, metrics, {"convergence": table})
    print(f"convergence {name}: {headline(metrics)}")


if __name__ == "__main__":
    main(sys.argv[1])
