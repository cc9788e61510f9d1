"""Paper B's convergence statistics on constructed trajectories: the two definitions of
when a token converged, the metrics the claims read, and disjoint window sets."""

import numpy as np
import pytest
import torch

from loopscope.convergence import (
    Trajectory,
    convergence_loop,
    cross_analysis,
    first_below,
    summarize,
)
from loopscope.data import document_ids
from loopscope.errors import DataError
from loopscope.paper_b import paper_b_claims
from loopscope.policies import PolicyResult
from loopscope.runs import document_window_sets
from loopscope.token_types import TOKEN_TYPES


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
    traj = Trajectory(ce=ce, kl=kl, change=change, angle=change.copy(),
                      argmax=np.zeros((d, n), np.int32), states=None)
    types[:3] = -1  # special tokens are left out
    return traj, docs, types


def metrics(**kw):
    traj, docs, types = trajectory(np.random.default_rng(0), **kw)
    return summarize(traj, docs, types, R, 1e-3, 0.01, 300, sampler_mean=R + 1.0)


def test_summarize_gives_every_claim_its_interval():
    m = metrics()
    assert m["sampler_mean"] == R + 1 and m["units"] == DOCS
    e = m["elasticity"]
    assert set(e["steps"]) == {f"k{k}" for k in range(1, R)}
    assert e["half_gain"]["value"] == pytest.approx(0.2, abs=0.01)
    assert e["flat"]["lo"] >= 0 and e["flat_depth"] >= R
    assert m["kl_decay"]["to"] == 2 * R and m["kl_decay"]["log10_ratio"]["hi"] < 0
    assert m["state_decay"]["log10_ratio"]["value"] < 0
    assert m["saturation"]["useful_depth"] == R
    med = m["convergence"]["median_loop"]
    assert med["lo"] <= med["value"] <= med["hi"]
    assert m["convergence"]["median_exit_loop"]["value"] <= med["value"]
    t = m["types"]
    assert t["excluded"] == 3 and "number" not in t
    assert set(t["whitespace_minus"]) == {"punctuation", "content word"}
    assert set(t["content_minus"]) == {"whitespace", "punctuation"}


def test_the_claims_read_what_summarize_writes():
    found = {c.claim.split(" [")[0]: c for c in paper_b_claims(
        {"b": metrics()}, {}, "b", None)}
    assert found["Elasticity"].verdict == "holds"
    assert found["Past R the loss is flat"].verdict == "holds"
    assert found["Convergence depth is ordered by token type"].verdict == "holds"
    assert found["Successive outputs converge"].verdict == "holds"


def test_a_worse_step_before_r_breaks_monotone_elasticity():
    found = {c.claim.split(" [")[0]: c for c in paper_b_claims(
        {"b": metrics(step_up=0.2)}, {}, "b", None)}
    assert found["Elasticity"].verdict == "contradicted"


def test_punctuation_deeper_than_content_words_breaks_the_order():
    # content - whitespace stays large; only the pairwise test sees punctuation deepest
    m = metrics(content_depth=3.0, punct_depth=6.0)
    assert m["types"]["content_minus"]["whitespace"]["lo"] > 0
    found = {c.claim.split(" [")[0]: c for c in paper_b_claims({"b": m}, {}, "b", None)}
    assert found["Convergence depth is ordered by token type"].verdict == "contradicted"


def test_rare_types_are_listed_not_judged():
    traj, docs, types = trajectory(np.random.default_rng(1))
    types[types == 1][:] = 0
    types = np.where((types == 1) & (np.arange(len(types)) % 20 != 0), 0, types)
    m = summarize(traj, docs, types, R, 1e-3, 0.01, 100)
    assert m["types"]["rare"] == ["punctuation"]
    assert "punctuation" not in m["types"]["whitespace_minus"]
    assert TOKEN_TYPES[1] == "punctuation"


def test_cross_analysis_picks_its_best_depth_on_the_choose_windows():
    traj, docs, _ = trajectory(np.random.default_rng(2))
    n = traj.ce.shape[1]
    run = PolicyResult(traj.ce[1], np.full(n, 2), np.ones(n), np.zeros(n))
    choose = np.full(traj.depth, 5.0)
    choose[6] = 1.0  # depth 7 is best on choose, whatever report says
    out = cross_analysis(traj, run, docs, choose, 100)
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
    from loopscope.config import TrainConfig
    from loopscope.convergence import training_mean

    assert training_mean(TrainConfig(depth="lognormal", depth_mean="loops"), 8) == 8
    assert training_mean(TrainConfig(depth="lognormal", depth_mean="loops_plus_one"), 8) == 9
    assert training_mean(TrainConfig(depth="fixed"), 4) == 4
