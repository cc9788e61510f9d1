"""Stage policies@<cell>: paper B's depth policies on every cell, capped at depth R.

For each trained run: A2's probe is fit on the `probe` windows (oracle labels from the
argmax path to depth R); uniform depths 1..R and every (rule, threshold) of
policies.grids run on the `choose` and `report` windows through the masked reference
(loopscope.policies). Each rule's threshold is chosen on `choose` (fewest mean loops
whose CE is within half of policies.match_nats of uniform depth R) and reported on
`report`: metrics/policies/<cell>.json (per rule: threshold, mean loops, CE difference
with its interval, FLOP ratios to depth R and to the baseline min(R, M), M the smallest
matching uniform depth, and the same at the rule's default thresholds) and
tables/policies/<cell>.parquet (the frontier: every setting on both sets, its defaults
marked).
"""

import sys
from collections import defaultdict

import numpy as np
import pandas as pd
from tqdm import tqdm

from loopscope import paths
from loopscope.convergence import fit_probe, trajectory, uniform_ce
from loopscope.outputs import atomic_output, write_json
from loopscope.params import load_params
from loopscope.policies import evaluate, make, never_exits, pool, settings, summarize
from loopscope.runs import trained_runs
from loopscope.stage import run
from loopscope.units import Units


def main() -> None:
    name = sys.argv[1]
    params = load_params()
    cfg, batch = params.policies, params.policies.batch_size
    grids = cfg.grids
    uniform: dict[str, list[np.ndarray]] = defaultdict(list)
    results: dict[tuple[str, float], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    docs = []
    for r in trained_runs(name):
        sets = r.window_sets(params.convergence.windows, "convergence.windows")
        reference = r.cell.model.loops
        probe_set = sets["probe"]
        probe = fit_probe(trajectory(r.model, probe_set.x, probe_set.y, probe_set.h0,
                                     reference, batch, keep_states=reference - 1),
                          reference)
        for s in ("choose", "report"):
            w = sets[s]
            uniform[s].append(uniform_ce(r.model, w.x, w.y, w.h0, reference, batch))
            # A setting that cannot exit before R has the never-exiting run's outcome;
            # every other one replays that run's loops up to its first exit.
            loops: list = []
            never = evaluate(r.model, w.x, w.y, w.h0, never_exits(cfg.first, cfg.every),
                             reference, batch, record=loops)
            for rule, threshold in tqdm(settings(grids), desc=f"policies {name} {s}",
                                        unit="setting", mininterval=5):
                policy = make(rule, threshold, cfg.first, cfg.every, probe)
                results[(rule, threshold)][s].append(
                    evaluate(r.model, w.x, w.y, w.h0, policy, reference, batch, replay=loops)
                    if policy.can_exit(reference) else never)
            del loops
        docs.append(sets["report"].token_docs())
    metrics, rows = summarize(
        r.model, {s: np.concatenate(v, axis=1) for s, v in uniform.items()},
        {key: {s: pool(v) for s, v in per_set.items()} for key, per_set in results.items()},
        np.concatenate(docs), reference, cfg.match_nats, params.convergence.bootstrap)
    metrics["seeds"] = len(docs)
    metrics.update(Units(np.concatenate(docs), sets["report"].unit).describe())
    with atomic_output(paths.table_file("policies", name)) as tmp:
        pd.DataFrame(rows).to_parquet(tmp, index=False)
    write_json(paths.metrics_file("policies", name), metrics)
    found = ", ".join(f"{rule} {m['mean_loops']:.2f} loops (FLOPs x{m['flops_ratio']:.2f}, "
                      f"x{m['flops_ratio_baseline']:.2f} of the baseline)"
                      if m.get("matched") else f"{rule} unmatched"
                      for rule, m in metrics.items() if isinstance(m, dict) and "matched" in m)
    print(f"policies {name}: depth-{reference} quality at: uniform depth "
          f"{metrics['uniform']['matched_depth']}, {found}")


if __name__ == "__main__":
    run(main, stage=f"policies@{sys.argv[1]}")
