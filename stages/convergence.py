"""Stage convergence@<cell>: paper B's per-token convergence of every cell.

Runs each trained run of the cell to uniform depth convergence.depth_factor x R (R:
the training depth) on the `report` windows, reading out every loop, and writes
metrics/convergence/<cell>.json (elasticity, KL and state change per loop, the
convergence loop overall and by token type, saturation, and A1's exits capped at the
maximum depth: the cross-analysis with paper A) and tables/convergence/<cell>.parquet
(one row per token: its type and convergence loop, its CE at depth 1 and R).
Intervals resample documents, pooled over the cell's seeds.
"""

import sys

import numpy as np
import pandas as pd

from loopscope import paths
from loopscope.convergence import (
    TOKEN_TYPES,
    Trajectory,
    convergence_loop,
    cross_analysis,
    summarize,
    trajectory,
    vocab_types,
)
from loopscope.data import load_tokenizer
from loopscope.errors import atomic_output, run, write_json
from loopscope.params import load_params
from loopscope.policies import KL, evaluate, pool
from loopscope.runs import trained_runs


def main() -> None:
    name = sys.argv[1]
    params = load_params()
    cfg, batch = params.convergence, params.convergence.batch_size
    types_of = vocab_types(load_tokenizer(paths.PREPARED))
    trajs, exits, docs, rows = [], [], [], []
    for r in trained_runs(name):
        report = r.window_sets(cfg.windows, "convergence.windows")["report"]
        reference = r.cell.model.loops
        depth = cfg.depth_factor * reference
        traj = trajectory(r.model, report.x, report.y, report.h0, depth, batch)
        exits.append(evaluate(r.model, report.x, report.y, report.h0,
                              KL(params.policies.cross_epsilon), depth, batch))
        trajs.append(traj)
        docs.append(report.token_docs())
        tokens = report.x.flatten().cpu().numpy()
        rows.append(pd.DataFrame({
            "seed": r.cell.train.seed, "doc": docs[-1],
            "token_id": tokens.astype(np.int32),
            "type": np.array(TOKEN_TYPES)[types_of[tokens]],
            "convergence_loop": convergence_loop(traj.kl, cfg.epsilon),
            "exit_loop": exits[-1].exit_loop.astype(np.int16),
            "ce_depth1": traj.ce[0], "ce_reference": traj.ce[reference - 1]}))
        print(f"convergence {name} {r.tag}: CE {traj.ce[0].mean():.3f} at depth 1, "
              f"{traj.ce[reference - 1].mean():.3f} at R = {reference}, "
              f"{traj.ce[-1].mean():.3f} at {depth}", flush=True)
    traj = Trajectory.concat(trajs)
    token_docs = np.concatenate(docs)
    table = pd.concat(rows, ignore_index=True)
    metrics = summarize(traj, token_docs, types_of[table["token_id"].to_numpy()], reference,
                        cfg.epsilon, cfg.tolerance, cfg.bootstrap)
    metrics["cross"] = cross_analysis(traj, pool(exits), token_docs, cfg.bootstrap)
    metrics["cross"]["epsilon"] = params.policies.cross_epsilon
    metrics["seeds"] = len(trajs)
    with atomic_output(paths.table_file("convergence", name)) as tmp:
        table.to_parquet(tmp, index=False)
    write_json(paths.metrics_file("convergence", name), metrics)
    c = metrics["convergence"]
    print(f"convergence {name}: median token converges at loop {c['median_loop']:g}, "
          f"{c['share_after_reference']['value']:.1%} still changing after R; useful depth "
          f"{metrics['saturation']['useful_depth']}; A1 exits at "
          f"{metrics['cross']['mean_exit_loop']:.2f} loops on average")


if __name__ == "__main__":
    run(main)
