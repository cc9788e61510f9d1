"""The tables and numbers the report notebooks show, computed from this run's outputs
(configs/, metrics/, tables/). A notebook calls these, displays what they return and
draws figures (loopscope.render.figures): every value a report shows is computed, and tested,
here. Files are read through loopscope.base.outputs, so a missing one names the stage to run.

    every report         table_display, computed_from, claims_table, verdict_counts,
                         units_statement, experiment_verdicts
    index                provenance_table, headline_table
    blind_spot (paper A) cell_table, per_loop_table, sweep_table, depths, norm_ccdf,
                         final_loop_norms, paper_norms, lemma2_table, slope_table,
                         perplexity_table, clamp_modes
    convergence          backbone_cells, backbone_table, elasticity_table, token_loops,
    (paper B)            token_table, convergence_line, frontier, exit_rules, match_target,
                         policy_table, saturation_gap, cross_table, exit_benchmark,
                         exit_regime, speedup_table, profile_table

Per-loop metrics are keyed "k1".."kR" (R: the evaluation depth, model.loops; K for
paper A's cells, their training depth).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from loopscope.base import paths
from loopscope.base.outputs import loop_order, read_json, read_metrics, require_output
from loopscope.judge.cells import cell_group, recipe
from loopscope.judge.experiments import flips, recorded, run_counts, verdict_columns
from loopscope.judge.group_a import CellA
from loopscope.judge.paper_a import PAPER_CONTROL_NORMS, PAPER_DRIFT_NORMS
from loopscope.judge.paper_b import Backbone, fragile, recipe_deviation, sensitivity, worst_step
from loopscope.measure.intervals import Interval
from loopscope.measure.sweep import sweep_means
from loopscope.measure.units import FEWEST_UNITS
from loopscope.weights.config import CellConfig, load_cell

# --- Every report ---------------------------------------------------------------------


def table_display() -> None:
    """pandas' table display for the reports: 4 significant decimals rather than 6, and
    "-" where a value does not apply (a paper A cell has no A1 exit, say) instead of
    "nan". Called by every report before its first table."""
    pd.set_option("display.precision", 4)
    pd.set_option("styler.format.precision", 4)
    pd.set_option("styler.format.na_rep", "-")
    pd.set_option("display.float_format", lambda v: "-" if v != v else f"{v:.4g}")


def computed_from(provenance: Mapping[str, str]) -> str:
    """The line under a report's title that says what it was computed from
    (loopscope.render.report.provenance)."""
    return "Computed from: " + ", ".join(f"{k} {v}" for k, v in provenance.items())


def claims_table(paper: str) -> pd.DataFrame:
    """One paper's rows of tables/claims.json ("paper_a" or "paper_b"): the claims
    stage's verdicts, rendered as they are (the reports judge nothing themselves)."""
    return pd.DataFrame(read_json(paths.CLAIMS, "claims")[paper])


def init_effect() -> str:
    """The claims stage's sentence on what the recipe does to paper A's drift magnitude
    ("" with one recipe group)."""
    return read_json(paths.CLAIMS, "claims")["init_effect"] or ""


def verdict_counts(claims: pd.DataFrame) -> dict[str, int]:
    """How many claims got each verdict, the most frequent first."""
    return {str(k): int(n) for k, n in claims["verdict"].value_counts().items()}


# --- index -----------------------------------------------------------------------------


def provenance_table(provenance: Mapping[str, str]) -> pd.DataFrame:
    """The provenance (loopscope.render.report.provenance) as a one-column table, a row each."""
    return pd.DataFrame([dict(provenance)]).T.rename(columns={0: ""})


def headline_table() -> pd.DataFrame:
    """metrics/headline.json, a row per cell, led by the cell's group (cells.cell_group):
    which comparison each headline number belongs to."""
    headline = pd.DataFrame(read_json(paths.HEADLINE, "headline")).T
    headline.insert(0, "group", [cell_group(load_cell(paths.config_file(c)))
                                 for c in headline.index])
    return headline


