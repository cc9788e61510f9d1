"""The helpers every figure of the report notebooks shares, so that every figure reads
the same way: `cell_palette` (one distinct colour per cell), `loop_axis` (a log axis of
loop counts labelled 1, 2, 4, 8, ... instead of crowded minor labels) and `finish`,
which every plotting cell calls and which fails the report if two tick labels on one
axis overlap (`overlapping_tick_labels`). A figure comes back as `Drawn`, the figure
with its alt text, and `show` displays it; the forest plot and the specification curve
every report shows are here, paper A's own figures in loopscope.render.figures_a and
paper B's in loopscope.render.figures_b. Per-loop metrics are drawn in loop order
through loopscope.base.outputs.loop_order; what the figures draw is computed in
loopscope.render.report_tables (tables_a, tables_b).
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from IPython.display import Image, display
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text
from matplotlib.ticker import (
    FuncFormatter,
    LogFormatterSciNotation,
    LogLocator,
    MaxNLocator,
    NullFormatter,
    NullLocator,
)


def cell_palette(cells: Iterable[str]) -> dict[str, tuple[float, float, float]]:
    """One colour per cell, none repeated up to 20 cells: tab10 first (what seaborn
    users expect), then tab20b's dark navy, olive, gold, red and plum, then their next
    shades. tab10 alone repeats after ten cells, so a run of fourteen gave two cells one
    colour the legend could not tell apart; tab20's light shades would tell them apart
    but draw the last cells (paper B's backbones, as params.yaml lists them) pale."""
    tab10, tab20b = colormaps["tab10"], colormaps["tab20b"]
    colours = ([tab10(i)[:3] for i in range(10)] + [tab20b(i)[:3] for i in range(0, 20, 4)]
               + [tab20b(i)[:3] for i in range(1, 20, 4)])
    cells = list(cells)
    if len(cells) > len(colours):
        raise ValueError(f"{len(cells)} cells: more than the {len(colours)} distinct colours "
                         "a legend can tell apart; split the figure.")
    return dict(zip(cells, colours, strict=False))


def loop_axis(ax: Axes, axis: str = "x") -> None:
    """Make `axis` of ax a log axis of loop counts (depth, loop index): base 2, labelled
    1, 2, 4, 8, 16, 32 as plain integers, no minor labels.

    Loop counts are powers of two in this project (R = 4, 8; sweeps to 4R), and
    matplotlib's default base-10 log axis over 2..32 labels its minor ticks
    2x10^0, 3x10^0, ..., whose labels collide."""
    which: Axis = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=2)
    which.set_major_locator(LogLocator(base=2))
    which.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    which.set_minor_locator(NullLocator())
    which.set_minor_formatter(NullFormatter())


class TickLabelOverlap(ValueError):
    """Two visible tick labels on one axis of a report figure overlap."""


def _visible_tick_labels(axis: Axis) -> list[Text]:
    """The tick labels drawn on axis: major and minor, both sides, with text, at a
    tick inside the view interval (matplotlib keeps labels for ticks outside it, which
    it does not draw)."""
    lo, hi = sorted(axis.get_view_interval())
    eps = 1e-9 * (hi - lo)
    out = []
    for locs, ticks in ((axis.get_majorticklocs(), axis.get_major_ticks),
                        (axis.get_minorticklocs(), axis.get_minor_ticks)):
        for loc, tick in zip(locs, ticks(len(locs)), strict=True):
            if not lo - eps <= loc <= hi + eps:
                continue
            out += [label for label in (tick.label1, tick.label2)
                    if label.get_visible() and label.get_text().strip()]
    return out


