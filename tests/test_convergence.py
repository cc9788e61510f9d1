"""Paper B's convergence statistics on constructed trajectories: the two definitions of
when a token converged, the metrics the claims read, and disjoint window sets."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from loopscope.base.errors import DataError
from loopscope.judge.paper_b import paper_b_claims
from loopscope.judge.params import ClaimsConfig
from loopscope.judge.settling import attach
from loopscope.measure.exit_rules.masked import PolicyResult
from loopscope.measure.params import ConvergenceConfig
from loopscope.measure.runs import document_window_sets
from loopscope.measure.trajectory.convergence import (
    RunConvergence,
    cell_metrics,
    cell_table,
    convergence_loop,
    cross_analysis,
    first_below,
    headline,
    summarize,
)
from loopscope.measure.trajectory.settling import WINDOWS, token_columns
from loopscope.measure.trajectory.token_types import TOKEN_TYPES, type_names
from loopscope.measure.trajectory.trajectories import Trajectory
from loopscope.stats.intervals import Documents, Sample
from loopscope.weights.data import document_ids


def test_the_two_convergence_definitions_differ_on_a_token_that_moves_again():
    nan = np.nan
    kl = np.array([[nan, nan, nan], [1e-4, 1.0, 1.0], [1.0, 1e-4, 1.0], [1e-4, 1e-4, 1.0],
                   [1e-4, 1e-4, 1.0]])  # loops 1..5, three tokens
    # token 0 drops below at loop 2, moves again at 3: A1 exits at 2, it settles at 4;
    # token 2 never settles within the 5 loops measured (6: after the last)
    assert first_below(kl, 1e-3).tolist() == [2, 3, 6]
    assert convergence_loop(kl, 1e-3).tolist() == [4, 3, 6]
    assert convergence_loop(np.full((3, 1), 1e-6), 1e-3).tolist() == [2]


DOCS, PER_DOC, R = 30, 40, 4


def trajectory(rng, content_depth=3.0, punct_depth=2.0, step_up=0.0):
    """D = 4R loops over DOCS x PER_DOC tokens: CE falls to R (step_up makes loop 3
    worse than 2) and stays flat; each token's KL falls by 10x per loop from its own
    convergence depth (by type), so the convergence loop follows the type."""
    d, n = 4 * R, DOCS * PER_DOC
    docs = np.repeat(np.arange(DOCS), PER_DOC)
    types = rng.choice([0, 1, 4], size=n, p=[0.3, 0.2, 0.5])  # whitespace, punct, content
    depth = np.select([types == 0, types == 1], [1.0, punct_depth], content_depth)
    depth = depth + rng.integers(0, 2, n)
    curve = np.array([4.0 - 0.1 * min(k, R) for k in range(1, d + 1)])
    curve[2] += step_up
    ce = curve[:, None] + rng.normal(0, 0.02, (d, n))
    loops = np.arange(1, d + 1)[:, None]
    kl = np.where(loops <= depth, 0.1, 1e-5)
    kl[0] = np.nan
    change = np.exp(-loops / 3.0) * np.ones((1, n))
    change2 = change + np.vstack([np.full((1, n), np.nan), change[:-1]])  # monotone
    traj = Trajectory(ce=ce, kl=kl, change=change, angle=change.copy(),
                      argmax=np.zeros((d, n), np.int32), change2=change2,
                      backward=np.zeros((d, n), bool),  # no update turns back
                      gap=np.ones((d, n), np.float32))
    types[:3] = -1  # special tokens are left out
    return traj, docs, types


def metrics(**kw):
    traj, docs, types = trajectory(np.random.default_rng(0), **kw)
    m = summarize(traj, sample(docs, 300), types, R, 1e-3, ConvergenceConfig(bootstrap=300),
                  sampler_mean=R + 1.0, nominal_mean=float(R))
    return with_tokens(m, traj, docs, types)


def with_tokens(m: dict, traj: Trajectory, docs: np.ndarray, types: np.ndarray) -> dict:
    """A backbone's metrics with its per-token table beside them, as the claims stage
    hands them over (loopscope.judge.settling.attach)."""
    table = pd.DataFrame({"seed": 0, "doc": docs, "parent": docs,
                          "type": type_names(types), **token_columns(traj, R)})
    return attach(m, table, 200, "b")


def test_summarize_gives_every_claim_its_interval():
    m = metrics()
    assert m["sampler_mean"] == R + 1 and m["units"] == DOCS
    e = m["elasticity"]
    assert set(e["steps"]) == {f"k{k}" for k in range(1, R)}
    assert e["half_gain"]["value"] == pytest.approx(0.2, abs=0.01)
    assert e["flat"]["lo"] >= 0 and e["flat_depth"] >= R
    assert m["kl_decay"]["to"] == 2 * R and m["kl_decay"]["log10_ratio"]["hi"] < 0
    assert m["state_decay"]["log10_ratio"]["value"] < 0
    sat = m["saturation"]
    assert sat["useful_depth"] == R and sat["rule"] == "share of the gain"
    assert sum(sat["useful_depth_shares"].values()) == pytest.approx(1.0)
    cfg = ConvergenceConfig()
    assert [(r["kind"], r["tolerance"]) for r in sat["sensitivity"]] == (
        [("nats", t) for t in cfg.sensitivity_nats]
        + [("share", t) for t in cfg.sensitivity_shares])
    assert m["nominal_mean"] == R
    assert sum(m["convergence"]["median_loop_shares"].values()) == pytest.approx(1.0)
    med = m["convergence"]["median_loop"]
    assert med["lo"] <= med["value"] <= med["hi"]
    assert m["convergence"]["median_exit_loop"]["value"] <= med["value"]
    t = m["types"]
    assert t["excluded"] == 3 and "number" not in t
    assert set(t["whitespace_minus"]) == {"punctuation", "content_word"}
    assert set(t["content_minus"]) == {"whitespace", "punctuation"}


VALUES = {f.name: getattr(ClaimsConfig(), f.name) for f in dataclasses.fields(ClaimsConfig)}


def judged(m: dict) -> dict:
    """paper B's rows on one backbone's metrics, by key."""
    return {c.key: c for c in paper_b_claims({"b": m}, {}, "b", None, VALUES)}


def test_the_claims_read_what_summarize_writes():
    found = judged(metrics())
    for key in ("elasticity", "flat_past_r", "token_order", "kl_decay", "state_decay",
                "state_decay_floor"):
        assert found[key].direction == "holds", (key, found[key].value)
    assert found["period_two"].direction == "contradicted"  # a monotone approach


def test_a_period_two_state_is_measured_as_a_cycle():
    """Past 2R the state moves by the same amount every loop but returns every second
    loop: the late decay is about zero, the two-step change far below the one-step
    change, and nearly every token carries the period-2 signature."""
    traj, docs, types = trajectory(np.random.default_rng(0))
    loops = np.arange(1, traj.change.shape[0] + 1)[:, None]
    late = loops > 2 * R
    change = np.where(late, 1e-2, traj.change)
    change2 = np.where(late, 1e-4, traj.change2)
    cycling = dataclasses.replace(traj, change=change, change2=change2,
                                  backward=np.broadcast_to(late, change.shape))
    m = summarize(cycling, sample(docs, 200), types, R, 1e-3, ConvergenceConfig(bootstrap=200))
    m = with_tokens(m, cycling, docs, types)
    c = m["cycle"]
    assert (c["late_from"], c["late_to"]) == (3 * R, 4 * R)
    assert abs(c["late_decay_per_loop"]["value"]) < 1e-9
    assert c["two_step_ratio"]["hi"] < 0.05 and c["period2_share"]["value"] == 1.0
    window = m["settling"]["windows"]["1R"]
    assert window["floor_share"]["lo"] == pytest.approx(1.0)  # all floor, nothing above
    assert window["backward_share"]["value"] == 1.0
    found = judged(m)
    assert found["period_two"].direction == "holds"
    # the paper's statistic, the change falling from R to 4R, cannot see the cycle; the
    # extension beside it, which reads the floor, does
    assert found["state_decay_floor"].direction == "contradicted"
    assert "cycling 100.0%" in found["state_decay_floor"].value
    steady = metrics()["cycle"]
    assert steady["two_step_ratio"]["lo"] > 1 and steady["late_decay_per_loop"]["hi"] < 0
    assert steady["period2_share"]["value"] == 0.0


def test_a_worse_step_before_r_breaks_monotone_elasticity():
    assert judged(metrics(step_up=0.2))["elasticity"].direction == "contradicted"


def test_punctuation_deeper_than_content_words_breaks_the_order():
    # content - whitespace stays large; only the pairwise test sees punctuation deepest
    m = metrics(content_depth=3.0, punct_depth=6.0)
    assert m["types"]["content_minus"]["whitespace"]["lo"] > 0
    assert judged(m)["token_order"].direction == "contradicted"


def test_rare_types_are_listed_not_judged():
    traj, docs, types = trajectory(np.random.default_rng(1))
    types[types == 1][:] = 0
    types = np.where((types == 1) & (np.arange(len(types)) % 20 != 0), 0, types)
    m = summarize(traj, sample(docs, 100), types, R, 1e-3, ConvergenceConfig(bootstrap=100))
    assert m["types"]["rare"] == ["punctuation"]
    assert "punctuation" not in m["types"]["whitespace_minus"]
    assert TOKEN_TYPES[1] == "punctuation"


def test_cross_analysis_picks_its_best_depth_on_the_choose_windows():
    traj, docs, _ = trajectory(np.random.default_rng(2))
    n = traj.ce.shape[1]
    run = PolicyResult(traj.ce[1], np.full(n, 2), np.ones(n), np.zeros(n))
    choose = np.full(traj.depth, 5.0)
    choose[6] = 1.0  # depth 7 is best on choose, whatever report says
    out = cross_analysis(traj, run, sample(docs, 100), choose)
    assert out["best_depth"] == 7 and out["best_depth_chosen_on"] == "choose"
    assert out["ce_best_depth"] == pytest.approx(traj.ce[6].mean())


def corpus(doc_lengths, eos=0):
    parts = []
    for i, n in enumerate(doc_lengths):
        parts += [1 + i] * (n - 1) + [eos]
    return torch.tensor(parts)


def test_window_sets_come_from_disjoint_documents():
    tokens = corpus([100, 60, 90, 70, 80, 120, 50, 95, 85])
    sets = document_window_sets(tokens, 0, 8, 10, 3, "convergence.windows")
    owners = [set(document_ids(tokens, 0, s).tolist()) for s in sets]
    assert [len(s) for s in sets] == [10, 10, 10]
    assert not (owners[0] & owners[1]) and not (owners[1] & owners[2]) \
        and not (owners[0] & owners[2])
    assert all(len(o) >= 2 for o in owners)  # spread over the set's documents


def test_window_sets_that_run_short_name_the_param():
    with pytest.raises(DataError, match="lower convergence.windows"):
        document_window_sets(corpus([100, 60, 90]), 0, 8, 12, 3, "convergence.windows")


def test_the_training_mean_follows_the_depth_convention():
    from loopscope.measure.trajectory.convergence import training_mean
    from loopscope.weights.config import TrainConfig

    assert training_mean(TrainConfig(depth="lognormal", depth_mean="loops"), 8) == 8
    assert training_mean(TrainConfig(depth="lognormal", depth_mean="loops_plus_one"), 8) == 9
    assert training_mean(TrainConfig(depth="fixed"), 4) == 4


def run_of(seed: int, choose: dict[int, float], exit_loop: int) -> RunConvergence:
    """A run of the constructed trajectory, its documents its own, with CE 5 at every
    depth of `choose` but those given, and A1 exiting every token at exit_loop."""
    traj, docs, types = trajectory(np.random.default_rng(seed))
    n = traj.ce.shape[1]
    choose_ce = np.full((traj.depth, 50), 5.0)
    for depth, ce in choose.items():
        choose_ce[depth - 1] = ce
    exits = PolicyResult(traj.ce[exit_loop - 1], np.full(n, exit_loop), np.ones(n),
                         np.zeros(n))
    return RunConvergence(seed, R, R + 1.0, float(R), traj, choose_ce, exits,
                          np.arange(n) % 64,
                          types, docs + 100 * seed, "document")


def two_runs() -> list[RunConvergence]:
    # depth 3 is best on the first run's `choose` windows, 7 on the second's, 5 pooled
    return [run_of(1, {3: 4.0, 5: 4.1, 7: 4.4}, 2), run_of(2, {3: 4.4, 5: 4.1, 7: 4.0}, 4)]


CFG = ConvergenceConfig(epsilon=1e-3, bootstrap=200)


def sample(docs: np.ndarray, resamples: int) -> Sample:
    """One run's tokens resampled by document."""
    return Sample(Documents(docs, resamples), docs)