def units_statement(stage: str, cells: list[str]) -> str:
    """What the report's intervals resample, read from the units `stage` recorded for
    each of `cells` ("diagnose" for paper A's, "convergence" for paper B's). Where the
    windows span fewer than FEWEST_UNITS documents the units are blocks of windows
    within them (loopscope.measure.units), and the statement says so: an interval over blocks
    of a few texts says less about other texts than one over many documents."""
    groups: dict[tuple[str, int], list[str]] = {}
    for c in cells:
        m = read_metrics(stage, c)
        groups.setdefault((m["unit"], m["units"]), []).append(c)
    parts = [f"{n} {'documents' if unit == 'document' else f'units ({unit})'} for "
             f"{', '.join(names)}" for (unit, n), names in groups.items()]
    line = "Intervals resample " + "; ".join(parts) + "."
    if any(unit != "document" for unit, _ in groups):
        line += (f" **The validation windows span fewer than {FEWEST_UNITS} documents, so "
                 "the units are blocks of consecutive windows within those documents**, "
                 "each as long as it takes for adjacent blocks to be nearly uncorrelated; "
                 "the intervals speak for these texts, not for documents in general.")
    return line


def experiment_verdicts(paper: str, cells: list[str] | None = None
                        ) -> tuple[pd.DataFrame, pd.DataFrame, list[str]] | None:
    """The default's verdicts on `paper`'s claims beside every committed experiment's
    (loopscope.judge.experiments) that changed one of `cells` (None: every experiment), the
    count of each verdict per run, and a line per experiment: what it changed and the
    verdicts that turned between holds and contradicted. None when there is none."""
    exps = {n: e for n, e in recorded().items()
            if cells is None or any(k.startswith(f"cells.{c}.") for k in e["params"]
                                    for c in cells)}
    if not exps:
        return None
    table = verdict_columns(read_json(paths.CLAIMS, "claims")[paper],
                            {n: e["claims"][paper] for n, e in exps.items()})
    lines = []
    for name, e in exps.items():
        turned = flips(table, name)
        changed = ", ".join(f"{k}={v}" for k, v in e["params"].items())
        lines.append(f"`{name}` ({changed}; run on {e['base_commit'][:7]}): "
                     + (f"**{len(turned)} verdict(s) turned between holds and contradicted**: "
                        + "; ".join(f"{r.claim} [{r.group}]" for r in turned.itertuples())
                        if len(turned) else "no verdict turned between holds and contradicted"))
    return table, run_counts(table), lines


# --- blind_spot: paper A ---------------------------------------------------------------


def cell_table(cells: list[str]) -> pd.DataFrame:
    """A row per cell: what it varies (loss placement, readout, norm penalty, inter-loop
    norm), its group and recipe, training depth K and steps, and what it was measured
    on (seeds, resampling units, validation tokens), its size and training time."""
    rows = []
    for cell in cells:
        cfg = load_cell(paths.config_file(cell))
        m, t = cfg.model, cfg.train
        diag = read_metrics("diagnose", cell)
        rows.append({"cell": cell, "loss placement": t.loss, "readout": m.readout,
                     "norm penalty": t.norm_penalty, "inter-loop norm": m.inter_loop_norm,
                     "group": cell_group(cfg), "loops": m.loops, "steps": t.steps,
                     "recipe": recipe(cfg), "seeds": diag["seeds"],
                     "units": f"{diag['units']} ({diag['unit']})", "tokens": diag["val_tokens"],
                     "params": read_metrics("train", cell)["params"],
                     "train s": read_metrics(paths.TRAIN_TIMINGS, cell)["train_seconds"]})
    return pd.DataFrame(rows).set_index("cell")


# Per-loop columns of metrics/diagnose: the norm statistics (norm_<name>), then the rest.
NORM_STATS = ("mean", "median", "p99", "p99_over_median", "share_above_10x_median")
PER_LOOP = ("radial_fraction", "radial_fraction_token", "radial_floor", "angular_step",
            "angular_vs_scale_slope")


def per_loop_table(cells: list[str]) -> pd.DataFrame:
    """A row per cell and loop k = 1..K, in loop order: perplexity read at k, inference
    tokens/s at depth k, each clamp mode's change in CE ("clamp <mode>"), the norm
    statistics and the radial and angular measurements."""
    rows = []
    for cell in cells:
        diag = read_metrics("diagnose", cell)
        speed = read_metrics("throughput", cell)["tokens_per_s"]
        clamp = read_metrics("clamp", cell)
        for loop in loop_order(diag["ppl_at_depth"])[0]:
            key = f"k{loop}"
            row = {"cell": cell, "loop": loop, "ppl": diag["ppl_at_depth"][key],
                   "tokens/s": speed[key]}
            for mode in clamp:
                row[f"clamp {mode}"] = clamp[mode]["delta_ce"][key]
            for name in NORM_STATS:
                row[name] = diag[f"norm_{name}"][key]
            for name in PER_LOOP:
                row[name] = diag[name][key]
            rows.append(row)
    return pd.DataFrame(rows)


