"""Paper B's report figures (reports/convergence.ipynb), drawn from the tables of
loopscope.render.tables_b; each returns the figure with its alt text (figures.Drawn)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from loopscope.render.figures import Drawn, done, loop_axis

Palette = Mapping[str, tuple[float, float, float]]


def elasticity(curves: pd.DataFrame, palette: Palette) -> Drawn:
    """Validation CE against uniform depth, a line per backbone, R dotted."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for c, d in curves.groupby("backbone", sort=False):
        r = int(d["r"].iloc[0])
        ax.plot(d["depth"], d["ce"], marker="o", ms=3, label=f"{c} (R = {r})",
                color=palette[c])
        ax.axvline(r, color=palette[c], ls=":", lw=1)
    loop_axis(ax)
    ax.set(xlabel="uniform depth r (log)", ylabel="validation CE (nats)",
           title="elasticity: CE vs uniform depth (dotted: R)")
    ax.legend()
    alt = ("Validation cross-entropy against uniform depth on a log axis, a line "
           f"per backbone ({', '.join(dict.fromkeys(curves['backbone']))}), each "
           "backbone's R dotted.")
    return done(fig, alt)


def changes(curves: pd.DataFrame, palette: Palette) -> Drawn:
    """Mean KL between successive loops' outputs and mean relative state change per
    loop, a line per cell, backbones bold."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for c, d in curves.groupby("cell", sort=False):
        bold = bool(d["backbone"].iloc[0])
        style = {"color": palette[c], "lw": 2.2 if bold else 1, "alpha": 1 if bold else 0.6}
        axes[0].plot(d["loop"], d["kl"], label=c, **style)
        axes[1].plot(d["loop"], d["state_change"], label=c, **style)
    for ax in axes:
        loop_axis(ax)  # loops 1, 2, 4, ...: default log labels 2x10^0, 3x10^0, ... collide
    for ax, (y, title) in zip(axes, (("mean KL(p_i || p_(i-1))", "successive output "
                                       "distributions"), ("mean relative state change",
                                                          "state change per loop")),
                              strict=True):
        ax.set(yscale="log", xlabel="loop i", ylabel=y, title=title)
    backbones = curves.loc[curves["backbone"], "cell"].unique()
    alt = (f"Two log-log plots per loop, a line per cell (the backbones {', '.join(backbones)} "
           "bold): the mean KL divergence between successive loops' output distributions, "
           "and the mean relative change of the state; a fixed point shows as lines that "
           "keep falling.")
    return done(fig, alt, legend=axes[1])


def token_loops(cell: str, tokens: pd.DataFrame, m: dict[str, Any], order: list[str],
                colour: tuple[float, float, float]) -> Drawn:
    """Histograms of the convergence loop and A1's exit loop over all tokens, and the
    convergence loop by token type."""
    r, d = m["r"], m["max_depth"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    bins = [k + 0.5 for k in range(d + 2)]  # a bin per loop 1..D + 1
    axes[0].hist([tokens["convergence_loop"], tokens["first_below_loop"]], bins=bins,
                 label=["convergence loop (stays below)", "A1 exit loop (first below)"],
                 color=[colour, "grey"], histtype="step", lw=1.5)
    axes[0].axvline(r + 0.5, color="black", ls=":")
    axes[0].set(xlabel="loop (D + 1: still moving at D)", ylabel="tokens", yscale="log",
                title=f"{cell}: all tokens (dotted: R = {r})")
    axes[0].legend()
    sns.boxplot(data=tokens, x="type", y="convergence_loop", order=order, ax=axes[1],
                showfliers=False, color=colour)
    axes[1].set(xlabel="", ylabel="convergence loop", title=f"{cell}: by token type")
    alt = (f"{cell}: histograms over {len(tokens):,} tokens of the loop each "
           "converges at and the loop A1 first exits at (R dotted), and box plots "
           f"of the convergence loop by token type ({', '.join(order)}).")
    return done(fig, alt)


def frontier(cell: str, settings: pd.DataFrame, target: float, rules: list[str]) -> Drawn:
    """Each exit rule's settings as CE against mean loops and against FLOPs per token,
    uniform depth bold, Huginn's default thresholds ringed, the matching target dashed."""
    colours = dict(zip(rules, sns.color_palette("tab10", len(rules)), strict=False))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, x in zip(axes, ["mean_loops", "flops"], strict=True):
        for rule, g in settings.groupby("rule", sort=False):
            g = g.sort_values(x)
            colour = "black" if rule == "uniform" else colours.get(rule)
            ax.plot(g[x], g["ce"], marker="o", ms=3, label=rule,
                    lw=2.5 if rule == "uniform" else 1.2, color=colour)
            if "default" in g:
                d = g[g["default"]]
                ax.scatter(d[x], d["ce"], s=70, facecolors="none", edgecolors=[colour], lw=1.5)
        ax.axhline(target, ls="--", color="grey", lw=1)
        ax.set(xlabel="mean loops per token" if x == "mean_loops" else "forward FLOPs per token",
               ylabel="validation CE (nats)", title=f"{cell}: frontier ({x})")
        ax.set_ylim(top=min(settings["ce"].max(), target + 0.3))
    extra = [plt.Line2D([], [], ls="none", marker="o", ms=8, mfc="none", mec="grey",
                        label="Huginn's default threshold"),
             plt.Line2D([], [], ls="--", color="grey", lw=1, label="CE(R) + matching margin")]
    handles, _ = axes[1].get_legend_handles_labels()
    axes[1].legend(handles=handles + extra, loc="upper left", bbox_to_anchor=(1.02, 1))
    alt = (f"{cell}: validation CE of every exit rule's settings ({', '.join(rules)}) "
           "against mean loops per token and against forward FLOPs per token, "
           f"uniform depth in black, the quality to match (CE {target:.4g}) dashed.")
    return done(fig, alt)


