"""The tables, curves and sentences paper B's report (reports/convergence.ipynb) shows,
computed from this run's outputs; the notebook displays them and draws them with
loopscope.render.figures_b. Paper B's metrics are read as typed records
(loopscope.judge.metrics_b: per-loop series indexed by loop, 1..D; R: model.loops, the
evaluation depth; D: the deepest depth measured), and the verdicts are the claims
stage's (tables/claims.json), never judged again here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from loopscope.base import paths
from loopscope.base.outputs import read_json, read_metrics, read_table, require_output
from loopscope.judge.backbone import STATES, Backbone, recipe_deviation, worst_step
from loopscope.judge.cells import cell_group, paper_b_backbones
from loopscope.judge.criteria import Criteria
from loopscope.judge.metrics_b import ConvergenceMetrics, PolicyMetrics, threshold_text
from loopscope.judge.settling import LABELS, Tokens, by_type, percent
from loopscope.render.report_tables import claims, criteria_values
from loopscope.stats.intervals import Interval
from loopscope.weights.config import CellConfig, load_cell

TYPE_ORDER = ("whitespace", "punctuation", "number", "function_word", "content_word")


@dataclass
class Inputs:
    """What the report reads once: each cell's config and metrics/convergence, each
    policy cell's metrics/policies, the backbones (main: paper B's main setting, second:
    its saturation test) and the criteria the claims stage judged at."""

    cells: list[str]
    configs: dict[str, CellConfig]
    conv: dict[str, dict[str, Any]]
    pol: dict[str, dict[str, Any]]
    backbones: list[str]
    main: str | None
    second: str | None
    criteria: Criteria

    @classmethod
    def read(cls, cells: list[str], policy_cells: list[str]) -> Inputs:
        configs = {c: load_cell(paths.config_file(c)) for c in cells}
        backbones = [c for c, cfg in configs.items() if cell_group(cfg) == "paper B backbone"]
        main, second = paper_b_backbones({c: configs[c] for c in backbones})
        return cls(cells, configs, {c: read_metrics("convergence", c) for c in cells},
                   {c: read_metrics("policies", c) for c in policy_cells}, backbones, main,
                   second, Criteria(criteria_values()))

    def metrics(self, c: str) -> ConvergenceMetrics:  # typed: loopscope.judge.metrics_b
        return ConvergenceMetrics(self.conv[c])

    def backbone(self, c: str) -> Backbone:
        return Backbone(c, self.conv[c], self.pol.get(c), self.criteria)

    @property
    def swept(self) -> list[str]:
        """The backbones whose exit rules were swept (policy cells)."""
        return [c for c in self.backbones if c in self.pol]



def intro(x: Inputs) -> str:
    """The sentence under the report's first table: the backbones and their roles."""
    return (f"**Backbones**: {', '.join(x.backbones) or 'none'}; main setting: `{x.main}`; "
            f"saturation test: `{x.second}`. R, the depth every comparison is made "
            "against, is `model.loops`; `mean convention` says whether training drew "
            "E[r] = R (`loops`) or Huginn's E[r] = R + 1 (`loops_plus_one`).")


def backbone_table(x: Inputs) -> pd.DataFrame:
    """A row per backbone: R, its depth sampler, mean convention and sigma, its blocks,
    how its recipe differs from paper B's, and what metrics/convergence measured
    (largest depth, seeds, resampling units and the documents they lie in)."""
    rows = []
    for c in x.backbones:
        t, m, conv = x.configs[c].train, x.configs[c].model, x.conv[c]
        rows.append({"backbone": c, "R (model.loops)": m.loops,
                     "depth sampler": t.depth, "mean convention": t.depth_mean,
                     "sigma": t.depth_sigma,
                     "prelude / core / coda": f"{m.n_prelude} / {m.n_core} / {m.n_coda}",
                     "against paper B's recipe": recipe_deviation(x.configs[c]),
                     "init": m.init, "steps": t.steps, "lr": t.lr,
                     "backprop loops": t.backprop_loops,
                     "max depth measured": conv["max_depth"], "seeds": conv["seeds"],
                     "resampled": x.backbone(c).resampled})
    return pd.DataFrame(rows)