def test_cell_metrics_pool_the_tokens_of_every_run_and_resample_their_seeds():
    """Two runs: the pooled tokens' statistics, intervals that also resample the seeds,
    and each seed's own summary beside them (the seed rule reads it)."""
    runs = two_runs()
    m = cell_metrics(runs, CFG, 5e-4, "cell")
    docs = np.concatenate([r.docs for r in runs])
    pooled = summarize(Trajectory.concat([r.traj for r in runs]), sample(docs, 200),
                       np.concatenate([r.types for r in runs]), R, CFG.epsilon,
                       CFG, R + 1.0, float(R))
    assert m["ce_at_depth"] == pytest.approx(pooled["ce_at_depth"])
    assert m["kl"] == pytest.approx(pooled["kl"])
    gain, alone = m["elasticity"]["gain"], pooled["elasticity"]["gain"]
    assert gain["value"] == pytest.approx(alone["value"]) and gain != alone  # seeds too
    assert set(m["per_seed"]) == {"seed1", "seed2"}
    one = cell_metrics(runs[:1], CFG, 5e-4, "cell")
    assert m["per_seed"]["seed1"]["elasticity"] == one["elasticity"]
    assert "per_seed" not in one and one["seeds"] == 1
    assert m["tokens"] == 2 * DOCS * PER_DOC and m["units"] == 2 * DOCS
    assert m["cross"]["best_depth"] == 5  # neither run's own best
    # the choose windows' own curve: the pooled mean per depth and its useful depth
    assert m["choose"]["ce_at_depth"]["k5"] == pytest.approx(4.1)
    assert m["choose"]["useful_depth"] == 5
    assert m["cross"]["mean_exit_loop"] == pytest.approx(3.0)
    assert m["cross"]["epsilon"] == 5e-4
    assert (m["seeds"], m["unit"]) == (2, "document")