def sweep_table(data: Mapping[str, CellA]) -> pd.DataFrame:
    """The depth sweep past K, a row per cell and loop: the per-loop means over tokens
    (diagnostics.sweep_means: ce, scale, step, step_x_scale, radial), the cell's K, the
    perplexity exp(ce) and scale_prev, the scale s_k-1 the loop's angular step starts
    from (Lemma 2; none at loop 1)."""
    sweep = pd.concat([sweep_means(cell.sweep).reset_index().assign(cell=name, K=cell.loops)
                       for name, cell in data.items()], ignore_index=True)
    sweep["ppl"] = np.exp(sweep["ce"])
    sweep["scale_prev"] = sweep.groupby("cell")["scale"].shift(1)
    return sweep


def depths(cells: pd.DataFrame, sweep: pd.DataFrame) -> tuple[list[int], int]:
    """The training depths K of the cells (cell_table), each once, ascending; and the
    deepest loop the sweep (sweep_table) reached."""
    return sorted({int(k) for k in cells["loops"]}), int(sweep["loop"].max())


def norm_ccdf(norms: np.ndarray) -> pd.DataFrame:
    """The complementary CDF of per-token final-loop norms: each norm ascending, the
    same over the median (a mean shift leaves that curve where it is, a heavy tail
    stretches it) and the share of tokens whose norm is at least as large."""
    ordered = np.sort(norms)
    return pd.DataFrame({"norm": ordered, "over_median": ordered / np.median(ordered),
                         "share": 1.0 - np.arange(len(ordered)) / len(ordered)})


def final_loop_norms(per_loop: pd.DataFrame, loops: Mapping[str, int]) -> pd.DataFrame:
    """The norm statistics of each cell at its own final loop K (loops: cell -> K, e.g.
    cell_table's "loops"), a row per cell: cells trained at different depths each
    report their last loop, not the deepest cell's."""
    final = per_loop[per_loop["loop"] == per_loop["cell"].map(loops)]
    return final.set_index("cell")[list(NORM_STATS)]


def paper_norms(info: pd.DataFrame) -> pd.Series:
    """Paper A's final-loop norms beside each cell of cell_table (its group and loss
    placement): the drifting per-loop normed cell's and the controls' ("-" for a cell
    the paper gives no norm for)."""
    def paper(row: pd.Series) -> str:
        if row["loss placement"] != "per_loop":
            return "-"
        return {"normed baseline": PAPER_DRIFT_NORMS, "scale-controlled": PAPER_CONTROL_NORMS,
                "final-norm only": PAPER_CONTROL_NORMS}.get(
                    row["group"], "-")
    return info.apply(paper, axis=1).rename("paper A")


def lemma2_table(cells: list[str]) -> pd.DataFrame:
    """Lemma 2 over the depth sweep, a row per cell: metrics/diagnose's `lemma2`."""
    return pd.DataFrame({c: read_metrics("diagnose", c)["lemma2"] for c in cells}).T


def slope_table(per_loop: pd.DataFrame) -> pd.DataFrame:
    """The across-token log-log slope of the angular step on the scale, a row per cell
    and a column per loop k <= K."""
    slopes = per_loop.pivot(index="cell", columns="loop", values="angular_vs_scale_slope")
    return slopes.rename(columns=lambda k: f"across tokens, loop {k}")


def perplexity_table(per_loop: pd.DataFrame) -> pd.DataFrame:
    """Perplexity read at each depth, a row per cell and a column "K=k" per depth, and
    PPL(K=1)/PPL(K): depth 1 over each cell's own deepest depth, its K."""
    ppl = per_loop.pivot(index="cell", columns="loop", values="ppl")
    own = ppl.apply(lambda row: row.dropna().iloc[-1], axis=1)
    ppl.columns = [f"K={k}" for k in ppl.columns]
    ppl["PPL(K=1)/PPL(K)"] = ppl.iloc[:, 0] / own
    return ppl


def clamp_modes(per_loop: pd.DataFrame) -> list[str]:
    """The per_loop_table columns of the clamp modes, "clamp <mode>"."""
    return [c for c in per_loop.columns if c.startswith("clamp ")]


