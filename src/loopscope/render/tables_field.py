"""Paper B's report, past the paper: the measurements the field asked for after it
(reports/convergence.ipynb). Final-loop key/value reuse on the backbones
(metrics/convergence's `kv_reuse`: loopscope.measure.trajectory.reuse) and every exit
rule against the settle-depth oracle (metrics/policies' `oracle`:
loopscope.measure.exit_rules.oracle). Extensions: no claim row reads them.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from loopscope.render.tables_b import Inputs, exit_rules
from loopscope.stats.intervals import Interval


def _runs(m: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A cell's pooled metrics, then each seed's (per_seed), labelled."""
    seeds = m.get("per_seed", {})
    pooled = f"pooled ({len(seeds)} seeds)" if seeds else "one seed"
    return [(pooled, m), *seeds.items()]


def _pct(raw: dict[str, float]) -> str:
    iv = Interval.of(raw)
    return f"{iv.value:.2%} [{iv.lo:.2%}, {iv.hi:.2%}]"


def reuse_table(x: Inputs) -> pd.DataFrame:
    """Per cell with a reuse measurement, run (pooled, each seed) and depth (R, 2R): CE
    with the model's own keys and values and with the final loop's at every loop, and
    the cost in nats and as a share, with intervals."""
    rows = []
    for c in x.cells:
        for run, m in _runs(x.conv[c]):
            for depth, q in m.get("kv_reuse", {}).items():
                rows.append({"cell": c, "run": run, "depth": f"{depth} = {q['depth']}",
                             "CE own": q["ce_own"], "CE reusing loop D's": q["ce_reuse"],
                             "cost (nats)": str(Interval.of(q["delta_ce"])),
                             "cost (share)": _pct(q["share"])})
    return pd.DataFrame(rows)


def reuse_line(x: Inputs) -> str:
    """What the reuse table measures, in words."""
    if reuse_table(x).empty:
        return "No cell measured final-loop key/value reuse (`convergence.kv_reuse`)."
    return ("**Final-loop key/value reuse** (Looped Models Done Right II, arXiv 2610.06833): "
            "the CE read at loop D when every loop's core attention reads the keys and "
            "values of loop D, from the model's own run to D, instead of its own; D = R and "
            "2R, on the `report` windows. A model whose states have reached their fixed "
            "point loses nothing; the paper reports 2.4% for a 1.6B model. Intervals: 95%, "
            "documents resampled (and seeds, pooled).")


def oracle_cells(x: Inputs) -> list[str]:
    """The policy cells whose metrics read their exit rules against the oracle."""
    return [c for c in x.swept if "oracle" in x.pol[c]]


def oracle_line(p: dict[str, Any]) -> str:
    """The oracle itself on a policy cell, in one sentence."""
    o = p["oracle"]
    s, sm = Interval.of(o["settle_capped"]), Interval.of(o["settle_margin_capped"])
    return (f"**The settle-depth oracle** (Prediction Dynamics, arXiv 2609.21383): per token, "
            f"the first loop from which the prediction never changes up to {o['depth']} "
            f"loops, seen in hindsight. Capped at R = {o['r']}, its mean is {s}; "
            f"{_pct(o['settled_by_r'])} of tokens settle by R. The margin version (the "
            f"prediction also leads the runner-up by `policies.oracle_margin` nats) averages "
            f"{sm}, {_pct(o['settled_by_r_margin'])} settled by R. A **premature** exit stops "
            "before the oracle's settle loop with a prediction other than depth R's; "
            "**lateness** is the loops an exit runs past the oracle's (capped at R), over "
            "the exits that are not premature.")


def oracle_table(p: dict[str, Any]) -> pd.DataFrame:
    """Per exit rule at its matched setting and run (pooled, each seed that ran it): its
    mean loops, the premature and early-but-right shares, the mean lateness, and its
    depth over the oracle's (plain and margin version), with intervals."""
    rows = []
    for run, m in _runs(p):
        for rule in exit_rules(m):
            q = m[rule]
            if not q.get("matched") or "oracle" not in q:
                continue
            o = q["oracle"]
            rows.append({"rule": rule, "run": run, "threshold": q["threshold"],
                         "mean loops": q["mean_loops"],
                         "premature": _pct(o["premature"]),
                         "early, same prediction": _pct(o["early_right"]),
                         "lateness (loops)": str(Interval.of(o["lateness"])),
                         "depth / oracle": str(Interval.of(o["depth_over_oracle"])),
                         "depth / margin oracle": str(Interval.of(o["depth_over_oracle_margin"]))})
    return pd.DataFrame(rows)


def oracle_points(p: dict[str, Any]) -> pd.DataFrame:
    """Per rule (matched, cell's pooled metrics) and oracle settle loop: the rule's mean
    exit loop over the tokens the oracle settles there (the plot's points); "after R"
    pooled at R + 1, and the oracle's own share of tokens at that loop."""
    r, by = p["oracle"]["r"], p["oracle"]["by_settle"]
    def loop(key: str) -> int:
        return r + 1 if key.startswith("after") else int(key[1:])
    rows = [{"rule": rule, "settle": loop(k), "exit": v, "share": by.get(k, 0.0)}
            for rule in exit_rules(p) if "oracle" in p[rule]
            for k, v in p[rule]["oracle"]["exit_by_settle"].items()]
    # the metrics' keys come sorted as text ("after8" before "k1"): loop order per rule
    return pd.DataFrame(rows).sort_values(["rule", "settle"], kind="stable",
                                          ignore_index=True)
