"""Paper A's cells as its claims read them: one cell's measurements (CellA), a recipe
group of cells with the resamples every claim of the group shares (GroupA, so cells are
compared paired), and the seed rule that a verdict resting on a cell of two seeds must
hold on each seed alone (on_each_seed). The claims are loopscope.judge.paper_a.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from loopscope.judge.cells import PAPER_CONTROLS
from loopscope.judge.criteria import Criteria
from loopscope.judge.verdicts import FEW_SEEDS, Claim, Comparison, seed_rule
from loopscope.stats.intervals import Documents


@dataclass
class CellA:
    """What paper A's claims read of one cell: its group (loopscope.judge.cells.cell_group),
    loss placement, readout, recipe (a label: cells are compared within a recipe),
    training depth K; the per-token table of diagnose (tables/diagnose: doc, and per
    loop ce_k, norm_k, cos_k, floor_k), the per-document depth sweep (tables/sweep) and
    the clamp's change in CE at K per token and mode (tables/clamp, the rows of
    tables/diagnose); inference tokens/s and FLOPs per token at each depth
    (metrics/throughput). Rows of every table carry the run (seed) they come from:
    intervals resample a cell's seeds as well as documents."""

    group: str
    loss: str
    readout: str
    recipe: str
    loops: int
    tokens: pd.DataFrame
    sweep: pd.DataFrame
    clamp: pd.DataFrame
    tokens_per_s: dict[str, float]
    flops_per_token: dict[str, float]
    unit: str = "document"  # what the tables' doc column holds (loopscope.stats.units)
    control: str = ""  # a scale-controlled cell's control (loopscope.judge.cells.control)
    d_model: int = 0  # the state's width (0: unknown; the activity lemma needs it)
    paper: bool = True  # one of paper A's seven conditions (cells.paper_condition)
    speed_rounds: dict[str, list[float]] = field(default_factory=dict)  # tokens/s per round

    @property
    def last(self) -> str:
        return f"k{self.loops}"

    @property
    def clamp_modes(self) -> list[str]:
        return [c for c in self.clamp.columns if c not in ("seed", "doc")]

    @property
    def seeds(self) -> int:
        return int(self.tokens["seed"].nunique()) if "seed" in self.tokens else 1

    def col(self, name: str, k: int | None = None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(docs, values, runs) of a per-token column at loop k (default: K); runs: the
        seed of each token's run (None: one run)."""
        return (self.tokens["doc"].to_numpy(),
                self.tokens[f"{name}_{self.loops if k is None else k}"].to_numpy(),
                _runs(self.tokens))


def _runs(table: pd.DataFrame) -> np.ndarray | None:
    return table["seed"].to_numpy() if "seed" in table else None


def _sweep_means(docs: Documents, sweep: pd.DataFrame, key: str, name: str,
                 loops: range) -> np.ndarray:
    """Per loop k in loops (rows) and per draw (columns): the mean over tokens of a
    sweep column name_k, from a per-document (and run) sweep table of the cell key."""
    d, runs = sweep["doc"].to_numpy(), _runs(sweep)
    n = docs.total(d, sweep["tokens"].to_numpy(), runs, key)
    return np.stack([docs.total(d, sweep[f"{name}_{k}"].to_numpy(), runs, key) / n
                     for k in loops])


def sweep_depth(sweep: pd.DataFrame) -> int:
    return max(int(c.rsplit("_", 1)[1]) for c in sweep.columns if c.startswith("scale_"))


def _lemma2_draws(docs: Documents, sweep: pd.DataFrame, key: str
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per draw: the angular 1/s law's across-loop slope (log mean step_k on log mean
    s_k-1, loops 2..L), the scale growth s_L / s_1, and how far the angular step
    shrinks over the sweep, log(step_L / step_2)."""
    depth = sweep_depth(sweep)
    scale = _sweep_means(docs, sweep, key, "scale", range(1, depth + 1))
    step = _sweep_means(docs, sweep, key, "step", range(2, depth + 1))
    x, y = np.log(scale[:-1]), np.log(step)
    xc, yc = x - x.mean(0), y - y.mean(0)
    slope = (xc * yc).sum(0) / np.maximum((xc * xc).sum(0), 1e-300)
    return slope, scale[-1] / scale[0], y[-1] - y[0]


# the design rule's three, and stable injection (Parcae, after the paper)
RESULTS = "paper A, results"  # where paper A says it: its summary's sections
CONTROLS = ("raw readout", "norm penalty", "inter-loop norm", "stable injection")


@dataclass
class GroupA:
    """One recipe's paper A cells as the claims read them: the per-loop normed baseline,
    the scale-controlled cells (per-loop ones apart), the per-loop raw cell, and the
    resamples shared by every claim of the report (so cells are paired), and the
    criteria's values a claim is judged at (p). used: the cells a claim has read so far
    (resampled() names their seeds). Per-draw means and quantiles are kept (memo): the
    claims and their specification curves read the same ones again."""

    cells: dict[str, CellA]
    recipe: str | None
    docs: Documents
    p: Criteria
    used: set[str] = field(default_factory=set)
    memo: dict[tuple[Any, ...], np.ndarray] = field(default_factory=dict)
    # "paper": the scale-controlled cells a claim compares are the paper's own
    # conditions (raw readout, norm penalty); "every": ours too (an extension)
    scope: str = "paper"

    @classmethod
    def of(cls, cells: dict[str, CellA], docs: Documents, p: Criteria,
           recipe: str | None = None) -> GroupA:
        """The cells of one recipe (default: the first per-loop normed cell's)."""
        if recipe is None:
            normed = [v for v in cells.values()
                      if v.group == "normed baseline" and v.loss == "per_loop"]
            recipe = normed[0].recipe if normed else None
        return cls({c: v for c, v in cells.items() if v.recipe == recipe}, recipe, docs, p)

    def at(self, p: Criteria) -> GroupA:
        """The same group judged at other criteria (the memo shared)."""
        return dataclasses.replace(self, p=p, used=set())

    def every(self) -> GroupA:
        """The same group with every scale-controlled cell among the controls, ours (the
        inter-loop norm, stable injection) beside the paper's (the memo shared)."""
        return dataclasses.replace(self, scope="every", used=set())

    @property
    def beyond(self) -> list[str]:
        """The group's scale-controlled cells that are not paper A's conditions."""
        return [c for c, v in self.cells.items()
                if v.group == "scale-controlled" and not v.paper]

    @property
    def normed(self) -> str | None:
        return next((c for c, v in self.cells.items()
                     if v.group == "normed baseline" and v.loss == "per_loop"), None)

    @property
    def controls(self) -> list[str]:
        """The scale-controlled cells a claim compares with: the paper's conditions, or
        (scope "every") every one."""
        return [c for c, v in self.cells.items() if v.group == "scale-controlled"
                and (v.paper or self.scope == "every")]

    @property
    def per_loop_controls(self) -> list[str]:
        return [c for c in self.controls if self.cells[c].loss == "per_loop"]

    @property
    def raw(self) -> str | None:
        return next((c for c in self.per_loop_controls if self.cells[c].readout == "raw"),
                    None)

    def cell(self, c: str) -> CellA:
        """Cell c, recorded as read by the claim being judged."""
        self.used.add(c)
        return self.cells[c]

    def mean(self, c: str, name: str, k: int | None = None) -> np.ndarray:
        """Per draw: the mean of a per-token column of cell c at loop k (default K)."""
        key = ("mean", c, name, k)
        if key not in self.memo:
            self.memo[key] = self.docs.mean(*self.cell(c).col(name, k), key=c)
        self.used.add(c)
        return self.memo[key]

    def clamp_mean(self, c: str, mode: str) -> np.ndarray:
        """Per draw: the mean change in CE at K under a clamp mode, cell c's tokens."""
        x = self.cell(c)
        return self.docs.mean(x.clamp["doc"].to_numpy(), x.clamp[mode].to_numpy(),
                              _runs(x.clamp), c)

    def growth_text(self, cells: list[str]) -> str:
        """How far the loops grow each cell's state: s_K / s_1 and s_L / s_1 over the
        depth sweep (L its deepest depth), the point estimates, in words."""
        return ", ".join(f"{c} x{self.growth(c, self.cells[c].loops)[0]:.2f} over K, "
                         f"x{self.growth(c, sweep_depth(self.cells[c].sweep))[0]:.2f} over "
                         f"{sweep_depth(self.cells[c].sweep)} loops" for c in cells)

    def test(self, statistic: str, draws: np.ndarray, rule: Any, *args: float,
             unit: str = "", paper: float | None = None, of: str = "") -> Comparison:
        """A comparison on per-draw values: its 95% interval, and at the level of a
        family from the same resamples; the statistic's unit, the paper's number on its
        scale where it gives one, and the statistic a family's member is an instance of
        (Comparison.of)."""
        return Comparison(statistic, self.docs.interval(draws), rule, args,
                          lambda k: self.docs.interval(draws, k), unit, paper, of)

    def quantile(self, c: str, name: str, k: int, q: float) -> np.ndarray:
        """Per draw: the q-quantile of a per-token column of cell c at loop k (kept in
        the memo: no criterion changes it, and the specification curve asks again)."""
        key = ("quantile", c, name, k, q)
        if key not in self.memo:
            d, v, runs = self.cell(c).col(name, k)
            self.memo[key] = self.docs.quantile(d, v, q, runs, c)
        self.used.add(c)
        return self.memo[key]

    def share_above(self, c: str, factor: float) -> np.ndarray:
        """Per draw: the share of cell c's tokens whose final-loop norm is above factor x
        the cell's median final-loop norm (the median of the sample, held fixed)."""
        d, v, runs = self.cell(c).col("norm")
        return self.docs.mean(d, (v > factor * np.median(v)).astype(np.float64), runs, c)

    def step_draws(self, c: str) -> dict[int, np.ndarray]:
        """Per draw, CE(k+1) - CE(k) of cell c for k = 1..K-1."""
        return {k: self.mean(c, "ce", k + 1) - self.mean(c, "ce", k)
                for k in range(1, self.cells[c].loops)}

    def seed_spread(self, cells: list[str] | None = None) -> dict[str, float]:
        """The largest difference between two seeds' mean CE at K, per cell trained more
        than once: of `cells`, or of every per-loop cell of the group."""
        spread = {}
        for c in cells if cells is not None else [self.normed, *self.per_loop_controls]:
            t = self.cells[c].tokens if c else None
            if t is not None and "seed" in t and t["seed"].nunique() > 1:
                means = t.groupby("seed")[f"ce_{self.cells[c].loops}"].mean()
                spread[c] = float(means.max() - means.min())
        return spread

    def worse_last(self, c: str) -> str:
        """Where cell c's last loop is worse than its best one, a phrase that says so."""
        means = {k: self.mean(c, "ce", k) for k in range(1, self.cells[c].loops + 1)}
        best = min(means, key=lambda k: means[k][0])
        last = self.cells[c].loops
        if best == last:
            return ""
        return (f" (last loop worse than loop {best}: CE(K) - CE({best}) "
                f"{self.docs.interval(means[last] - means[best])})")

    def controls_named(self) -> str:
        """The scale-controlled cells a claim compares with, with their controls, and
        the paper's controls the group lacks (where the cells say what they are)."""
        named = ", ".join(f"{c} ({self.cells[c].control})" if self.cells[c].control else c
                          for c in self.controls)
        known = [self.cells[c].control for c in self.controls if self.cells[c].control]
        wanted = CONTROLS if self.scope == "every" else PAPER_CONTROLS
        lacks = [k for k in wanted if known and not any(k in have for have in known)]
        return named + (f"; this group has no {' and no '.join(lacks)} cell" if lacks else "")

    def growth(self, c: str, k: int) -> np.ndarray:
        """Per draw: cell c's state scale after loop k over its scale after loop 1 (the
        depth sweep's mean RMS), how far the loops grow the state by loop k."""
        scale = _sweep_means(self.docs, self.cell(c).sweep, c, "scale", (1, k))
        return scale[-1] / scale[0]

    def lemma2(self, c: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _lemma2_draws(self.docs, self.cell(c).sweep, c)

    def activity(self, c: str) -> np.ndarray | None:
        """Per loop k = 1..K (rows) and per draw: the radial share of loop k's update
        of cell c, a / sqrt(1 + a^2) with a = |radial displacement| / angular
        displacement, both means over tokens of the depth sweep: sqrt(d) |s_k - s_k-1|
        and s_k-1 ||u_k - u_k-1|| (s the RMS of H, u = H / s; ||H|| = sqrt(d) s). 1 for
        a purely radial update, 0 for a purely angular one. None where the width is not
        known."""
        x = self.cell(c)
        if not x.d_model:
            return None
        loops = range(1, x.loops + 1)
        radial = np.sqrt(x.d_model) * np.abs(
            _sweep_means(self.docs, x.sweep, c, "radial", loops))
        a = radial / _sweep_means(self.docs, x.sweep, c, "step_x_scale", loops)
        return a / np.sqrt(1 + a * a)

    def gain(self, c: str) -> np.ndarray:
        """Per draw: CE(1) - CE(K), what depth buys the cell."""
        return self.mean(c, "ce", 1) - self.mean(c, "ce")

    def resampled(self) -> str:
        """What the intervals of the claim just judged resample: units, and seeds per
        cell read; a cell trained once makes the interval conditional on that model."""
        kinds = sorted({self.cells[c].unit for c in self.used}) or ["document"]
        units = f"{len(self.docs.ids)} units ({', '.join(kinds)})"
        one = sorted(c for c in self.used if self.cells[c].seeds < 2)
        many = sorted({self.cells[c].seeds for c in self.used} - {1})
        seeds = f" x seeds ({'/'.join(map(str, many))} per cell)" if many else ""
        if one:
            seeds += (f"; one seed for {', '.join(one)}: conditional on that trained model")
        return units + seeds


def recipes(cells: dict[str, CellA]) -> list[str]:
    """The recipes with a per-loop normed cell, in the cells' order: each is a group
    paper A's claims are judged in."""
    return list(dict.fromkeys(v.recipe for v in cells.values()
                              if v.group == "normed baseline" and v.loss == "per_loop"))


def resamples_of(cells: dict[str, CellA], resamples: int) -> Documents:
    return Documents(np.concatenate([v.tokens["doc"].to_numpy() for v in cells.values()])
                     if cells else np.zeros(1), resamples)


def _seed(cell: CellA, i: int) -> CellA:
    """The cell restricted to its i-th seed's run (a cell with one run as it is): every
    table it is judged on, the clamp's included."""
    if cell.seeds < 2:
        return cell
    seed = sorted(cell.tokens["seed"].unique())[i % cell.seeds]

    def mine(table: pd.DataFrame) -> pd.DataFrame:
        return table[table["seed"] == seed].reset_index(drop=True)
    return dataclasses.replace(cell, tokens=mine(cell.tokens), sweep=mine(cell.sweep),
                               clamp=mine(cell.clamp))


def seed_groups(g: GroupA) -> list[GroupA]:
    """The group once per seed index, every cell of 2 to FEW_SEEDS - 1 seeds restricted
    to that seed's run (none where no cell has so few)."""
    few = [v.seeds for v in g.cells.values() if 1 < v.seeds < FEW_SEEDS]
    return [dataclasses.replace(GroupA.of({c: _seed(v, i) for c, v in g.cells.items()},
                                          g.docs, g.p, g.recipe), scope=g.scope)
            for i in range(max(few, default=0))]


def on_each_seed(found: Claim, judge: Any, here: GroupA, seeds: list[GroupA],
                 p: Criteria) -> None:
    """The seed rule (verdicts.seed_rule) for a paper A row: the cells it read
    (here.used) of 2 to FEW_SEEDS - 1 seeds, each seed's own judgement from seed_groups."""
    few = [c for c in here.used if 1 < here.cells[c].seeds < FEW_SEEDS]
    if few and seeds:
        seed_rule(found, [judge(s.at(Criteria(p.values()))) for s in seeds], few)