# --- convergence: paper B --------------------------------------------------------------


def backbone_cells(configs: Mapping[str, CellConfig]) -> list[str]:
    """The paper B backbones (sampled training depth) among the cells, in their order."""
    return [c for c, cfg in configs.items() if cell_group(cfg) == "paper B backbone"]


def backbone_table(names: list[str], configs: Mapping[str, CellConfig],
                   conv: Mapping[str, dict[str, Any]]) -> pd.DataFrame:
    """A row per backbone: R, its depth sampler, mean convention and sigma, its blocks,
    how its recipe differs from paper B's, and what metrics/convergence measured
    (largest depth, seeds, resampling units)."""
    rows = []
    for c in names:
        t, m = configs[c].train, configs[c].model
        rows.append({"backbone": c, "R (model.loops)": m.loops,
                     "depth sampler": t.depth, "mean convention": t.depth_mean,
                     "sigma": t.depth_sigma,
                     "prelude / core / coda": f"{m.n_prelude} / {m.n_core} / {m.n_coda}",
                     "against paper B's recipe": recipe_deviation(configs[c]),
                     "init": m.init, "steps": t.steps, "lr": t.lr,
                     "backprop loops": t.backprop_loops,
                     "max depth measured": conv[c]["max_depth"], "seeds": conv[c]["seeds"],
                     "resampled": f"{conv[c]['units']} units ({conv[c]['unit']})"})
    return pd.DataFrame(rows)


def elasticity_table(names: list[str], conv: Mapping[str, dict[str, Any]]) -> pd.DataFrame:
    """A row per backbone: CE at depth 1 and R, the gains to R and from R/2, the worst
    step up to R (paper_b.worst_step, as the elasticity claim reads it), how flat CE
    stays past R and the useful depth, with their intervals."""
    rows = []
    for c in names:
        m, r = conv[c], conv[c]["reference_depth"]
        e = m["elasticity"]
        worst = worst_step(e)
        rows.append({"backbone": c, "R": r, "m (nominal mean)": m.get("nominal_mean"),
                     "E[r] (training mean)": m.get("sampler_mean"),
                     "CE(1)": m["ce_at_depth"]["k1"], "CE(R)": m["ce_at_depth"][f"k{r}"],
                     "CE(1) - CE(R)": str(Interval.of(e["gain"])),
                     "CE(R/2) - CE(R)": str(Interval.of(e["half_gain"])),
                     "worst step CE(k+1) - CE(k)":
                         f"k = {worst[0]}: {worst[1]}" if worst else "-",
                     "max |CE(D) - CE(R)|, D = R..4R": str(Interval.of(e["flat"])),
                     "useful depth": str(Interval.of(m["saturation"]["useful_depth_iv"]))})
    return pd.DataFrame(rows)


def sensitivity_table(names: list[str], conv: Mapping[str, dict[str, Any]]
                      ) -> tuple[pd.DataFrame, str]:
    """The useful depth of each backbone (names: the saturation test's order), its
    regime mark and the saturation verdict at every tolerance of the convergence stage's
    table, and a line saying whether the verdict is fragile (changes across it)."""
    backbones = [Backbone(c, conv[c]) for c in names]
    rows = sensitivity(backbones)
    if not rows:
        return pd.DataFrame(), "No sensitivity table in these metrics."
    note = fragile(rows)
    line = (f"**The saturation verdict is {note}**: it hinges on the tolerance." if note else
            f"The saturation verdict is the same at every tolerance: {rows[0]['verdict']}.")
    return pd.DataFrame(rows), line


def token_loops(cell: str) -> pd.DataFrame:
    """tables/convergence of a cell without its special tokens: a row per token, with
    its type, convergence loop and A1 exit loop."""
    path = require_output(paths.table_file("convergence", cell), f"convergence@{cell}")
    tokens = pd.read_parquet(path)
    return tokens[tokens["type"] != "special"]


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
    c, r = m["convergence"], m["reference_depth"]
    share = Interval.of(c["share_after_reference"])
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
    return p["uniform"]["ce"][f"k{p['reference_depth']}"] + p["match_nats"]