def elasticity_curves(x: Inputs) -> pd.DataFrame:
    """CE at each uniform depth, a row per backbone and depth, with the backbone's R."""
    rows = []
    for c in x.backbones:
        m = x.metrics(c)
        rows += [{"backbone": c, "depth": d, "ce": v, "r": m.r}
                 for d, v in m.ce_at_depth.items()]
    return pd.DataFrame(rows)


def elasticity_table(x: Inputs) -> pd.DataFrame:
    """A row per backbone: CE at depth 1 and R, the gains to R and from R/2, the worst
    step up to R (as the elasticity claim reads it), how flat CE stays past R and the
    useful depth, with their intervals."""
    rows = []
    for c in x.backbones:
        m = x.metrics(c)
        e, r = m.elasticity, m.r
        worst = worst_step(e)
        rows.append({"backbone": c, "R": r, "m (nominal mean)": m.nominal_mean,
                     "E[r] (training mean)": m.sampler_mean,
                     "CE(1)": m.ce_at_depth[1], "CE(R)": m.ce_at_depth[r],
                     "CE(1) - CE(R)": str(Interval.of(e.gain)),
                     "CE(R/2) - CE(R)": str(Interval.of(e.half_gain)),
                     "worst step CE(k+1) - CE(k)":
                         f"k = {worst[0]}: {worst[1]}" if worst else "-",
                     "max |CE(D) - CE(R)|, D = R..4R": str(Interval.of(e.flat)),
                     "useful depth": str(x.backbone(c).useful)})
    return pd.DataFrame(rows)


def change_curves(x: Inputs) -> pd.DataFrame:
    """Per cell and loop i: the mean KL between successive output distributions and the
    mean relative state change, and whether the cell is a backbone (drawn bold)."""
    rows = []
    for c in x.cells:
        kl, change = x.metrics(c).kl, x.metrics(c).state_change
        rows += [{"cell": c, "loop": i, "kl": kl.get(i), "state_change": change.get(i),
                  "backbone": c in x.backbones} for i in sorted({*kl, *change})]
    return pd.DataFrame(rows)


def cycle_table(x: Inputs) -> pd.DataFrame:
    """The fixed-point-or-cycle measurements of each backbone (metrics/convergence's
    `cycle`): late and early decay of the state change per loop, the two-step against
    the one-step change past R, and the share of tokens with a period-2 signature."""
    rows = []
    for c in x.backbones:
        cyc = x.conv[c].get("cycle")
        if not cyc:
            continue
        rows.append({"backbone": c, **{k: str(Interval.of(v)) if isinstance(v, dict) else v
                                       for k, v in cyc.items()}})
    return pd.DataFrame(rows)


def settling_table(x: Inputs, resamples: int = 1000) -> pd.DataFrame:
    """Settling, cycling or drifting (loopscope.judge.settling) at the criteria the
    claims judged at: per cell (every cell measured) and per token type, the share of
    tokens with each label over the late window, with its interval (documents resampled,
    and seeds where the cell has several). One table across cells."""
    rows = []
    for c in x.cells:
        if "settling" not in x.conv[c]:
            continue
        tokens = Tokens(read_table("convergence", c), resamples, c)
        for row in by_type(tokens, x.conv[c], x.criteria, TYPE_ORDER):
            rows.append({"cell": c, "type": row["type"], "tokens": row["tokens"],
                         **{k: percent(row[k]) for k in LABELS}})
    return pd.DataFrame(rows)