def saturation(curves: pd.DataFrame, palette: Palette) -> Drawn:
    """CE(r) - the best CE against depth per backbone, its useful depth dotted with its
    interval shaded and the margin its rule allows dashed."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for c, d in curves.groupby("backbone", sort=False):
        first = d.iloc[0]
        ax.plot(d["depth"], d["gap"].clip(lower=1e-4), marker="o", ms=3, color=palette[c],
                label=first["label"])  # 0 drawn at 1e-4 on the log axis
        ax.axvline(first["useful"], color=palette[c], ls=":")
        ax.axvspan(first["lo"], first["hi"], color=palette[c], alpha=0.1)
        if pd.notna(first["margin"]):
            ax.axhline(first["margin"], color=palette[c], ls="--", lw=1)
    loop_axis(ax)
    ax.set(yscale="log", xlabel="uniform depth r", ylabel="CE(r) - best CE (nats)",
           title="saturation (dashed: each backbone's margin; band: the useful depth's "
                 "interval)")
    ax.legend()
    alt = ("CE at each uniform depth above the backbone's best, log scale, a line "
           "per backbone; the useful depth (dotted, its interval shaded) is the "
           "smallest depth whose gap falls under the dashed margin: "
           + "; ".join(dict.fromkeys(curves["label"])) + ".")
    return done(fig, alt)


def exit_shares(shares: pd.DataFrame, palette: Palette) -> Drawn:
    """The share of tokens A1 exits at each loop, a line per cell."""
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for c, d in shares.groupby("cell", sort=False):
        ax.plot(d["loop"], d["share"], marker="o", ms=3, color=palette[c], label=c)
    ax.set(xlabel="exit loop", ylabel="share of tokens", yscale="log",
           title="where A1 exits, per cell")
    alt = ("The share of tokens the KL exit (A1) stops at each loop, log scale, a "
           f"line per cell ({shares['cell'].nunique()} "
           f"cell{'' if shares['cell'].nunique() == 1 else 's'}).")
    return done(fig, alt, legend=ax)


def speedup(bars: pd.DataFrame, base: int) -> Drawn:
    """Realized speedup of each policy and mode against the baseline depth and depth R,
    horizontal bars (labels read in full, one per row)."""
    settings = bars["setting"].nunique()
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.9 * settings))
    sns.barplot(data=bars, y="setting", x="x", hue="against", errorbar=None, ax=ax)
    ax.axvline(1, color="black", lw=0.8)
    ax.set(ylabel="", xlabel="realized speedup (x)",
           title=f"realized speedup against the baseline (depth {base}) and depth R")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), title="against")
    best = bars.loc[bars["x"].idxmax()]
    alt = (f"Horizontal bars: the realized wall-clock speedup of {settings} policy "
           f"and mode settings against uniform depth {base} and against depth R "
           f"(1 = no speedup); the largest, {best['x']:.2f}x, is {best['setting']} "
           f"against {best['against'].removeprefix('realized vs ')}.")
    return done(fig, alt)


def ledger(bars: pd.DataFrame) -> Drawn:
    """Where the runtime's time goes: per mode, uniform depth B and the policy as
    stacked bars of their parts, in shares of B's time."""
    modes = list(dict.fromkeys(bars["mode"]))
    parts = list(dict.fromkeys(bars["part"]))
    colours = dict(zip(parts, sns.color_palette("tab10", len(parts)), strict=False))
    fig, axes = plt.subplots(len(modes), 1, figsize=(10, 1.3 + 1.2 * len(modes)),
                             squeeze=False, sharex=True)
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        sub = bars[bars["mode"] == mode]
        runs = list(dict.fromkeys(sub["run"]))
        for y, run in enumerate(runs):
            left = 0.0
            for part in parts:
                width = float(sub[(sub["run"] == run) & (sub["part"] == part)]["share"].sum())
                ax.barh(y, width, left=left, color=colours[part],
                        label=part if (mode, y) == (modes[0], 0) else None)
                left += width
        ax.set_yticks(range(len(runs)), runs)
        ax.axvline(1, color="black", lw=0.8)
        ax.set_title(mode, fontsize=10)
    axes[-1, 0].set_xlabel("time, in shares of uniform depth B's")
    fig.legend(loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize=8)
    policy = [r for r in dict.fromkeys(bars["run"]) if not r.startswith("uniform")]
    alt = (f"Stacked bars, one panel per mode ({', '.join(modes)}): the time of uniform depth "
           f"B and of {', '.join(policy)} through the same runtime, split into loops, "
           "once-per-token work, checks, key/value handling, gathering and the rest, in "
           "shares of B's time (1: B's).")
    return done(fig, alt)


