"""Stage policies@<cell>: paper B's depth policies on every cell, capped at depth R.

For each trained run: A2's probe is fit on the `probe` windows (oracle labels from the
argmax path to depth R); uniform depths 1..R and every (rule, threshold) of
policies.grids run on the `choose` and `report` windows through the masked forward
(loopscope.measure.exit_rules.masked). Each rule's threshold is chosen on `choose`
(fewest mean loops whose CE is within half of policies.match_nats of uniform depth R) and reported
on `report`: metrics/policies/<cell>.json (per rule: threshold, mean loops, CE difference
with its interval, FLOP ratios to depth R and to the baseline min(R, M), M the smallest
matching uniform depth, and the same at the rule's default thresholds) and
tables/policies/<cell>.parquet (the frontier: every setting on both sets, its defaults
marked). Every matched rule is also read against the settle-depth oracle on `report`
(loopscope.measure.exit_rules.oracle: per token, the first loop from which the
prediction never changes up to convergence.depth_factor x R, and its margin version at
policies.oracle_margin nats), read from the cell's tables/convergence, which ran the
same windows to that depth: premature exits, lateness, depth over the oracle's.

For an outside model (stage outside_policies@<name>, through stages/outside.py): the
same for its run, at its depth R, under its outside.<name>.exit_mode (`exit_mode` in the
metrics: frozen, ours, for every cell; published, the model's own semantics, where its
layout has one).
"""

import sys

import pandas as pd

from loopscope.base import paths
from loopscope.base.errors import DataError
from loopscope.measure.exit_rules.policies import (
    attach_oracle,
    headline,
    summarize_sweeps,
    sweep_run,
)
from loopscope.measure.exit_rules.rules import check_grid
from loopscope.measure.params import load
from loopscope.measure.runs import batch_for, exit_mode, map_runs, source_of, with_batch
from loopscope.measure.save import write_outputs
from loopscope.weights.config import load_cell

READS = ("convergence.windows", "convergence.bootstrap", "convergence.depth_factor",
         "policies.match_nats",
         "policies.grids", "policies.first_seed_only", "policies.first", "policies.every",
         "policies.batch_size")


def main(name: str) -> None:
    params = load(READS)
    cfg = params.policies
    for rule, grid in cfg.grids.items():  # before any compute is spent
        check_grid(rule, grid)
    cfg = with_batch(cfg, batch_for(name, cfg.batch_size))
    cell = source_of(name) == "cell"
    first_seed = load_cell(paths.config_file(name)).seeds[0] if cell else None
    table = paths.table_file("convergence", name)  # the oracle's settle loops
    if not table.is_file():
        raise DataError(f"{table} is missing: the policies read the settle-depth oracle "
                        f"from it; run `dvc repro convergence@{name}` first")
    oracle = pd.read_parquet(table)
    mode = exit_mode(name)
    sweeps = map_runs(name, sweep_run, cfg, params.convergence.windows, f"policies {name}",
                      first_seed, mode == "frozen")
    attach_oracle(sweeps, oracle, params.convergence.depth_factor * sweeps[0].r)
    metrics, rows = summarize_sweeps(sweeps, cfg.match_nats, params.convergence.bootstrap,
                                     name)
    metrics["exit_mode"] = mode
    write_outputs("policies", name, metrics, {"policies": pd.DataFrame(rows)})
    print(f"policies {name}: {headline(metrics)}")


if __name__ == "__main__":
    main(sys.argv[1])