def settling_line(x: Inputs) -> str:
    """The labels' rule in words, at the thresholds the claims judged at."""
    p = x.criteria.values()
    return (f"Over the last {p['late_window']:g}R loops of the 4R trajectory, a token is "
            "**settling** where its state change's floor (c of c + a rho^j, fitted per token) "
            f"is consistent with one below {p['floor_share']:g} x its change at D (the lower "
            f"end of its 95% interval), or with rounding ({p['precision_floor']:g} float32 "
            "epsilons); otherwise **cycling** where at least "
            f"{p['alternating_share']:.0%} of its late updates point back against the one "
            "before, else **drifting**. Shares with 95% intervals (documents resampled).")


def token_loops(cell: str) -> pd.DataFrame:
    """tables/convergence of a cell without its special tokens: a row per token, with
    its type, convergence loop and A1 exit loop."""
    path = require_output(paths.table_file("convergence", cell), f"convergence@{cell}")
    tokens = pd.read_parquet(path)
    return tokens[tokens["type"] != "special"]


def type_order(tokens: pd.DataFrame) -> list[str]:
    """The token types present in token_loops, in TYPE_ORDER."""
    present = set(tokens["type"])
    return [t for t in TYPE_ORDER if t in present]


def token_table(m: dict[str, Any]) -> pd.DataFrame:
    """Convergence by token type (metrics/convergence's `types`), a row per type judged
    or too rare to judge: its statistics, its share of tokens, and its paired
    differences from whitespace and from content words with their intervals."""
    t = m["types"]
    by = pd.DataFrame({n: t[n] for n in t.get("judged", []) + t.get("rare", [])}).T
    by["judged"] = ["yes" if n in t["judged"] else "too rare" for n in by.index]
    by["share"] = by["share"].map("{:.1%}".format)
    by["whitespace - this"] = [str(Interval.of(t["whitespace_minus"][n]))
                               if n in t.get("whitespace_minus", {}) else "" for n in by.index]
    by["content words - this"] = [str(Interval.of(t["content_minus"][n]))
                                  if n in t.get("content_minus", {}) else "" for n in by.index]
    return by


def convergence_line(cell: str, m: dict[str, Any]) -> str:
    """The sentence under a backbone's convergence figures: median convergence loop and
    A1 exit loop, the share of tokens still changing after R, epsilon, and how many
    special tokens were left out."""
    c, r = m["convergence"], m["r"]
    share = Interval.of(c["share_after_r"])
    return (f"`{cell}`: median convergence loop **{Interval.of(c['median_loop'])}**, median "
            f"A1 exit loop {Interval.of(c['median_exit_loop'])}; **{share.value:.1%}** "
            f"[{share.lo:.1%}, {share.hi:.1%}] of tokens still change after R = {r} "
            f"(epsilon {c['epsilon']:g}); {m['types'].get('excluded', 0)} special tokens "
            "left out.")


def frontier(cell: str) -> pd.DataFrame:
    """tables/policies of a backbone on the `report` windows: each rule's settings with
    their mean loops, FLOPs and CE (thresholds were chosen on `choose`)."""
    path = require_output(paths.table_file("policies", cell), f"policies@{cell}")
    settings = pd.read_parquet(path)
    return settings[settings["set"] == "report"]


def exit_rules(p: dict[str, Any]) -> list[str]:
    """The exit rules in a backbone's metrics/policies, in its order: the entries with
    a matched-quality result (uniform depth, A0, is kept apart)."""
    return [k for k, v in p.items() if isinstance(v, dict) and "matched" in v]


def match_target(p: dict[str, Any]) -> float:
    """CE(R) + the matching margin: the CE a policy has to stay under on `report`."""
    return PolicyMetrics(p).match_target


def policy_intro(cell: str, p: dict[str, Any]) -> str:
    """The sentence above a backbone's policy table: how thresholds were chosen and
    judged, and the honest baseline depth."""
    return (f"`{cell}` at matched quality (chosen on `choose` within {p['choose_nats']} "
            f"nats of depth R = {p['r']}, judged on `report` against {p['match_nats']}); "
            f"the honest baseline is uniform depth {p['baseline_depth']}, the smaller of R "
            "and the smallest uniform depth matching it:")