def oracle(cell: str, points: pd.DataFrame, r: int) -> Drawn:
    """Each exit rule's mean exit loop against the oracle's settle loop (tokens grouped
    by it; R + 1: settled after R), with the oracle's own exit (the diagonal, capped at
    R), and the share of tokens at each settle loop below."""
    rules = list(dict.fromkeys(points["rule"]))
    colours = dict(zip(rules, sns.color_palette("tab10", len(rules)), strict=False))
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True,
                                 gridspec_kw={"height_ratios": [3, 1]})
    loops = sorted(points["settle"].unique())
    ax.plot(loops, [min(k, r) for k in loops], color="black", lw=2.5, ls="--",
            label="the oracle (capped at R)")
    for rule, g in points.groupby("rule", sort=False):
        ax.plot(g["settle"], g["exit"], marker="o", ms=4, color=colours[rule], label=rule)
    ax.set(ylabel="mean exit loop", title=f"{cell}: exit rules against the settle-depth oracle")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1))
    shares = points.drop_duplicates("settle")
    bx.bar(shares["settle"], shares["share"], color="grey")
    bx.set(xlabel=f"oracle's settle loop ({r + 1}: after R = {r})", ylabel="share of tokens")
    bx.set_xticks(loops)
    alt = (f"{cell}: the mean exit loop of each exit rule at its matched setting "
           f"({', '.join(rules)}) for the tokens the oracle settles at loops 1 to {r} and "
           f"after, against the oracle's own exit (dashed diagonal); below, the share of "
           "tokens at each settle loop.")
    return done(fig, alt)