def _label_corners(label: Text) -> np.ndarray:
    """The four corners (pixels) of a label's rotated text box.

    get_window_extent is the axis-aligned box around the rotated text: for labels
    rotated 45 degrees neighbouring boxes overlap although the text does not, so the
    check uses the rotated box itself: its size unrotated, its centre (the centre of
    the axis-aligned box, whatever the alignment) and its angle."""
    angle = label.get_rotation()
    centre = np.asarray(label.get_window_extent().corners()).mean(axis=0)
    label.set_rotation(0)
    try:
        flat = label.get_window_extent()
    finally:
        label.set_rotation(angle)
    w, h = flat.width / 2, flat.height / 2
    t = math.radians(angle)
    rot = np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])
    box = np.array([[-w, -h], [w, -h], [w, h], [-w, h]])
    return box @ rot.T + centre


def _boxes_overlap(a: np.ndarray, b: np.ndarray, tolerance_px: float) -> bool:
    """Whether two rectangles (4 corners each) overlap by more than tolerance_px on
    every one of their edge normals (the separating axis test: rectangles that do not
    overlap have a gap on one of them)."""
    for poly in (a, b):
        for i in range(2):
            edge = poly[i + 1] - poly[i]
            norm = np.hypot(*edge)
            if norm == 0:
                continue
            n = np.array([-edge[1], edge[0]]) / norm
            pa, pb = a @ n, b @ n
            if min(pa.max(), pb.max()) - max(pa.min(), pb.min()) <= tolerance_px:
                return False
    return True


def _shown(label: Text) -> str:
    """A tick label's text as a reader sees it: matplotlib writes log labels as
    mathtext, "$\\mathdefault{3\\times10^{0}}$" for 3x10^0."""
    text = label.get_text()
    inner = re.fullmatch(r"\$\\mathdefault\{(.*)\}\$", text)
    if inner is None:
        return text
    return re.sub(r"\^\{([^}]*)\}", r"^\1", inner.group(1).replace("\\times", "x"))


def _axis_overlaps(axis: Axis, tolerance_px: float) -> list[tuple[Text, Text]]:
    """The pairs of visible tick labels of one axis whose rendered text boxes overlap
    (the figure drawn already)."""
    labels = _visible_tick_labels(axis)
    boxes = [_label_corners(label) for label in labels]
    return [(labels[j], labels[k]) for j in range(len(labels))
            for k in range(j + 1, len(labels))
            if _boxes_overlap(boxes[j], boxes[k], tolerance_px)]