def policy_table(p: dict[str, Any]) -> pd.DataFrame:
    """A row per policy at matched quality: uniform depth (A0) first, then each rule's
    chosen threshold, mean loops and CE - CE(R) with intervals, FLOPs against depth R
    and against uniform baseline depth, and the same at the rule's default threshold."""
    base, u, typed = p["baseline_depth"], p["uniform"], PolicyMetrics(p)
    flops, matched = typed.uniform_flops, typed.matched_depth
    rows: list[dict[str, Any]] = [
        {"policy": "uniform (A0)", "threshold": matched,
         "mean loops": str(matched), "CE - CE(R)": str(Interval.of(u["delta_ce"])),
         "FLOPs / depth R": flops[matched] / flops[typed.r]}]
    for rule in exit_rules(p):
        q = p[rule]
        if not q.get("matched"):
            rows.append({"policy": rule, "threshold": "no setting matched"})
            continue
        row = {"policy": rule, "threshold": threshold_text(q),
               "mean loops": str(Interval.of(q["mean_loops_iv"])),
               "CE - CE(R)": str(Interval.of(q["delta_ce"])),
               "FLOPs / depth R": q["flops_ratio"],
               f"FLOPs / uniform depth {base}": q["flops_ratio_baseline"],
               "note": "matched at the grid's most aggressive setting: the grid may stop "
                       "too early" if q.get("at_grid_edge") else ""}
        if d := q.get("default"):
            row.update({"default threshold": d["threshold"],
                        "mean loops at default": d["mean_loops"],
                        "CE - CE(R) at default": str(Interval.of(d["delta_ce"]))})
        rows.append(row)
    return pd.DataFrame(rows)


def saturation_curves(x: Inputs) -> pd.DataFrame:
    """Per backbone and uniform depth r: CE(r) - the best CE over all depths (0 at the
    best depth; the useful depth is read from this curve), with the backbone's useful
    depth, its interval and the margin its rule allows (a share of CE(1) - CE(best))."""
    rows = []
    for c in x.backbones:
        depth, ce = zip(*x.metrics(c).ce_at_depth.items(), strict=True)
        gap = np.asarray(ce) - min(ce)
        sat, useful = x.conv[c]["saturation"], x.backbone(c).useful
        margin = sat["share"] * gap[0] if "share" in sat else None
        rows += [{"backbone": c, "r": x.conv[c]["r"], "depth": d, "gap": float(g),
                  "useful": sat["useful_depth"], "lo": useful.lo, "hi": useful.hi,
                  "label": f"{c} (R = {x.conv[c]['r']}, useful depth {useful})",
                  "margin": margin} for d, g in zip(depth, gap, strict=True)]
    return pd.DataFrame(rows)


def sensitivity_table(x: Inputs) -> tuple[pd.DataFrame, str]:
    """The saturation row at every tolerance of the useful depth, as the claims stage
    judged it (the row's `tolerances` in tables/claims.json; not judged again here): each
    backbone's useful depth and regime there, the verdict, and whether it changes."""
    if x.main is None or x.second is None:
        return pd.DataFrame(), "The saturation test needs two backbones; this run has fewer."
    row = next((r for r in claims()["paper_b"] if r["id"] == "B.saturation"), {})
    found = row.get("tolerances", [])
    if not found:
        return pd.DataFrame(), "No sensitivity table in these metrics."
    rows = [{"tolerance": t["tolerance"], "verdict": t["verdict"],
             **{k: v for b in t["backbones"] for k, v in (
                 (b["backbone"], str(Interval.of(b["useful_depth"]))),
                 (f"{b['backbone']} regime", STATES[b["state"]]))}} for t in found]
    verdicts = {r["verdict"] for r in rows}
    line = (f"**The saturation verdict changes with the tolerance** "
            f"({', '.join(sorted(verdicts))})." if len(verdicts) > 1 else
            f"The saturation verdict is the same at every tolerance: {rows[0]['verdict']}.")
    return pd.DataFrame(rows), line


