"""Stage convergence@<cell>: paper B's per-token convergence of every cell.

Runs each trained run of the cell to uniform depth convergence.depth_factor x R (R:
the training depth) on the `report` windows, reading out every loop, and writes
metrics/convergence/<cell>.json (elasticity, KL and state change per loop, the
convergence loop and A1's exit loop overall and by token type, saturation, each with
its interval, and A1's exits capped at the maximum depth: the cross-analysis with
paper A, whose best uniform depth is picked on the `choose` windows) and
tables/convergence/<cell>.parquet (one row per token: its type, convergence loop, first
loop below epsilon, cross-analysis exit loop, its CE at depth 1 and R). Intervals
resample documents, pooled over the cell's seeds.

A position's token type (the `type` column and the statistics by type) is that of its
target, the token it predicts, typed by the whole word it is part of in the text of
the window (loopscope.token_types.window_types; "special" for the end-of-text token,
which the statistics leave out). The convergence loop of a position is that of its
prediction, the next-token distribution whose KL between loops paper B reads and exits
on, so its "whitespace shallowest, content words deepest" is about the tokens being
predicted: typing the input would charge "the" with the depth it takes to predict the
word after it. The token_id column is the input token.
"""

import sys

import numpy as np
import pandas as pd

from loopscope import paths
from loopscope.convergence import (
    Trajectory,
    convergence_loop,
    cross_analysis,
    first_below,
    summarize,
    training_mean,
    trajectory,
    uniform_ce,
)
from loopscope.data import load_tokenizer
from loopscope.outputs import atomic_output, write_json
from loopscope.params import load_params
from loopscope.policies import KL, evaluate, pool
from loopscope.runs import trained_runs
from loopscope.stage import run
from loopscope.token_types import type_names, window_types


def main() -> None:
    name = sys.argv[1]
    params = load_params()
    cfg, batch = params.convergence, params.convergence.batch_size
    tok = load_tokenizer(paths.PREPARED)
    types: list[np.ndarray] = []  # per run, the type of each position's target
    trajs, exits, docs, rows, choose_ce = [], [], [], [], []
    for r in trained_runs(name):
        sets = r.window_sets(cfg.windows, "convergence.windows")
        report, choose = sets["report"], sets["choose"]
        reference = r.cell.model.loops
        depth = cfg.depth_factor * reference
        traj = trajectory(r.model, report.x, report.y, report.h0, depth, batch)
        choose_ce.append(uniform_ce(r.model, choose.x, choose.y, choose.h0, depth, batch))
        exits.append(evaluate(r.model, report.x, report.y, report.h0,
                              KL(params.policies.cross_epsilon), depth, batch))
        trajs.append(traj)
        docs.append(report.token_docs())
        tokens = report.x.flatten().cpu().numpy()
        # The whole T + 1 window, so the first target's word is seen from its start.
        window = np.concatenate([report.x[:, :1].cpu().numpy(), report.y.cpu().numpy()], 1)
        types.append(window_types(tok, window)[:, 1:].reshape(-1))
        rows.append(pd.DataFrame({
            "seed": r.cell.train.seed, "doc": docs[-1],
            "token_id": tokens.astype(np.int32),
            "type": type_names(types[-1]),
            "convergence_loop": convergence_loop(traj.kl, cfg.epsilon),
            "first_below_loop": first_below(traj.kl, cfg.epsilon),
            "exit_loop": exits[-1].exit_loop.astype(np.int16),
            "ce_depth1": traj.ce[0], "ce_reference": traj.ce[reference - 1]}))
        print(f"convergence {name} {r.tag}: CE {traj.ce[0].mean():.3f} at depth 1, "
              f"{traj.ce[reference - 1].mean():.3f} at R = {reference}, "
              f"{traj.ce[-1].mean():.3f} at {depth}", flush=True)
    traj = Trajectory.concat(trajs)
    token_docs = np.concatenate(docs)
    table = pd.concat(rows, ignore_index=True)
    metrics = summarize(traj, token_docs, np.concatenate(types), reference,
                        cfg.epsilon, cfg.tolerance, cfg.bootstrap,
                        training_mean(r.cell.train, reference))
    metrics["cross"] = cross_analysis(traj, pool(exits), token_docs,
                                      np.concatenate(choose_ce, axis=1).mean(axis=1),
                                      cfg.bootstrap)
    metrics["cross"]["epsilon"] = params.policies.cross_epsilon
    metrics["seeds"] = len(trajs)
    metrics["unit"] = report.unit
    with atomic_output(paths.table_file("convergence", name)) as tmp:
        table.to_parquet(tmp, index=False)
    write_json(paths.metrics_file("convergence", name), metrics)
    c = metrics["convergence"]
    print(f"convergence {name}: median token converges at loop "
          f"{c['median_loop']['value']:g}, "
          f"{c['share_after_reference']['value']:.1%} still changing after R; useful depth "
          f"{metrics['saturation']['useful_depth']}; A1 exits at "
          f"{metrics['cross']['mean_exit_loop']:.2f} loops on average")


if __name__ == "__main__":
    run(main, stage=f"convergence@{sys.argv[1]}")