def thin_tick_labels(fig: Figure, tolerance_px: float = 0.5) -> None:
    """Where the automatic ticks of an axis get labels that overlap, use fewer ticks.

    Which axes crowd depends on the data, not on the report's code: matplotlib labels
    the minor ticks of a log axis that spans about a decade or less (4x10^-1,
    6x10^-1, ...), and a linear axis of large numbers (tokens/s of a small run) gets
    long labels at its usual spacing. A log axis then labels its decades only, or 1, 2
    and 5 of each where it spans less than two; a linear one halves its ticks until they
    fit. Ticks a report placed itself (categories, loop_axis) are left as they are, for
    check_tick_labels to report."""
    fig.draw_without_rendering()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if not _axis_overlaps(axis, tolerance_px):
                continue
            if axis.get_scale() == "log":
                axis.set_minor_formatter(NullFormatter())
                lo, hi = sorted(axis.get_view_interval())
                if lo > 0 and math.log10(hi / lo) < 2:
                    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
                    axis.set_major_formatter(LogFormatterSciNotation(labelOnlyBase=False))
                fig.draw_without_rendering()
                continue
            if not isinstance(axis.get_major_locator(), MaxNLocator):
                continue
            n = len(_visible_tick_labels(axis))
            while n > 2 and _axis_overlaps(axis, tolerance_px):
                n = max(2, n // 2)
                axis.set_major_locator(MaxNLocator(nbins=n, steps=[1, 2, 2.5, 5, 10]))
                fig.draw_without_rendering()


def overlapping_tick_labels(fig: Figure, tolerance_px: float = 0.5
                            ) -> list[tuple[str, str, str]]:
    """Every pair of visible tick labels on one axis of fig whose rendered text boxes
    overlap (by more than tolerance_px): (which axis, one label, the other).

    Draws the figure first (as fig.canvas.draw() would, with whatever canvas fig has):
    tick labels get their text and size only when drawn."""
    fig.draw_without_rendering()
    found = []
    for i, ax in enumerate(fig.axes):
        name = ax.get_title() or ax.get_label() or f"axes {i}"
        for letter, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            found += [(f"{name!r} {letter} axis", _shown(a), _shown(b))
                      for a, b in _axis_overlaps(axis, tolerance_px)]
    return found


def check_tick_labels(fig: Figure) -> None:
    """Raise TickLabelOverlap naming each pair of overlapping tick labels in fig.

    A report is read, not inspected: labels drawn over each other are unreadable, and
    nobody looks at every figure of every run, so the report fails instead."""
    found = overlapping_tick_labels(fig)
    if found:
        pairs = "; ".join(f"{where}: {a!r} and {b!r}" for where, a, b in found)
        raise TickLabelOverlap(f"tick labels overlap: {pairs}. Thin the ticks (e.g. "
                               "loopscope.render.figures.loop_axis for loop counts), rotate or "
                               "shorten the labels, or widen the figure.")


def finish(fig: Figure, layout: bool = True) -> Figure:
    """The last step of every report figure: tight layout (legends placed outside the
    axes included), thin_tick_labels, then check_tick_labels. Returns fig, for plt.show()."""
    if layout:
        fig.tight_layout()
    thin_tick_labels(fig)
    check_tick_labels(fig)
    return fig


@dataclass(frozen=True)
class Drawn:
    """A finished report figure and its alt text: what it shows, in words, for a reader
    who cannot see it (the HTML page fails without one: loopscope.render.report)."""

    fig: Figure
    alt: str


def done(fig: Figure, alt: str, legend: Axes | None = None) -> Drawn:
    """A finished figure with its alt text; legend: the axes whose legend goes outside
    them on the right (where a legend of many cells hides no line)."""
    if legend is not None:
        legend.legend(loc="upper left", bbox_to_anchor=(1.02, 1))
    finish(fig)
    return Drawn(fig, alt)


def setup() -> None:
    """The reports' plotting theme (seaborn's whitegrid), set once per notebook."""
    sns.set_theme(style="whitegrid", context="notebook")


def show(drawn: Drawn) -> None:
    """Display a figure in the executing notebook as a PNG carrying its alt text, and
    close it (matplotlib's inline display would show it a second time, without one)."""
    buffer = io.BytesIO()
    drawn.fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(drawn.fig)
    display(Image(data=buffer.getvalue(), format="png", alt=drawn.alt))


# The verdicts' colours (Okabe and Ito's palette, which colour-blind readers tell apart)
# and, as a second cue, their markers
VERDICT_COLOURS = {"holds": "#0072B2", "contradicted": "#D55E00", "inconclusive": "#999999",
                   "not shown": "#CCCCCC"}
VERDICT_MARKERS = {"holds": "o", "contradicted": "X", "inconclusive": "D", "not shown": "."}
BAND_COLOUR = "#dbe9f6"  # where a claim holds
UNIT_ORDER = ("nats", "ratio", "log10 ratio", "loops", "share")  # panels first in this order


def _log_scale(sub: pd.DataFrame) -> bool:
    """A panel of ratios is drawn on a log axis, where every interval and paper's number
    is > 0 (a band reaching 0 or below is shaded to the axis' edge)."""
    numbers = pd.concat([sub["lo"], sub["hi"], sub["value"], sub["paper"]])
    numbers = numbers[numbers.map(math.isfinite)]
    return "ratio" in str(sub["unit"].iloc[0]).split()[:1] and bool((numbers > 0).all())


def _limits(sub: pd.DataFrame, log: bool) -> tuple[float, float]:
    """The x range of a panel: every interval, paper's number and finite band edge, padded."""
    numbers = pd.concat([sub["lo"], sub["hi"], sub["paper"], sub["band_lo"], sub["band_hi"]])
    numbers = numbers[numbers.map(math.isfinite) & ((numbers > 0) | (not log))]
    lo, hi = float(numbers.min()), float(numbers.max())
    if log:
        pad = max(math.log10(hi / lo), 0.2) * 0.08
        return lo / 10 ** pad, hi * 10 ** pad
    pad = (max(hi - lo, abs(hi), abs(lo)) or 1.0) * 0.08
    return lo - pad, hi + pad


def _forest_panel(ax: Axes, sub: pd.DataFrame, unit: str, log: bool) -> None:
    """One unit's rows: the band shaded, the interval and its estimate by verdict (hollow
    where fragile), the paper's number as a black bar."""
    if log:
        ax.set_xscale("log")
    left, right = _limits(sub, log)
    n = len(sub)
    for i, r in enumerate(sub.itertuples()):
        y = n - 1 - i
        lo_band, hi_band = max(r.band_lo, left), min(r.band_hi, right)
        if lo_band < hi_band:
            ax.fill_between([lo_band, hi_band], y - 0.4, y + 0.4, color=BAND_COLOUR, lw=0,
                            zorder=0)
        colour = VERDICT_COLOURS[r.verdict]
        ax.plot([r.lo, r.hi], [y, y], color=colour, lw=2, zorder=2)
        ax.plot([r.value], [y], marker=VERDICT_MARKERS[r.verdict], ms=8, color=colour,
                mfc=colour if r.robust else "white", mew=1.5, ls="none", zorder=3)
        if math.isfinite(r.paper):
            ax.plot([r.paper], [y], marker="|", ms=16, mew=2.5, color="black", zorder=4)
    labels = [r.row + (f" at {100 * r.level:.3g}%" if r.level > 0.95 + 1e-9 else "")
              for r in sub.itertuples()]
    ax.set_yticks(range(n - 1, -1, -1), labels, fontsize=8)
    ax.set(xlim=(left, right), ylim=(-0.6, n - 0.4),
           xlabel=unit + (" (log axis)" if log else ""))
    ax.grid(axis="y", visible=False)


def forest(rows: pd.DataFrame, title: str) -> Drawn:
    """The forest plot of a paper's claims (report_tables.forest_rows), each on its
    statistic's own scale: a panel per unit (ratios on a log axis), a line per claim, its
    interval at the level it was judged (the label names a Bonferroni level), the band
    where the claim holds shaded, the paper's number as a black bar where it gives one;
    colour and marker by the counted verdict, hollow where the row is fragile."""
    units = forest_units(rows)
    if not units:
        fig, ax = plt.subplots(figsize=(10, 1.5))
        ax.set_axis_off()
        ax.set_title(f"{title}: no claim judged on an interval")
        return Drawn(fig, forest_alt(rows, title))
    parts = [rows[rows["unit"] == u] for u in units]
    logs = [_log_scale(sub) for sub in parts]
    fig, axes = plt.subplots(len(units), 1, squeeze=False,
                             figsize=(10, 0.9 * len(units) + 0.32 * len(rows) + 0.6),
                             gridspec_kw={"height_ratios": [len(p) + 1.2 for p in parts]})
    for ax, unit, sub, log in zip(axes[:, 0], units, parts, logs, strict=True):
        _forest_panel(ax, sub, unit, log)
    axes[0, 0].set_title(title)
    present = [v for v in VERDICT_COLOURS if v in set(rows["verdict"])]
    axes[0, 0].legend(
        handles=[Line2D([], [], color=VERDICT_COLOURS[v], marker=VERDICT_MARKERS[v], lw=2,
                        label=v) for v in present]
        + [Line2D([], [], ls="none", marker="o", color="black", mfc="white", label="fragile"),
           Line2D([], [], ls="none", marker="|", ms=12, mew=2.5, color="black",
                  label="the paper's number"),
           Patch(color=BAND_COLOUR, label="where the claim holds")],
        loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
    finish(fig)
    return Drawn(fig, forest_alt(rows, title))


def _rows(n: int) -> str:
    return f"{n} row" + ("" if n == 1 else "s")


def forest_units(rows: pd.DataFrame) -> list[str]:
    """The forest plot's panels: the rows' units, the known ones in UNIT_ORDER first."""
    found = dict.fromkeys(rows["unit"]) if len(rows) else {}
    return sorted(found, key=lambda u: (UNIT_ORDER.index(u) if u in UNIT_ORDER
                                        else len(UNIT_ORDER), u))


def forest_alt(rows: pd.DataFrame, title: str) -> str:
    """The forest plot in words (its alt text, and the front page's): its panels, what
    each line is, the verdicts' colours and markers and how many have each."""
    units = forest_units(rows)
    if not units:
        return (f"Forest plot, {title}: no claim of this run was judged on an interval, "
                "so none is drawn.")
    parts = [rows[rows["unit"] == u] for u in units]
    logs = [_log_scale(sub) for sub in parts]
    panels = "; ".join(f"{u}: {_rows(len(p))}"
                       + (", log axis" if log else "")
                       for u, p, log in zip(units, parts, logs, strict=True))
    words = {"holds": "blue circle", "contradicted": "orange cross",
             "inconclusive": "grey diamond", "not shown": "light grey dot"}
    counts = rows["verdict"].value_counts()
    verdicts = ", ".join(f"{counts[v]} {v} ({words[v]})" for v in VERDICT_COLOURS
                         if v in counts)
    bonferroni = int((rows["level"] > 0.95 + 1e-9).sum())
    return (f"Forest plot, {title}, each claim on its statistic's own scale, a panel per "
            f"unit ({panels}). Each line is the interval the claim's verdict turned on, at "
            f"the level it was judged (95%; {bonferroni} at a Bonferroni level, named in "
            "the label), the band where the claim holds shaded, the paper's number a "
            f"black bar ({_rows(int(rows['paper'].map(math.isfinite).sum()))}). Colour and "
            f"marker by verdict: {verdicts}; {int((~rows['robust']).sum())} fragile "
            "(hollow marker).")


def ordered(values: Iterable[str]) -> list[str]:
    """A parameter's values for an axis: numeric ones in increasing order; values with
    units (saturation's "0.01 nats", "2% of the gain") in the order they were tried."""
    distinct = list(dict.fromkeys(values))
    try:
        return sorted(distinct, key=float)
    except ValueError:
        return distinct


def specification(rows: pd.DataFrame, title: str) -> Drawn | None:
    """Verdict against parameter for the fragile rows (report_tables.specification_rows):
    a panel per parameter, a line of dots per row, one dot per value tried, coloured by
    the verdict there; the value judged at ringed. None: no fragile row."""
    if not len(rows):
        return None
    params = list(dict.fromkeys(rows["parameter"]))
    cols = min(3, len(params))  # panels wrap, three to a line
    lines = math.ceil(len(params) / cols)
    tall = max(rows[rows["parameter"] == p]["row"].nunique() for p in params)
    fig, axes = plt.subplots(lines, cols, figsize=(5.2 * cols, lines * (1.6 + 0.4 * tall)),
                             squeeze=False)
    for ax in axes.flat[len(params):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, params, strict=False):
        sub = rows[rows["parameter"] == name]
        values = ordered(sub["value"])
        names = list(dict.fromkeys(sub["row"]))
        for r in sub.itertuples():
            x, y = values.index(r.value), names.index(r.row)
            ax.scatter([x], [y], s=80, color=VERDICT_COLOURS[r.verdict],
                       marker=VERDICT_MARKERS[r.verdict],
                       edgecolors="black" if r.judged else "none", linewidths=1.5)
        long = max(len(v) for v in values) > 6  # values with units: slanted, to fit
        ax.set_xticks(range(len(values)), values, rotation=35 if long else 0,
                      ha="right" if long else "center", fontsize=8 if long else None)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.set(xlabel=name, ylim=(-0.5, len(names) - 0.5))
    fig.suptitle(title)
    finish(fig)
    alt = (f"{title}: for each fragile row, its verdict at every value tried of "
           f"the parameters that turn it ({', '.join(params)}); the value judged at is "
           "ringed.")
    return Drawn(fig, alt)