def cross_table(x: Inputs) -> pd.DataFrame:
    """The KL exit on every cell, a row each: its group, final-loop mean norm at its own
    K (metrics/diagnose), mean exit loop against the best uniform depth, the CE cost
    of exiting there, and the angle the state still turns at the exit and at the best
    depth."""
    rows = []
    for c in x.cells:
        cr = x.conv[c]["cross"]
        norm = read_metrics("diagnose", c)["norm_mean"][f"k{x.configs[c].model.loops}"]
        rows.append({"cell": c, "group": cell_group(x.configs[c]), "final-loop norm": norm,
                     "mean exit loop": cr["mean_exit_loop"],
                     "max depth": x.conv[c]["max_depth"], "best uniform depth": cr["best_depth"],
                     "CE at exit - CE at best depth": str(Interval.of(cr["delta_ce"])),
                     "angle at exit (rad)": cr["angle_at_exit"],
                     "angle at best depth (rad)": cr["angle_at_best_depth"]})
    return pd.DataFrame(rows).set_index("cell")


def cross_line(x: Inputs) -> str:
    return (f"KL exit at epsilon {x.conv[x.cells[0]]['cross']['epsilon']:g}, capped at 4x "
            "the training depth.")


def exit_shares(x: Inputs) -> pd.DataFrame:
    """Per cell and loop: the share of tokens A1 exits at."""
    rows = []
    for c in x.cells:
        rows += [{"cell": c, "loop": k, "share": v}
                 for k, v in x.metrics(c).exit_share.items()]
    return pd.DataFrame(rows)


def exit_benchmark() -> dict[str, Any] | None:
    """metrics/bench/exits.json, or None where this run has no exit benchmark."""
    path = paths.bench_file("exits")
    return read_json(path, "bench_exits") if path.is_file() else None


def bench_line(bench: dict[str, Any]) -> str:
    """What the benchmark timed: cell, run, depths, schedule, rounds and machine."""
    return (f"Cell `{bench['cell']}` ({bench['run']}), R = {bench['r']}, smallest matching "
            f"uniform depth {bench['matched_depth']}, baseline depth "
            f"**{bench['baseline_depth']}**, check schedule {bench['check_schedule']}, "
            f"{bench['repeats']} interleaved rounds, {bench['machine']}.")


def exit_regime(bench: dict[str, Any], x: Inputs) -> str | None:
    """How to read the timed backbone's speedup against uniform depth: inside paper B's
    regime, at its edge or outside it (a backbone that does not need its depth leaves a
    per-token policy little to save). None: the timed cell has no convergence metrics."""
    if bench["cell"] not in x.conv:
        return None
    timed = x.backbone(bench["cell"])
    return (f"**Regime:** {timed.depth_use}. The speedup against uniform depth is read "
            f"{timed.regime()}"
            + (": a backbone that does not need its depth leaves a per-token policy little "
               "to save over a shallower uniform depth." if timed.state() == "outside"
               else "."))


BENCH_MODES = ("scoring", "generation_batch1", "generation_batched")


def _check_word(mode: dict[str, Any]) -> str:
    """A mode's depth check in a word: holds, fails, or not checked (older timings)."""
    check = mode.get("depth_check")
    return "not checked" if check is None else "holds" if check["holds"] else "fails"


