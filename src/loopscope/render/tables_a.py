"""The tables and numbers paper A's report (reports/blind_spot.ipynb) shows, computed
from this run's outputs; the notebook displays them and draws (loopscope.render.figures).
Per-loop metrics are keyed "k1".."kK" (K: the cell's training depth)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from pandas.io.formats.style import Styler

from loopscope.base import paths
from loopscope.base.outputs import loop_order, read_metrics, read_table
from loopscope.judge.cells import cell_group, control, recipe
from loopscope.judge.paper_a import PAPER_CONTROL_NORMS, PAPER_DRIFT_NORMS
from loopscope.measure.per_loop.sweep import sweep_means
from loopscope.render.report_tables import outside_names
from loopscope.stats.intervals import Interval
from loopscope.weights.config import load_cell


def cell_table(cells: list[str]) -> pd.DataFrame:
    """A row per cell: what it varies (loss placement, readout, norm penalty, inter-loop
    norm), its group, control and recipe, training depth K and steps, and what it was measured
    on (seeds, resampling units, validation tokens), its size and training time."""
    rows = []
    for cell in cells:
        cfg = load_cell(paths.config_file(cell))
        m, t = cfg.model, cfg.train
        diag = read_metrics("diagnose", cell)
        rows.append({"cell": cell, "loss placement": t.loss, "readout": m.readout,
                     "norm penalty": t.norm_penalty, "inter-loop norm": m.inter_loop_norm,
                     "inject": m.inject,
                     "group": cell_group(cfg), "control": control(cfg) or "-",
                     "loops": m.loops, "steps": t.steps,
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


def sweep_table(cells: list[str]) -> pd.DataFrame:
    """The depth sweep past K, a row per cell and loop: the per-loop means over tokens
    (sweep.sweep_means: ce, scale, step, step_x_scale, radial), the cell's K, the
    perplexity exp(ce) and scale_prev, the scale s_k-1 the loop's angular step starts
    from (Lemma 2; none at loop 1)."""
    sweep = pd.concat([sweep_means(read_table("sweep", c)).reset_index().assign(
        cell=c, K=load_cell(paths.config_file(c)).model.loops) for c in cells],
        ignore_index=True)
    sweep["ppl"] = np.exp(sweep["ce"])
    sweep["scale_prev"] = sweep.groupby("cell")["scale"].shift(1)
    return sweep


def later_loops(sweep: pd.DataFrame) -> pd.DataFrame:
    """The sweep's loops 2 on: those whose angular step starts from a loop's state
    (Lemma 2's plot; loop 1 starts from H_0)."""
    return sweep[sweep["loop"] >= 2]


def norm_ccdfs(cells: list[str]) -> dict[str, pd.DataFrame]:
    """Each cell's norm_ccdf of its per-token final-loop norms (tables/diagnose, every
    seed's tokens)."""
    out = {}
    for c in cells:
        tokens = read_table("diagnose", c)
        out[c] = norm_ccdf(tokens[f"norm_{load_cell(paths.config_file(c)).model.loops}"]
                           .to_numpy())
    return out


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
    """Paper A's final-loop norms beside each cell of cell_table (its group, control and
    loss placement): the drifting per-loop normed cell's and the controls' ("-" for a
    cell the paper gives no norm for, stable injection among them: it is not the
    paper's)."""
    def paper(row: pd.Series) -> str:
        if row["loss placement"] != "per_loop" or "stable" in row.get("control", ""):
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


def intro(cells: pd.DataFrame, sweep: pd.DataFrame) -> str:
    """The sentence above the cell table: how many cells, the depths they trained at
    and the depth the sweep reached."""
    trained, swept = depths(cells, sweep)
    return (f"**{len(cells)} cell{'' if len(cells) == 1 else 's'}**, trained at K = {trained} "
            f"loops and swept to {swept}; "
            "the paper B backbones train at a sampled depth and are shown for comparison "
            "(no paper A claim uses them).")


def final_norms_view(per_loop: pd.DataFrame, cells: pd.DataFrame) -> Styler:
    """final_loop_norms of each cell at its own K beside paper A's norms (paper_norms),
    3 significant digits."""
    return (final_loop_norms(per_loop, cells["loops"]).join(paper_norms(cells))
            .style.format("{:.3g}", subset=list(NORM_STATS), na_rep="-"))


def recalibration_cells(cells: list[str]) -> list[str]:
    """The cells recalibrated (recalibrate.cells: metrics/recalibrate/<cell>.json), then
    the outside models of tables/claims.json (each is recalibrated)."""
    names = [*cells, *outside_names()]
    return [c for c in names if paths.metrics_file("recalibrate", c).is_file()]


def _recovered(raw: dict | None) -> str:
    if raw is None:
        return "-"
    iv = Interval.of(raw)
    return f"{iv.value:.4f} [{iv.lo:.4f}, {iv.hi:.4f}]"


def _share(raw: dict | None) -> str:
    if raw is None:
        return "no gap"
    iv = Interval.of(raw)
    return f"{iv.value:.0%} [{iv.lo:.0%}, {iv.hi:.0%}]"


def recalibration_rows(cells: list[str]) -> pd.DataFrame:
    """A row per recalibrated cell, run (pooled, then each seed) and loop: the mean CE as
    trained, with the temperature and with the affine readout (NaN: none fitted there),
    the gap to depth R and what each recovers, with their intervals as numbers."""
    rows = []
    for cell in recalibration_cells(cells):
        m = read_metrics("recalibrate", cell)
        seeds = m.get("per_seed", {})
        runs = [(f"pooled ({len(seeds)} seeds)" if seeds else "one seed", m), *seeds.items()]
        for run, q in runs:
            for loop, row in q["loops"].items():
                rows.append({
                    "cell": cell, "run": run, "loop": int(loop), "R": q["r"],
                    "CE": row["ce"], "CE temperature": row["ce_temperature"],
                    "CE affine": row.get("ce_affine", np.nan), "gap": row["gap"],
                    "T": float(np.mean(row["temperatures"])),
                    "temperature": row["temperature"], "affine": row.get("affine")})
    return pd.DataFrame(rows)


def recalibration_table(rows: pd.DataFrame) -> pd.DataFrame:
    """recalibration_rows for reading: the gap and the recoveries in nats with their
    intervals, and the share of the gap ("no gap" where the gap's interval reaches 0)."""
    if rows.empty:
        return rows
    out = rows[["cell", "run", "loop", "CE", "T"]].copy()
    out["gap to R (nats)"] = rows["gap"].map(_recovered)
    for name in ("temperature", "affine"):
        out[f"{name} recovers (nats)"] = rows[name].map(
            lambda r: _recovered(r["nats"]) if r else "-")
        out[f"{name} share of gap"] = rows[name].map(
            lambda r: _share(r["share"]) if r else "-")
    return out.set_index(["cell", "run", "loop"])


def recalibration_view(rows: pd.DataFrame) -> Styler | pd.DataFrame:
    """recalibration_table styled for the report (CE and T to 4 digits)."""
    table = recalibration_table(rows)
    return table if table.empty else table.style.format("{:.4f}", subset=["CE", "T"])


def recalibration_line(cells: list[str]) -> str:
    """What the recalibration table measures, with the fits' sizes, in words."""
    names = recalibration_cells(cells)
    if not names:
        return "No cell was recalibrated (`recalibrate.cells`)."
    m = read_metrics("recalibrate", names[0])
    return (f"**Readout recalibration** (Depth Control Protocol, arXiv 2609.19934), on "
            f"{', '.join(names)}: at each loop r <= R, the CE of the loop's readout as "
            "trained, with a fitted temperature (every loop) and with a fitted affine "
            "readout (the state mapped to h + hW^T + b before the readout, its temperature "
            "refitted, at the loops `recalibrate.affine_at` names), the model frozen. The "
            f"extract's windows' {m['units']} units are dealt into {m['folds']} folds; each "
            f"fold is scored by the fits on the others (at least {m['fit_tokens']:,} tokens "
            f"fitted, {m['scored_tokens']:,} scored per seed; the affine map's ridge "
            f"{m['ridge']:g}, {m['iterations']} L-BFGS iterations). What a recalibration "
            "recovers was in the state, unread: the share is read only where the gap to "
            "depth R is clearly above zero (its interval excludes 0). The paper reports, "
            "for Huginn at r = 1 of 32 (a 1.717-nat gap), 0.5% by a temperature and 5.8% by "
            "an affine readout. Intervals: 95%, units resampled (and seeds, pooled). An "
            "extension: no claim row reads it.")
