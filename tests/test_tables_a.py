"""Paper A's report tables (loopscope.render.tables_a) and figures
(loopscope.render.figures_a), from constructed outputs."""

import math

import matplotlib
import numpy as np
import pandas as pd
import pytest
from report_data import diagnose, per_loop, write

from loopscope.base import paths
from loopscope.render import figures_a
from loopscope.render.tables_a import (
    cell_table,
    clamp_modes,
    depths,
    final_loop_norms,
    final_norms_view,
    intro,
    later_loops,
    lemma2_table,
    norm_ccdf,
    norm_ccdfs,
    paper_norms,
    per_loop_table,
    perplexity_table,
    slope_table,
    sweep_table,
)

matplotlib.use("Agg")


def test_cell_table_describes_each_cell(paper_a):
    table = cell_table(["short", "long"])
    assert list(table.index) == ["short", "long"]
    assert list(table["loops"]) == [2, 3] and list(table["params"]) == [1234, 1234]
    assert table.loc["long", "units"] == "40 (document)"
    assert table.loc["long", "train s"] == 5.0


def test_per_loop_table_is_in_loop_order_with_every_measurement(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(paths.metrics_file("diagnose", "deep"), diagnose(11, 1.0))  # k10 sorts before k2
    write(paths.metrics_file("throughput", "deep"), {"tokens_per_s": per_loop(11, float)})
    write(paths.metrics_file("clamp", "deep"),
          {"freeze_loop1": {"delta_ce": per_loop(11, float)},
           "remove_radial": {"delta_ce": per_loop(11, lambda i: -i)}})
    table = per_loop_table(["deep"])
    assert list(table["loop"]) == list(range(1, 12))
    assert list(table["ppl"]) == [100.0 / i for i in range(1, 12)]
    assert list(table["mean"]) == [float(i) for i in range(1, 12)]
    assert clamp_modes(table) == ["clamp freeze_loop1", "clamp remove_radial"]
    assert table.loc[table["loop"] == 10, "clamp remove_radial"].item() == -10


def test_final_loop_norms_take_each_cell_at_its_own_depth(paper_a):
    """Each cell reports its own last loop, not the deepest cell's."""
    table = final_loop_norms(per_loop_table(["short", "long"]), {"short": 2, "long": 3})
    assert list(table.index) == ["short", "long"]
    assert list(table["mean"]) == [2.0, 30.0]  # short at k2, long at k3
    assert list(table.columns) == ["mean", "median", "p99", "p99_over_median",
                                   "share_above_10x_median"]
    info = pd.DataFrame({"loss placement": ["per_loop", "final", "per_loop", "per_loop"],
                         "group": ["normed baseline", "normed baseline", "scale-controlled",
                                   "scale-controlled"],
                         "control": ["-", "-", "raw readout", "stable injection"]},
                        index=["drifts", "terminal", "control", "stable"])
    assert list(paper_norms(info)) == ["~39,000 (44M), 56,051 (129M)", "-", "17 to 83", "-"]
    view = final_norms_view(per_loop_table(["short", "long"]), cell_table(["short", "long"]))
    assert "paper A" in view.data.columns and ">30</td>" in view.to_html()


def test_perplexity_table_has_a_column_per_depth(paper_a):
    table = perplexity_table(per_loop_table(["short", "long"]))
    assert list(table.columns) == ["K=1", "K=2", "K=3", "PPL(K=1)/PPL(K)"]
    assert table.loc["long", "PPL(K=1)/PPL(K)"] == pytest.approx(3.0)
    assert math.isnan(table.loc["short", "K=3"])
    short = table.loc["short"]  # each cell at its own K: the short cell's K is 2
    assert short["PPL(K=1)/PPL(K)"] == pytest.approx(short["K=1"] / short["K=2"])


def test_slope_and_lemma2_tables_have_a_row_per_cell(paper_a):
    slopes = slope_table(per_loop_table(["short", "long"]))
    assert list(slopes.columns) == [f"across tokens, loop {k}" for k in (1, 2, 3)]
    assert slopes.loc["long", "across tokens, loop 3"] == pytest.approx(0.3)
    lemma2 = lemma2_table(["short", "long"])
    assert list(lemma2.index) == ["short", "long"] and list(lemma2["slope"]) == [-1.0, -10.0]


def sweep(scales: list[float]) -> pd.DataFrame:
    """tables/sweep of one run: two documents (weights 1 and 3 tokens), per-loop sums."""
    cols = {"seed": [0, 0], "doc": [0, 1], "tokens": [1, 3]}
    for k, s in enumerate(scales, start=1):
        cols[f"ce_{k}"] = [1.0, 3.0]  # sums over the document's tokens: mean 1.0
        cols[f"scale_{k}"] = [s, 3 * s]
        cols[f"step_{k}"] = [0.1, 0.3]
        cols[f"step_x_scale_{k}"] = [0.1 * s, 0.9 * s]
        cols[f"radial_{k}"] = [0.0, 0.0]
    return pd.DataFrame(cols)


def write_sweeps(found: dict[str, pd.DataFrame]) -> None:
    for c, table in found.items():
        paths.table_file("sweep", c).parent.mkdir(parents=True, exist_ok=True)
        table.to_parquet(paths.table_file("sweep", c))


def test_sweep_table_pools_tokens_and_starts_each_cell_afresh(paper_a):
    write_sweeps({"long": sweep([1.0, 2.0, 4.0]), "short": sweep([5.0, 6.0])})
    table = sweep_table(["long", "short"])
    a, b = table[table["cell"] == "long"], table[table["cell"] == "short"]
    assert list(a["loop"]) == [1, 2, 3] and list(a["scale"]) == [1.0, 2.0, 4.0]
    assert list(a["ppl"]) == pytest.approx([math.e] * 3)
    assert math.isnan(a["scale_prev"].iloc[0]) and list(a["scale_prev"].iloc[1:]) == [1.0, 2.0]
    assert math.isnan(b["scale_prev"].iloc[0])  # not the long cell's last scale
    assert list(b["K"]) == [2, 2]
    assert list(later_loops(table)["loop"]) == [2, 3, 2]
    trained, swept = depths(pd.DataFrame({"loops": [4, 2, 4]}), table)
    assert trained == [2, 4] and swept == 3
    assert intro(cell_table(["short", "long"]), table).startswith(
        "**2 cells**, trained at K = [2, 3] loops and swept to 3;")


def test_norm_ccdf_is_the_share_at_least_as_large(paper_a):
    ccdf = norm_ccdf(np.array([4.0, 1.0, 3.0, 2.0]))
    assert list(ccdf["norm"]) == [1.0, 2.0, 3.0, 4.0]
    assert list(ccdf["share"]) == [1.0, 0.75, 0.5, 0.25]
    assert list(ccdf["over_median"]) == pytest.approx([0.4, 0.8, 1.2, 1.6])  # median 2.5
    paths.table_file("diagnose", "long").parent.mkdir(parents=True)
    pd.DataFrame({"norm_3": [4.0, 1.0, 3.0, 2.0]}).to_parquet(paths.table_file("diagnose",
                                                                               "long"))
    assert list(norm_ccdfs(["long"])["long"]["norm"]) == [1.0, 2.0, 3.0, 4.0]  # at its K


def test_every_figure_draws_with_an_alt_text_that_names_what_it_shows(paper_a):
    write_sweeps({"long": sweep([1.0, 2.0, 4.0, 8.0]), "short": sweep([5.0, 6.0, 7.0])})
    per_loop = per_loop_table(["short", "long"])
    table = sweep_table(["short", "long"])
    palette = {"short": (0.1, 0.2, 0.3), "long": (0.3, 0.2, 0.1)}
    ccdfs = {c: norm_ccdf(np.array([1.0, 2.0, 30.0])) for c in palette}
    drawn = [figures_a.norms(per_loop, table, palette, [2, 3]),
             figures_a.ccdf(ccdfs, palette), figures_a.radial(per_loop, palette),
             figures_a.lemma2(later_loops(table), palette),
             figures_a.perplexity(table, per_loop, palette),
             figures_a.clamp(per_loop, clamp_modes(per_loop))]
    for d in drawn:
        assert len(d.alt) > 60 and "nan" not in d.alt, d.alt
    assert "largest: long at 30" in drawn[0].alt
    assert "long at loop 3, 33.33" in drawn[4].alt
    for d in drawn:
        matplotlib.pyplot.close(d.fig)
