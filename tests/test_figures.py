"""The report figures' helpers: a colour per cell, loop-count axes, and a check that
fails a figure whose tick labels overlap; and every notebook figure goes through it."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

from loopscope.render.figures import (
    VERDICT_COLOURS,
    VERDICT_MARKERS,
    TickLabelOverlap,
    cell_palette,
    check_tick_labels,
    finish,
    forest,
    loop_axis,
    ordered,
    overlapping_tick_labels,
    specification,
)

REPORTS = Path(__file__).resolve().parents[1] / "reports"


def crowded_log_figure() -> Figure:
    """KL per loop over loops 2..32 on matplotlib's default log axis, the report's old
    KL figure: its minor labels 2x10^0, 3x10^0, 4x10^0, ... are drawn over each other."""
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot(title="successive output distributions")
    ax.plot([2, 4, 8, 16, 32], [1e-1, 1e-3, 1e-5, 1e-6, 1e-7])
    ax.set(xscale="log", yscale="log")
    return fig


def test_the_check_catches_a_crowded_log_axis():
    fig = crowded_log_figure()
    found = overlapping_tick_labels(fig)
    where = "'successive output distributions' x axis"
    assert found and {w for w, _, _ in found} == {where}  # the y axis spans decades: fine
    assert (where, "3x10^0", "4x10^0") in found
    with pytest.raises(TickLabelOverlap, match=r"x axis: '3x10\^0' and '4x10\^0'"):
        check_tick_labels(fig)


@pytest.mark.parametrize("lo, hi", [(2, 32), (0.35, 4.5), (0.8, 0.95)])
def test_finish_thins_crowded_log_labels_whatever_the_data_range(lo, hi):
    """A log axis over a decade or less gets labelled minor ticks that collide (the
    micro pipeline's norm CCDF: 4x10^-1 over 6x10^-1): finish keeps the decades, or 1, 2
    and 5 of each, and the check then passes; a linear overlap is still an error."""
    fig = Figure(figsize=(3, 2))
    ax = fig.add_subplot()
    ax.plot([lo, hi], [1.0, 0.1])
    ax.set(xscale="log", yscale="log")
    assert finish(fig) is fig and overlapping_tick_labels(fig) == []
    assert [t for t in fig.axes[0].get_xticklabels() if t.get_text()]  # still labelled


def test_finish_thins_a_crowded_linear_axis_of_large_numbers():
    """tokens/s of a small run: 80000, 100000, ... collide at the usual spacing."""
    fig = Figure(figsize=(3, 2))
    ax = fig.add_subplot(title="frontier")
    ax.plot([80_000, 180_000], [1.0, 2.0])
    assert overlapping_tick_labels(fig)
    finish(fig)
    assert overlapping_tick_labels(fig) == []
    assert len([t for t in ax.get_xticklabels() if t.get_text()]) >= 2


def test_loop_axis_fixes_it():
    fig = crowded_log_figure()
    loop_axis(fig.axes[0])
    assert finish(fig) is fig  # no overlap: labels 2, 4, 8, 16, 32
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels() if t.get_text()]
    assert {"2", "4", "8", "16", "32"} <= set(labels)


def test_the_check_measures_rotated_labels_as_drawn():
    """Twelve long labels side by side collide; rotated 45 degrees they do not, although
    their axis-aligned boxes (get_window_extent) still overlap: the check uses the
    rotated text box, so it neither misses the first nor flags the second."""
    fig = Figure(figsize=(5, 3))
    ax = fig.add_subplot()
    ax.bar(range(12), range(12))
    ax.set_xticks(range(12), [f"perloop_cell_{i}" for i in range(12)])
    with pytest.raises(TickLabelOverlap, match="'axes 0' x axis"):
        finish(fig)
    ax.tick_params(axis="x", rotation=45)
    for label in ax.get_xticklabels():
        label.set(ha="right", rotation_mode="anchor")
    finish(fig)
    a, b = (label.get_window_extent() for label in ax.get_xticklabels()[:2])
    assert a.overlaps(b)  # what an axis-aligned check would have called a collision


def test_labels_not_drawn_are_not_checked():
    """Hidden labels, and labels of ticks outside the view (matplotlib keeps them but
    does not draw them), cannot collide with anything."""
    fig = crowded_log_figure()
    fig.axes[0].xaxis.set_tick_params(which="minor", labelbottom=False)
    assert overlapping_tick_labels(fig) == []
    fig = Figure(figsize=(4, 3))
    ax = fig.add_subplot()
    ax.set_xticks([0, 5, 10, 10.05], ["0", "5", "10", "10.05"])
    ax.set_xlim(0, 10)  # after set_xticks, which widens the view to its ticks: 10.05 out
    assert overlapping_tick_labels(fig) == []
    ax.set_xlim(0, 10.1)  # now drawn, over "10"
    assert [(a, b) for _, a, b in overlapping_tick_labels(fig)] == [("10", "10.05")]


def test_cell_palette_gives_every_cell_its_own_colour():
    cells = [f"c{i}" for i in range(14)]  # this project's run: 12 paper A cells, 2 backbones
    palette = cell_palette(cells)
    assert list(palette) == cells and len(set(palette.values())) == 14
    assert len(set(cell_palette([f"c{i}" for i in range(20)]).values())) == 20
    with pytest.raises(ValueError, match="21 cells"):
        cell_palette([f"c{i}" for i in range(21)])


@pytest.mark.parametrize("name", ["blind_spot", "convergence", "index"])
def test_every_report_figure_is_finished(name):
    """Every notebook cell that makes a figure passes it to figures.finish (layout and the
    tick label check), so no figure reaches a report unchecked."""
    nb = json.loads((REPORTS / f"{name}.ipynb").read_text())
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and "plt.subplots(" in source:
            assert "finish(fig)" in source, source[:200]
            assert "plt.tight_layout()" not in source, source[:200]


def test_a_specification_axis_orders_numbers_and_keeps_values_with_units_as_tried():
    assert ordered(["0.02", "0.005", "0.01", "0.005"]) == ["0.005", "0.01", "0.02"]
    tried = ["0.01 nats", "0.001 nats", "2% of the gain", "0.01 nats"]
    assert ordered(tried) == ["0.01 nats", "0.001 nats", "2% of the gain"]


def test_the_specification_curve_draws_a_parameter_whose_values_carry_units():
    """Saturation's tolerance is swept in nats and in shares of the gain: the curve
    draws it (a sort by float failed on it in the committed run)."""
    rows = pd.DataFrame([
        {"row": "saturation [backbone]", "parameter": "saturation", "value": v,
         "judged": v == "0.01 nats", "verdict": verdict}
        for v, verdict in [("0.01 nats", "contradicted"), ("0.001 nats", "holds"),
                           ("2% of the gain", "inconclusive")]])
    drawn = specification(rows, "paper B: verdict against parameter")
    ax = drawn.fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "0.01 nats", "0.001 nats", "2% of the gain"]


def forest_row(row, unit, lo, value, hi, band=(-math.inf, math.inf), paper=math.nan,
               verdict="holds", robust=True, level=0.95):
    return {"row": row, "part": "direction", "unit": unit, "statistic": "s", "lo": lo,
            "value": value, "hi": hi, "level": level, "band_lo": band[0], "band_hi": band[1],
            "paper": paper, "verdict": verdict, "kind": "finding", "robust": robust}


def test_the_forest_plot_draws_each_effect_on_its_own_scale():
    """A panel per unit, ratios on a log axis, each interval where its numbers are (no
    distance in widths, no clipping), the paper's number marked, the verdict in colour
    and marker, a Bonferroni level named; the alt text says the same."""
    rows = pd.DataFrame([
        forest_row("drift [ours] (magnitude)", "ratio", 0.75, 0.89, 1.05, (469.9, math.inf),
                   paper=539.0, verdict="contradicted"),
        forest_row("drift [reference]", "ratio", 800.0, 900.0, 1000.0, (1.0, math.inf)),
        forest_row("clamp [ours]", "nats", 0.05, 0.08, 0.1, (-0.01, 0.01),
                   verdict="contradicted", robust=False, level=0.9875),
        forest_row("depth [bb]", "loops", 5.0, 5.0, 5.0, (6.0, math.inf), paper=8.0,
                   verdict="inconclusive"),
        forest_row("tail [bb]", "unitless", 0.1, 0.2, 0.3, (0.0, math.inf))])
    drawn = forest(rows, "paper A's claims")
    axes = drawn.fig.axes
    assert [ax.get_xlabel() for ax in axes] == ["nats", "ratio (log axis)", "loops", "unitless"]
    assert [ax.get_xscale() for ax in axes] == ["linear", "log", "linear", "linear"]
    nats, ratio = axes[0], axes[1]
    assert [t.get_text() for t in nats.get_yticklabels()] == ["clamp [ours] at 98.8%"]
    left, right = ratio.get_xlim()
    assert left < 0.75 and right > 1000  # the interval at 0.89 and the one at 900 both drawn
    marker = next(line for line in nats.get_lines() if line.get_marker() != "None")
    assert marker.get_marker() == VERDICT_MARKERS["contradicted"]
    assert marker.get_color() == VERDICT_COLOURS["contradicted"]
    assert marker.get_markerfacecolor() == "white"  # fragile: hollow
    assert any(line.get_marker() == "|" and list(line.get_xdata()) == [539.0]
               for line in ratio.get_lines())  # the paper's number
    assert overlapping_tick_labels(drawn.fig) == []
    assert ("a panel per unit (nats: 1 row; ratio: 2 rows, log axis; loops: 1 row; "
            "unitless: 1 row)") in drawn.alt
    assert "1 at a Bonferroni level" in drawn.alt and "black bar (2 rows)" in drawn.alt
    assert ("2 holds (blue circle), 2 contradicted (orange cross), 1 inconclusive (grey "
            "diamond); 1 fragile") in drawn.alt


def test_a_ratio_panel_with_a_number_at_or_below_zero_stays_linear():
    rows = pd.DataFrame([forest_row("a", "ratio", -0.5, 0.2, 0.9, (1.0, math.inf))])
    assert forest(rows, "t").fig.axes[0].get_xscale() == "linear"


def test_the_verdict_palette_is_colour_blind_safe_and_shaped():
    """Okabe and Ito's blue, vermillion and grey, and a marker of its own for each."""
    assert VERDICT_COLOURS["holds"] == "#0072B2" and VERDICT_COLOURS["contradicted"] == "#D55E00"
    assert len(set(VERDICT_MARKERS.values())) == len(VERDICT_MARKERS)
