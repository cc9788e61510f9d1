"""Fixed point, floor or cycle (loopscope.measure.trajectory.settling, loopscope.judge.settling):
three looped maps run through the real trajectory and labelled at the criteria's
default thresholds (a geometric approach settles, a 2-cycle cycles, a slow linear drift
drifts); the floor's fit, its t bound and the KL's alternation on curves whose answer is
known; the late windows the claims may judge are the ones measured."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn
import yaml
from scipy import stats

from loopscope.base.errors import ParamsError
from loopscope.judge import criteria
from loopscope.judge.criteria import Criteria
from loopscope.judge.params import ClaimsConfig
from loopscope.judge.settling import LABELS, Tokens, by_type
from loopscope.measure.trajectory.settling import (
    WINDOWS,
    alternation,
    fit_floor,
    summarize,
    t_quantile,
    token_columns,
    windows,
)
from loopscope.measure.trajectory.trajectories import trajectory
from loopscope.stats.intervals import Documents, Sample
from loopscope.weights.model import Cost

VALUES = {f.name: getattr(ClaimsConfig(), f.name) for f in dataclasses.fields(ClaimsConfig)}
R = 4  # the maps' R: trajectories run to 4R = 16, the late window 1R is loops 12..16


class Map(nn.Module):
    """A looped model whose loop is a fixed map of the state, written against the
    looped-model interface: `geometric` approaches h* = 2e by a factor 0.7 a loop (a
    fixed point), `reflection` flips the state's component along one direction (a
    2-cycle: back where it was every second loop, the same distance every loop),
    `drift` adds one small step every loop (a slow linear drift)."""

    def __init__(self, kind: str, vocab: int = 32, d: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.kind, self.loops, self.d_model, self.context = kind, R, d, 8
        self.kv_blocks, self.readout_eps = 0, 0.0
        self.embed = nn.Embedding(vocab, d)
        self.head = nn.Linear(d, vocab, bias=False)
        u = torch.randn(d)
        self.register_buffer("u", u / u.norm())
        self.register_buffer("v", 0.002 * torch.randn(d))

    def inputs(self, idx: torch.Tensor) -> torch.Tensor:
        return self.embed(idx)

    def initial_state(self, e: torch.Tensor, generator: torch.Generator | None = None
                      ) -> torch.Tensor:
        return e

    def carry(self, h: torch.Tensor, first: bool | torch.Tensor = False) -> torch.Tensor:
        return h

    def step(self, h: torch.Tensor, e: torch.Tensor, kvs=None, k=None, positions=None
             ) -> torch.Tensor:
        if self.kind == "geometric":
            return 2 * e + 0.7 * (h - 2 * e)
        if self.kind == "reflection":
            return h - 2 * (h @ self.u)[..., None] * self.u
        return h + self.v

    def read(self, h: torch.Tensor, last: bool) -> torch.Tensor:
        return self.head(h)

    def cost(self) -> Cost:
        return Cost(prelude=0.0, loop=1.0, readout=1.0)


def table_of(kind: str, docs: int = 8, t: int = 8) -> pd.DataFrame:
    """The map's per-token table (the measuring stage's late-window columns) over
    `docs` windows of t tokens, one document each."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 32, (docs, t), generator=g)
    traj = trajectory(Map(kind).eval(), x, x, None, 4 * R, 4)
    return pd.DataFrame({"seed": 0, "doc": np.repeat(np.arange(docs), t),
                         "type": "content_word", **token_columns(traj, R)})


EPS = float(np.finfo(np.float32).eps)


def labels_of(kind: str) -> np.ndarray:
    w = windows(R, 4 * R)[0]
    return Tokens(table_of(kind), 100).labels(w.label, w.loops, VALUES["floor_share"],
                                              VALUES["alternating_share"],
                                              VALUES["precision_floor"] * EPS)


@pytest.mark.parametrize("kind, label", [("geometric", "settling"),
                                         ("reflection", "cycling"), ("drift", "drifting")])
def test_each_kind_of_late_state_gets_its_label(kind, label):
    assert set(labels_of(kind)) == {label}


def test_a_floor_at_working_precision_is_rounding_not_a_cycle():
    """A token that has reached its fixed point to float32 precision still jitters by a
    couple of epsilons a loop, its rounding turning back and forth: a floor with
    alternating updates, which the precision floor counts as settled."""
    table = pd.DataFrame({"seed": 0, "doc": [0, 1], "change_last": [2.5e-7, 2e-3],
                          "floor_1R": [2.1e-7, 1.9e-3], "floor_se_1R": [1e-9, 1e-6],
                          "backward_1R": [1.0, 1.0]})
    tokens = Tokens(table, 10)
    assert list(tokens.labels("1R", 9, 0.1, 0.75)) == ["cycling", "cycling"]
    assert list(tokens.labels("1R", 9, 0.1, 0.75, 10 * EPS)) == ["settling", "cycling"]