def speedup_table(bench: dict[str, Any]) -> pd.DataFrame:
    """A row per benchmark mode and policy: mean loops, then the realized (wall clock),
    FLOP and measured speedup against the baseline depth (the smallest uniform depth
    matching depth R) and the same against depth R, and the mode's depth check."""
    base = bench["baseline_depth"]
    rows = []
    for mode in BENCH_MODES:
        b = bench.get(mode)
        for policy in (b or {}).get("realized", {}):
            rows.append({"mode": mode, "policy": policy, "mean loops": b["mean_loops"][policy],
                         f"realized vs depth {base}": b["realized"][policy],
                         f"FLOP speedup vs depth {base}": b["flop_speedup"][policy],
                         f"measured speedup vs depth {base}":
                             b.get("measured_speedup", {}).get(policy),
                         "realized vs depth R": b["realized_vs_r"][policy],
                         "FLOP speedup vs depth R": b["flop_speedup_vs_r"][policy],
                         "measured speedup vs depth R":
                             b.get("measured_speedup_vs_r", {}).get(policy),
                         "depth check": _check_word(b)})
    return pd.DataFrame(rows)


def depth_check_line(bench: dict[str, Any]) -> str:
    """One paragraph: each mode's depth check (loopscope.measure.bench.bench_exits): uniform
    depth R's median time over uniform depth B's against the bound, its rounds, retimes
    and rounds still over; a mode that fails is named, its ratios to be read as the
    machine's noise as much as the runtime's."""
    r, base = bench["r"], bench["baseline_depth"]
    if r == base:
        return f"**Depth check**: the baseline is depth R = {r}; there is no second depth."
    checks = {m: bench[m]["depth_check"] for m in BENCH_MODES
              if "depth_check" in bench.get(m, {})}
    if not checks:
        return ("**Depth check**: these timings were taken before the check that uniform "
                f"depth {r} takes at most {r}/{base} the time of uniform depth {base}: "
                "read their ratios with care.")
    bound = next(iter(checks.values()))["bound"]
    parts = [f"{m} {c['ratio']:.2f}x, {'holds' if c['holds'] else '**fails**'} "
             f"({c['rounds']} rounds kept, {c['retimed']} retimed, {c['failed_rounds']} "
             f"still over)" for m, c in checks.items()]
    failed = [m for m, c in checks.items() if not c["holds"]]
    return (f"**Depth check**: only the loops grow with depth, so uniform depth {r} takes "
            f"at most {r}/{base} = {r / base:.2f}x the time of uniform depth {base}; the "
            f"bound, with slack for jitter, is {bound:.2f}x. " + "; ".join(parts) + ". "
            + (f"**Flagged: {', '.join(failed)}**: uniform depth {r} still took more than "
               "the bound once its failing rounds were retimed, so that mode's ratios are "
               "the machine's noise as much as the runtime's." if failed else
               "Every mode's timings add up."))


def untimed_line(bench: dict[str, Any]) -> str | None:
    """The timed rules the benchmark left out, and why (None: every one was timed)."""
    left = bench.get("not_timed") or {}
    return ("Not timed: " + "; ".join(f"`{n}` ({why})" for n, why in left.items()) + "."
            if left else None)


def speedup_bars(bench: dict[str, Any]) -> pd.DataFrame:
    """speedup_table's realized speedups as bars: a row per setting ("policy (mode)")
    and baseline (the baseline depth, depth R)."""
    base = bench["baseline_depth"]
    rows = []
    for row in speedup_table(bench).to_dict("records"):
        for against in (f"realized vs depth {base}", "realized vs depth R"):
            rows.append({"setting": f"{row['policy']} ({row['mode']})", "against": against,
                         "x": row[against]})
    return pd.DataFrame(rows)


RUNTIME_GOAL = 1.4  # the exit runtime's goal: realized speedup over the baseline depth


