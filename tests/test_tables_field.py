"""The report's tables past the papers (loopscope.render.tables_field) and the oracle
figure (loopscope.render.figures_b.oracle), from constructed metrics."""

import matplotlib
from report_data import iv
from test_tables_b import conv, inputs

from loopscope.render import figures_b, tables_field

matplotlib.use("Agg")


def reuse(cost: float) -> dict:
    return {"R": {"depth": 4, "ce_own": 3.0, "ce_reuse": 3.0 + cost, "delta_ce": iv(cost),
                  "share": iv(cost / 3.0)},
            "2R": {"depth": 8, "ce_own": 3.0, "ce_reuse": 3.0, "delta_ce": iv(0.0),
                   "share": iv(0.0)}}


def policies() -> dict:
    """metrics/policies of a two-seed backbone: A1 matched, a rule unmatched."""
    oracle = {"premature": iv(0.05), "early_right": iv(0.2), "lateness": iv(0.5),
              "depth_over_oracle": iv(1.6), "depth_over_oracle_margin": iv(0.9),
              "exit_by_settle": {"after4": 4.0, "k1": 2.0, "k2": 2.5}}  # as JSON sorts
    one = {"r": 4, "kl": {"matched": True, "threshold": 1e-3, "mean_loops": 3.1,
                          "oracle": oracle},
           "cosine": {"matched": False},
           "oracle": {"r": 4, "depth": 16, "settle_capped": iv(1.9),
                      "settle_margin_capped": iv(3.4), "settled_by_r": iv(0.97),
                      "settled_by_r_margin": iv(0.6),
                      "by_settle": {"k1": 0.5, "k2": 0.3, "k3": 0.1, "k4": 0.07,
                                    "after4": 0.03}}}
    return {**one, "per_seed": {"seed1": one, "seed2": one}}


def test_the_reuse_table_lists_each_cell_run_and_depth():
    m = {**conv(4), "kv_reuse": reuse(0.06)}
    m["per_seed"] = {"seed1": {"kv_reuse": reuse(0.05)}, "seed2": {"kv_reuse": reuse(0.07)}}
    x = inputs({"bb": m, "other": conv(4)})
    table = tables_field.reuse_table(x)
    assert len(table) == 6  # pooled and two seeds, at R and 2R; "other" measured none
    assert table.iloc[0]["run"] == "pooled (2 seeds)" and table.iloc[0]["depth"] == "R = 4"
    assert table.iloc[0]["cost (share)"].startswith("2.00%")
    assert "Final-loop key/value reuse" in tables_field.reuse_line(x)
    assert "No cell" in tables_field.reuse_line(inputs({"other": conv(4)}))


def test_the_oracle_table_line_and_figure():
    p = policies()
    x = inputs({"bb": conv(4)}, pol={"bb": p})
    assert tables_field.oracle_cells(x) == ["bb"]
    table = tables_field.oracle_table(p)
    assert list(table["run"]) == ["pooled (2 seeds)", "seed1", "seed2"]  # unmatched: none
    assert table.iloc[0]["premature"].startswith("5.00%")
    points = tables_field.oracle_points(p)
    assert list(points["settle"]) == [1, 2, 5] and list(points["share"]) == [0.5, 0.3, 0.03]
    assert "97.00%" in tables_field.oracle_line(p)
    drawn = figures_b.oracle("bb", points, 4)
    assert "against the oracle" in drawn.alt and "A1" not in drawn.alt
