"""Paper A's report figures (reports/blind_spot.ipynb), drawn from the tables of
loopscope.render.tables_a; each returns the figure with its alt text (figures.Drawn)."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from loopscope.render.figures import Drawn, done

Palette = Mapping[str, tuple[float, float, float]]


def _top(frame: pd.DataFrame, column: str) -> str:
    """The cell with the largest value of column, with it: what an alt text leads with."""
    row = frame.loc[frame[column].idxmax()]
    return f"{row['cell']} at {row[column]:,.3g}"


def norms(per_loop: pd.DataFrame, sweep: pd.DataFrame, palette: Palette,
          trained: list[int]) -> Drawn:
    """The mean hidden-state norm per loop k <= K, and the RMS scale over the depth
    sweep, a line per cell (log scale)."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    sns.lineplot(data=per_loop, x="loop", y="mean", hue="cell", palette=palette, marker="o",
                 ax=axes[0])
    axes[0].set(yscale="log", xlabel="loop k", ylabel="mean ||H_k||",
                title="mean hidden-state norm per loop", xticks=range(1, max(trained) + 1))
    axes[0].get_legend().remove()
    sns.lineplot(data=sweep, x="loop", y="scale", hue="cell", palette=palette, ax=axes[1])
    axes[1].set(yscale="log", xlabel="loop k (sweep)", ylabel="mean RMS scale s_k",
                title="scale over the depth sweep")
    alt = (f"Two log-scale line plots, a line per cell ({per_loop['cell'].nunique()} "
           "cells): the mean hidden-state norm at each trained loop (largest: "
           f"{_top(per_loop, 'mean')}) and the RMS scale over the depth sweep to "
           f"loop {int(sweep['loop'].max())} (largest: {_top(sweep, 'scale')}).")
    return done(fig, alt, legend=axes[1])


def ccdf(ccdfs: Mapping[str, pd.DataFrame], palette: Palette) -> Drawn:
    """The CCDF of per-token final-loop norms, raw and over each cell's median."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for cell, c in ccdfs.items():
        axes[0].plot(c["norm"], c["share"], label=cell, color=palette[cell])
        axes[1].plot(c["over_median"], c["share"], label=cell, color=palette[cell])
    axes[0].set(xscale="log", yscale="log", xlabel="final-loop ||H_K|| per token",
                ylabel="share of tokens with a larger norm", title="token-norm CCDF, final loop")
    axes[1].set(xscale="log", yscale="log", xlabel="||H_K|| / median",
                title="the same, / median")
    widest = max(ccdfs, key=lambda c: ccdfs[c]["over_median"].max())
    alt = ("Log-log CCDFs of each cell's per-token final-loop norms, raw and "
           "divided by the cell's median (a heavy tail stretches the second to the "
           f"right; the longest: {widest}, up to "
           f"{ccdfs[widest]['over_median'].max():,.3g} x its median).")
    return done(fig, alt, legend=axes[1])


def radial(per_loop: pd.DataFrame, palette: Palette) -> Drawn:
    """The radial gradient fraction per loop: per token (solid), per batch as paper A
    measures it (dashed) and RMSNorm's eps floor (dotted), a colour per cell."""
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for cell, d in per_loop.groupby("cell", sort=False):
        ax.plot(d["loop"], d["radial_fraction_token"], marker="o", color=palette[cell],
                label=cell)
        ax.plot(d["loop"], d["radial_fraction"], linestyle="--", color=palette[cell])
        ax.plot(d["loop"], d["radial_floor"], linestyle=":", color=palette[cell])
    ax.set(yscale="log", xlabel="loop k", ylabel="radial gradient fraction",
           title="radial fraction: per token (solid), per batch (dashed), eps floor (dotted)")
    # Colour names the cell, line style the measurement: one legend of cells and one of
    # styles label every line (three single entries per cell would not be read).
    cells = ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), title="cell")
    ax.add_artist(cells)
    cells.set_clip_on(False)  # add_artist clips to the axes: it would vanish outside them
    ax.legend(handles=[plt.Line2D([], [], color="black", marker="o",
                                  label="per token (mean |cos|)"),
                       plt.Line2D([], [], color="black", ls="--", label="per batch (paper A)"),
                       plt.Line2D([], [], color="black", ls=":", label="RMSNorm eps floor")],
              loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3)
    alt = ("Log-scale radial gradient fraction per loop for each cell, per token "
           "(solid), per batch as paper A measures it (dashed) and RMSNorm's eps "
           "floor (dotted); largest per-token fraction: "
           f"{_top(per_loop, 'radial_fraction_token')}.")
    return done(fig, alt)