def runtime_goal(bench: dict[str, Any]) -> str:
    """One line: the best realized speedup against the baseline depth against the goal,
    and whether the exits' FLOP speedup leaves room for it on this backbone."""
    base = bench["baseline_depth"]
    found = [(bench[m]["realized"][p], bench[m]["flop_speedup"][p], p, m)
             for m in BENCH_MODES if m in bench for p in bench[m]["realized"]]
    if not found:
        return "No policy was timed."
    realized, _, policy, mode = max(found)
    flop = max(f for _, f, _, _ in found)
    flagged = (" (that mode fails the depth check)" if _check_word(bench[mode]) == "fails"
               else "")
    line = (f"**Goal {RUNTIME_GOAL:g}x** realized against depth {base}: best {realized:.2f}x "
            f"({policy}, {mode}){flagged}, "
            f"{'met' if realized >= RUNTIME_GOAL else 'not met'}. ")
    if flop < RUNTIME_GOAL:
        return line + (f"On this backbone the goal is out of reach by FLOPs: the chosen exits' "
                       f"best FLOP speedup is {flop:.2f}x, so the exits save too little "
                       "compute over the smallest matching uniform depth for 1.4x.")
    return line + f"The chosen exits' best FLOP speedup, {flop:.2f}x, leaves room for it."


def profile_table(bench: dict[str, Any]) -> pd.DataFrame | None:
    """The benchmark's profile of one runtime scoring call, its top operators (None:
    not profiled)."""
    if "profile" not in bench:
        return None
    return pd.DataFrame(bench["profile"]["top_ops"]).round(3)


def profile_line(bench: dict[str, Any]) -> str:
    return f"Where a runtime scoring call spends its time ({bench['profile']['policy']}):"




LEDGER_ORDER = ("loop", "once", "check", "kv", "gather", "rest")


def _ledger_label(bench: dict[str, Any], part: str) -> str:
    return "rest: Python, operator launch" if part == "rest" else bench["ledger"]["labels"][part]


def ledger_table(bench: dict[str, Any]) -> pd.DataFrame | None:
    """Where the time goes (the benchmark's `ledger`), a row per mode and part: seconds
    of uniform depth B and of the policy through the same runtime (one call each, its
    marks timed), their difference, then the sum of the parts against the same calls'
    median time without the marks. None: the benchmark has no ledger (no policy was timed)."""
    led = bench.get("ledger")
    if not led:
        return None
    (u, label), p = (f"uniform{s}{led['uniform_depth']}" for s in "_ "), led["policy"]
    rows = []
    for mode, m in led["modes"].items():
        pu, pp = m["parts"][u], m["parts"][p]
        for part in LEDGER_ORDER:
            rows.append({"mode": mode, "part": _ledger_label(bench, part),
                         f"{label} (s)": pu[part], f"{p} (s)": pp[part],
                         "policy - uniform (s)": pp[part] - pu[part]})
        rows.append({"mode": mode, "part": "sum of the parts (timed wall)",
                     f"{label} (s)": pu["wall"], f"{p} (s)": pp["wall"],
                     "policy - uniform (s)": pp["wall"] - pu["wall"]})
        rows.append({"mode": mode, "part": "measured without the marks (median)",
                     f"{label} (s)": m["measured"][u], f"{p} (s)": m["measured"][p],
                     "policy - uniform (s)": m["measured"][p] - m["measured"][u]})
    return pd.DataFrame(rows)


def ledger_bars(bench: dict[str, Any]) -> pd.DataFrame:
    """The ledger as stacked bars: per mode and run (uniform depth B, the policy), each
    part's seconds as a share of uniform depth B's timed wall time."""
    led = bench["ledger"]
    (u, label), p = (f"uniform{s}{led['uniform_depth']}" for s in "_ "), led["policy"]
    rows = []
    for mode, m in led["modes"].items():
        wall = m["parts"][u]["wall"]
        for run, shown in ((u, label), (p, p)):
            rows += [{"mode": mode, "run": shown, "part": _ledger_label(bench, part),
                      "share": m["parts"][run][part] / wall} for part in LEDGER_ORDER]
    return pd.DataFrame(rows)


