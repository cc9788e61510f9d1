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