def test_the_trajectory_records_which_updates_turn_back():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 32, (2, 8), generator=g)
    back = trajectory(Map("reflection").eval(), x, x, None, 6, 2).backward
    assert back.dtype == bool and not back[0].any() and back[1:].all()
    assert not trajectory(Map("geometric").eval(), x, x, None, 6, 2).backward.any()
    assert not trajectory(Map("drift").eval(), x, x, None, 6, 2).backward.any()


def test_the_floor_fit_recovers_a_floor_and_a_geometric_approach():
    j = np.arange(9.0)
    curves = np.stack([4.3e-4 + 1e-4 * 0.8 ** j, 1e-3 * 0.8 ** j, np.full(9, 5e-4)], 1)
    c, se, rho = fit_floor(curves)
    assert c == pytest.approx([4.3e-4, 0.0, 5e-4], abs=1e-12)
    assert rho[:2] == pytest.approx([0.8, 0.8]) and (se < 1e-12).all()
    noisy = 1e-3 * 0.8 ** j + 1e-5 * np.random.default_rng(0).normal(size=9)
    c, se, _ = fit_floor(noisy[:, None])
    assert abs(c[0]) < 3 * se[0] and se[0] > 0  # consistent with no floor
    with pytest.raises(ValueError, match="at least 4"):
        fit_floor(curves[:3])


@pytest.mark.parametrize("df", [1, 2, 3, 5, 6, 13])
def test_the_t_quantile_matches_scipy(df):
    assert t_quantile(0.975, df) == pytest.approx(stats.t.ppf(0.975, df), rel=2e-3)


def test_the_kl_alternation_reads_odd_over_even_past_a_trend():
    loops = np.arange(24, 33)
    kl = 1e-4 * 0.9 ** loops * np.where(loops % 2 == 1, 1.08, 1.0)
    assert alternation(kl[:, None], 24)[0] == pytest.approx(np.log10(1.08))
    assert alternation(1e-4 * 0.9 ** loops[:, None], 24)[0] == pytest.approx(0.0, abs=1e-12)
    kl[3] = 0.0
    assert np.isnan(alternation(kl[:, None], 24)[0])


def test_the_late_windows_end_at_the_deepest_depth():
    assert [(w.label, w.first, w.last) for w in windows(8, 32)] == [
        ("1R", 24, 32), ("1.5R", 20, 32), ("2R", 16, 32)]
    assert windows(4, 8)[-1].first == 2  # never before the first update
    with pytest.raises(ParamsError, match="convergence.depth_factor"):
        windows(2, 4)


def test_every_late_window_the_claims_sweep_is_measured():
    raw = yaml.safe_load(criteria.SPEC.read_text())
    assert set(raw["late_window"]["values"]) | {ClaimsConfig().late_window} <= set(WINDOWS)


def test_the_cell_level_floor_sees_a_floor_and_the_alternation():
    """A cell whose mean change levels off at a floor and whose mean KL alternates:
    the floor's share of the change at D near 1, the alternation log10 1.08."""
    loops = np.arange(1, 33)[:, None]
    n, docs = 40, np.repeat(np.arange(20), 2)
    change = (4.3e-4 + 1e-3 * 0.8 ** loops) * np.ones((1, n))
    kl = 1e-4 * np.where(loops % 2 == 1, 1.08, 1.0) * np.ones((1, n))
    traj = dataclasses.make_dataclass("T", ["change", "change2", "kl", "backward", "depth"])(
        change, change * 1.5, kl, np.zeros((32, n), bool), 32)
    found = summarize(Sample(Documents(docs, 100), docs), traj, 8)["windows"]["1R"]
    assert (found["from"], found["to"]) == (24, 32)
    assert found["floor"]["value"] == pytest.approx(4.3e-4, rel=1e-6)
    assert found["floor_share"]["value"] > 0.9
    assert found["kl_alternation"]["value"] == pytest.approx(np.log10(1.08))
    assert found["two_step_ratio"]["value"] == pytest.approx(1.5)


def test_label_shares_by_type_resample_documents():
    table = pd.concat([table_of("geometric"), table_of("drift").assign(
        type="whitespace", doc=lambda t: t["doc"] + 100)], ignore_index=True)
    w = windows(R, 4 * R)[0]
    conv = {"settling": {"windows": {w.label: {"from": w.first, "to": w.last}}}}
    rows = by_type(Tokens(table, 100), conv, Criteria(VALUES), ("whitespace", "content_word"))
    assert [r["type"] for r in rows] == ["all", "whitespace", "content_word"]
    assert rows[0]["settling"].value == pytest.approx(0.5) and rows[0]["settling"].lo < 0.5
    assert rows[1]["drifting"].value == 1.0 and rows[2]["settling"].value == 1.0
    assert rows[0]["tokens"] == len(table) and set(LABELS) <= set(rows[0])