def policy_table(p: dict[str, Any]) -> pd.DataFrame:
    """A row per policy at matched quality: uniform depth (A0) first, then each rule's
    chosen threshold, mean loops and CE - CE(R) with intervals, FLOPs against depth R
    and against uniform baseline depth, and the same at the rule's default threshold."""
    r, base, u = p["reference_depth"], p["baseline_depth"], p["uniform"]
    rows: list[dict[str, Any]] = [
        {"policy": "uniform (A0)", "threshold": u["matched_depth"],
         "mean loops": str(u["matched_depth"]), "CE - CE(R)": str(Interval.of(u["delta_ce"])),
         "FLOPs / depth R": u["flops"][f"k{u['matched_depth']}"] / u["flops"][f"k{r}"]}]
    for rule in exit_rules(p):
        q = p[rule]
        if not q.get("matched"):
            rows.append({"policy": rule, "threshold": "no setting matched"})
            continue
        row = {"policy": rule, "threshold": q["threshold"],
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


def saturation_gap(ce_at_depth: Mapping[str, float]) -> tuple[list[int], np.ndarray]:
    """(depths r, CE(r) - the best CE over all depths): the curve the useful depth is
    read from (0 at the best depth)."""
    depth, ce = loop_order(ce_at_depth)
    gap = np.array(ce)
    return depth, gap - gap.min()


def cross_table(cells: list[str], configs: Mapping[str, CellConfig],
                conv: Mapping[str, dict[str, Any]]) -> pd.DataFrame:
    """The KL exit on every cell, a row each: its group, final-loop mean norm at its own
    K (metrics/diagnose), mean exit loop against the best uniform depth, the CE cost
    of exiting there, and the angle the state still turns at the exit and at the best
    depth."""
    rows = []
    for c in cells:
        x = conv[c]["cross"]
        norm = read_metrics("diagnose", c)["norm_mean"][f"k{configs[c].model.loops}"]
        rows.append({"cell": c, "group": cell_group(configs[c]), "final-loop norm": norm,
                     "mean exit loop": x["mean_exit_loop"], "max depth": conv[c]["max_depth"],
                     "best uniform depth": x["best_depth"],
                     "CE at exit - CE at best depth": str(Interval.of(x["delta_ce"])),
                     "angle at exit (rad)": x["angle_at_exit"],
                     "angle at best depth (rad)": x["angle_at_best_depth"]})
    return pd.DataFrame(rows).set_index("cell")


def exit_benchmark() -> dict[str, Any] | None:
    """metrics/bench/exits.json, or None where this run has no exit benchmark."""
    path = paths.bench_file("exits")
    return read_json(path, "bench_exits") if path.is_file() else None


def exit_regime(bench: dict[str, Any], conv: Mapping[str, dict[str, Any]]) -> str | None:
    """How to read the timed backbone's speedup against uniform depth: inside paper B's
    regime, at its edge or outside it (paper_b.Backbone.regime: a backbone that does not
    need its depth leaves a per-token policy little to save). None: the timed cell has no
    convergence metrics in this run."""
    if bench["cell"] not in conv:
        return None
    timed = Backbone(bench["cell"], conv[bench["cell"]])
    return (f"**Regime:** {timed.depth_use}. The speedup against uniform depth is read "
            f"{timed.regime()}"
            + (": a backbone that does not need its depth leaves a per-token policy little "
               "to save over a shallower uniform depth." if timed.outside() else "."))


BENCH_MODES = ("scoring", "generation_batch1", "generation_batched")


def speedup_table(bench: dict[str, Any]) -> pd.DataFrame:
    """A row per benchmark mode and policy: mean loops, realized, FLOP and measured
    speedup against the baseline depth, and realized and FLOP speedup against depth R."""
    base = bench["baseline_depth"]
    rows = []
    for mode in BENCH_MODES:
        b = bench[mode]
        for policy in b["realized"]:
            rows.append({"mode": mode, "policy": policy, "mean loops": b["mean_loops"][policy],
                         f"realized vs depth {base}": b["realized"][policy],
                         f"FLOP speedup vs depth {base}": b["flop_speedup"][policy],
                         f"measured speedup vs depth {base}":
                             b.get("measured_speedup", {}).get(policy),
                         "realized vs depth R": b["realized_vs_r"][policy],
                         "FLOP speedup vs depth R": b["flop_speedup_vs_r"][policy]})
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
    line = (f"**Goal {RUNTIME_GOAL:g}x** realized against depth {base}: best {realized:.2f}x "
            f"({policy}, {mode}), {'met' if realized >= RUNTIME_GOAL else 'not met'}. ")
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