def test_the_cell_table_has_one_row_per_token_run_by_run():
    runs = two_runs()
    table = cell_table(runs, CFG.epsilon)
    n = DOCS * PER_DOC
    late = [f"{stat}_{w:g}R" for w in WINDOWS
            for stat in ("floor", "floor_se", "backward", "kl_alternation")]
    assert list(table.columns) == ["seed", "doc", "parent", "token_id", "type",
                                   "convergence_loop", "first_below_loop", "exit_loop",
                                   "ce_depth1", "ce_r", "settle_loop", "settle_loop_margin",
                                   "pred_r", "change_last", *late]
    assert (table["parent"] == table["doc"]).all()  # units are documents here
    assert table["seed"].tolist() == [1] * n + [2] * n
    second = table[n:]
    np.testing.assert_array_equal(second["convergence_loop"],
                                  convergence_loop(runs[1].traj.kl, CFG.epsilon))
    np.testing.assert_array_equal(second["ce_r"], runs[1].traj.ce[R - 1])
    assert (second["exit_loop"] == 4).all() and second["exit_loop"].dtype == np.int16
    assert table["token_id"].dtype == np.int32
    first = table["type"][:n]
    assert first[:3].tolist() == ["special"] * 3  # the constructed specials
    assert set(first[3:]) == {"whitespace", "punctuation", "content_word"}


def test_the_headline_reads_the_metrics():
    runs = two_runs()
    m = cell_metrics(runs, CFG, 1e-3)
    c = m["convergence"]
    assert headline(m) == (
        f"median token converges at loop {c['median_loop']['value']:g}, "
        f"{c['share_after_r']['value']:.1%} still changing after R; useful depth "
        f"{R}; A1 exits at 3.00 loops on average")
    assert runs[0].describe().startswith(f"CE {runs[0].traj.ce[0].mean():.3f} at depth 1, ")
    assert runs[0].describe().endswith(f"at R = {R}, {runs[0].traj.ce[-1].mean():.3f} at "
                                       f"{4 * R}")