def lemma2(later: pd.DataFrame, palette: Palette) -> Drawn:
    """Lemma 2: the angular step against the scale it starts from (loops 2 on), and the
    step times the scale per loop, a line per cell."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    sns.lineplot(data=later, x="scale_prev", y="step", hue="cell", palette=palette, sort=False,
                 ax=axes[0])
    axes[0].set(xscale="log", yscale="log", xlabel="mean s_k-1", ylabel="mean ||u_k - u_k-1||",
                title="angular step vs scale, loops 2..L")
    axes[0].get_legend().remove()
    sns.lineplot(data=later, x="loop", y="step_x_scale", hue="cell", palette=palette,
                 ax=axes[1])
    axes[1].set(yscale="log", xlabel="loop k (sweep)", ylabel="mean step_k x s_k-1",
                title="angular step x scale per loop")
    alt = ("Two log-log plots over the depth sweep, a line per cell: the mean "
           "angular step of each loop against the mean scale it starts from (a "
           "1/s law is a line of slope -1), and the step times that scale per "
           "loop (flat under the law).")
    return done(fig, alt, legend=axes[1])


def perplexity(sweep: pd.DataFrame, per_loop: pd.DataFrame, palette: Palette) -> Drawn:
    """Perplexity against inference depth over the sweep, and against inference
    throughput at each trained depth, a line per cell."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    sns.lineplot(data=sweep, x="loop", y="ppl", hue="cell", palette=palette, ax=axes[0])
    axes[0].set(yscale="log", xlabel="inference depth k", ylabel="validation perplexity",
                title="perplexity vs depth (sweep)")
    axes[0].get_legend().remove()
    sns.lineplot(data=per_loop, x="tokens/s", y="ppl", hue="cell", palette=palette,
                 marker="o", sort=False, ax=axes[1])
    axes[1].set(yscale="log", xlabel="inference tokens/s (k = 1 rightmost)",
                ylabel="validation perplexity", title="perplexity / throughput frontier")
    best = per_loop.loc[per_loop["ppl"].idxmin()]
    alt = ("Validation perplexity against inference depth over the sweep, and "
           "against inference tokens per second at each trained depth, a line per "
           f"cell; the lowest perplexity read at a trained depth: {best['cell']} "
           f"at loop {int(best['loop'])}, {best['ppl']:.4g}.")
    return done(fig, alt, legend=axes[1])


def clamp(per_loop: pd.DataFrame, modes: list[str]) -> Drawn:
    """The change in CE under each clamp mode, a bar per cell and loop."""
    fig, axes = plt.subplots(1, len(modes), figsize=(13, 4.5), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        sns.barplot(data=per_loop, x="cell", y=mode, hue="loop", legend="full", ax=ax)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set(xlabel="", ylabel="CE with clamp - CE without (nats)", title=mode)
        ax.tick_params(axis="x", rotation=45)
        plt.setp(ax.get_xticklabels(), ha="right", rotation_mode="anchor")
    alt = (f"Bar charts, one per clamp mode ({', '.join(modes)}): the change in "
           "validation CE when the clamp is applied, a bar per cell and loop "
           "(above 0: the clamp hurts).")
    return done(fig, alt)


def recalibration(rows: pd.DataFrame) -> Drawn:
    """Per recalibrated cell (pooled runs), the CE at each loop as trained, with the
    fitted temperature and with the affine readout, against the loop (recalibrate.cells
    names at least one)."""
    pooled = rows[rows["run"].str.startswith(("pooled", "one"))]
    cells = list(dict.fromkeys(pooled["cell"]))
    fig, axes = plt.subplots(1, len(cells), figsize=(3.4 * len(cells) + 1, 4), squeeze=False)
    for ax, cell in zip(axes[0], cells, strict=True):
        c = pooled[pooled["cell"] == cell]
        for column, style, label in (("CE", "o-", "as trained"),
                                     ("CE temperature", "s--", "temperature"),
                                     ("CE affine", "D", "affine")):
            ax.plot(c["loop"], c[column], style, label=label)
        ax.set(xlabel="loop r", ylabel="CE (nats, out of fold)", title=cell)
        ax.legend(fontsize=8)
    alt = (f"Line charts, one per recalibrated cell ({', '.join(cells)}): validation CE at "
           "each loop through the readout as trained, with a fitted temperature, and with a "
           "fitted affine readout (points where fitted); lower is better.")
    return done(fig, alt)