def ledger_lines(bench: dict[str, Any]) -> list[str]:
    """Per mode, one paragraph: the policy's time against uniform depth B's, whether the
    parts add up to the measured time (within 10%), the realized against the FLOP
    ratio, what would have to shrink for the runtime to reach the FLOP ratio, and
    whether RUNTIME_GOAL is within reach at all (the loops and the once-per-token work
    alone against B's time over the goal)."""
    led = bench.get("ledger")
    if not led:
        return []
    (u, label), p = (f"uniform{s}{led['uniform_depth']}" for s in "_ "), led["policy"]
    out = []
    for mode, m in led["modes"].items():
        pu, pp = m["parts"][u], m["parts"][p]
        added = sum(pp[k] - pu[k] for k in ("kv", "gather", "check", "rest"))
        flop = bench[mode]["flop_speedup"][p]
        target, goal = pu["wall"] / flop, pu["wall"] / RUNTIME_GOAL
        floor = pp["loop"] + pp["once"]
        sums = pp["wall"] / m["measured"][p]
        out.append(
            f"**{mode}**: `{p}` {pp['wall']:.3f} s against {pu['wall']:.3f} s for {label} "
            f"(timed by part; the parts add up to {sums:.0%} of its time without the marks, "
            f"{m['measured'][p]:.3f} s, {'within' if abs(sums - 1) <= 0.1 else 'outside'} "
            f"10%); realized {pu['wall'] / pp['wall']:.2f}x against a FLOP ratio of "
            f"{flop:.2f}x. "
            + (f"To reach the FLOP ratio its time would have to fall by "
               f"{pp['wall'] - target:.3f} s, to {target:.3f} s; " if pp["wall"] > target else
               f"It is at or beyond the FLOP ratio ({target:.3f} s matches it); ")
            + f"it spends {added:+.3f} s on key/value handling, gathering, checks and the "
            f"rest against {label}, and {pp['loop'] - pu['loop']:+.3f} s on the loops. "
            f"{RUNTIME_GOAL:g}x needs {goal:.3f} s: "
            + ("reached." if pp["wall"] <= goal else
               f"within reach only if those overheads shrink (the loops and once-per-token "
               f"work alone take {floor:.3f} s)." if floor <= goal else
               f"out of reach even with every overhead gone (the loops and once-per-token "
               f"work alone take {floor:.3f} s)."))
    return out


def acceleration_line(p: dict[str, Any]) -> str:
    """Whether the latent-acceleration rule (second order, no head) reaches depth R's
    quality in fewer FLOPs than A1, the checks' cost counted (A1 reads the coda and head
    at every check, a state check costs next to nothing); both rules' FLOPs against
    depth R and against the baseline depth, the smallest uniform depth matching R."""
    acc, kl = p.get("latent-acceleration"), p.get("kl")
    if acc is None or kl is None:
        return "latent-acceleration or A1 was not swept on this backbone."
    if not acc.get("matched") or not kl.get("matched"):
        missing = "latent-acceleration" if not acc.get("matched") else "A1"
        return f"{missing} matched depth R's quality at no setting: nothing to compare."
    def iv(q: dict[str, Any], key: str) -> str:
        return str(Interval.of(q[f"{key}_iv"])) if f"{key}_iv" in q else f"{q[key]:.3f}"

    def flops(q: dict[str, Any]) -> str:
        return (f"FLOPs {iv(q, 'flops_ratio')} of depth R and "
                f"{iv(q, 'flops_ratio_baseline')} of uniform depth {p['baseline_depth']}")
    fewer = acc["flops_ratio"] < kl["flops_ratio"]
    return (f"`latent-acceleration` at matched quality: {acc['mean_loops']:.2f} mean loops, "
            f"{flops(acc)} (the baseline A1 is held to), checks counted; A1: "
            f"{kl['mean_loops']:.2f} mean loops, {flops(kl)}. It reaches depth R's quality in "
            f"{'fewer' if fewer else 'no fewer'} FLOPs than A1"
            + ("" if acc["flops_ratio_baseline"] < 1 else
               f", and in no fewer than uniform depth {p['baseline_depth']}") + ".")
