"""Every verdict in the claims tables can come out either way: constructed metrics."""


import numpy as np
import pandas as pd
import pytest

from loopscope.claims import (
    CellA,
    Documents,
    Interval,
    at_least,
    bootstrap,
    bootstrap_mean,
    effect,
    negligible,
    paper_a_claims,
    paper_b_claims,
)


def iv(value, lo=None, hi=None):
    return {"value": value, "lo": value - 0.01 if lo is None else lo,
            "hi": value + 0.01 if hi is None else hi}


def conv(r=8, useful=8, gain=0.2, tail=0.0, kl2=0.4, kl2r=1e-5, change=(1e-2, 1e-4),
         median=6, share=0.1, types=(2.0, 6.0)):
    d = 4 * r
    return {
        "reference_depth": r, "max_depth": d,
        "elasticity": {"gain": iv(gain), "tail": iv(tail, tail - 0.005, tail + 0.005),
                       "margin": 0.01},
        "kl": {"k2": kl2, f"k{2 * r}": kl2r},
        "state_change": {f"k{r}": change[0], f"k{d}": change[1]},
        "convergence": {"epsilon": 1e-3, "median_loop": median,
                        "share_after_reference": iv(share)},
        "types": {"whitespace": {"mean_loop": types[0], "share": 0.2},
                  "content word": {"mean_loop": types[1], "share": 0.3},
                  "content_minus_whitespace": iv(types[1] - types[0])},
        "saturation": {"useful_depth": useful},
    }


def pol(r=8, kl_loops=5.0, kl_delta=0.0, probe_loops=7.9, matched_depth=7):
    return {"reference_depth": r, "match_nats": 0.01,
            "uniform": {"matched_depth": matched_depth},
            "kl": {"matched": True, "mean_loops": kl_loops, "threshold": 1e-3,
                   "delta_ce": iv(kl_delta, kl_delta - 0.004, kl_delta + 0.004),
                   "flops_ratio": 0.7},
            "probe": {"matched": True, "mean_loops": probe_loops, "threshold": 0.2,
                      "delta_ce": iv(0.0, -0.004, 0.004), "flops_ratio": 1.0}}


def verdicts(c, p, second=True):
    convs = {"main": c, "second": conv(r=4, useful=4)} if second else {"main": c}
    found = paper_b_claims(convs, {"main": p}, "main", "second" if second else None)
    return {claim.claim.split(":")[0].split(" (")[0]: claim for claim in found}


def test_paper_b_claims_hold_on_paper_like_metrics():
    found = verdicts(conv(), pol())
    assert {c.verdict for c in found.values()} == {"holds"}, \
        {k: c.verdict for k, c in found.items()}


@pytest.mark.parametrize("change, claim, verdict", [
    (dict(gain=-0.1), "Elasticity", "contradicted"),
    (dict(gain=0.05), "Elasticity", "holds"),  # direction holds, magnitude does not
    (dict(tail=-0.05), "Past R the loss is flat", "contradicted"),
    (dict(tail=0.008), "Past R the loss is flat", "inconclusive"),
    (dict(kl2r=1.0), "Successive outputs converge", "contradicted"),
    (dict(change=(1e-3, 1e-2)), "The state change per loop decays", "contradicted"),
    (dict(median=9), "The median token converges before R", "contradicted"),
    (dict(share=0.0), "A tail of tokens is still updating at R", "inconclusive"),
    (dict(types=(6.0, 2.0)), "Convergence depth is ordered by token type", "contradicted"),
    (dict(useful=12), "Useful depth saturates at the training-mean depth", "contradicted"),
])
def test_each_paper_b_claim_can_fail(change, claim, verdict):
    assert verdicts(conv(**change), pol())[claim].verdict == verdict


def test_magnitude_has_its_own_verdict():
    found = verdicts(conv(gain=0.05, share=0.5), pol())
    assert found["Elasticity"].magnitude == "contradicted"
    assert found["A tail of tokens is still updating at R"].magnitude == "contradicted"


@pytest.mark.parametrize("change, verdict", [
    (dict(kl_loops=8.0), "contradicted"),          # saves nothing
    (dict(kl_delta=0.05), "contradicted"),         # quality lost
    (dict(kl_delta=0.008), "inconclusive"),        # interval crosses the margin
])
def test_a1_claim_can_fail(change, verdict):
    a1 = next(c for k, c in verdicts(conv(), pol(**change)).items() if k.startswith("A1"))
    assert a1.verdict == verdict


def test_a1_magnitude_compares_with_the_smallest_matching_uniform_depth():
    a1 = next(c for k, c in verdicts(conv(), pol(kl_loops=6.5, matched_depth=6)).items()
              if k.startswith("A1"))
    assert a1.verdict == "holds" and a1.magnitude == "contradicted"


def test_a2_claim_can_fail_when_the_probe_saves_loops():
    a2 = next(c for k, c in verdicts(conv(), pol(probe_loops=4.0)).items() if k.startswith("A2"))
    assert a2.verdict == "contradicted"


def test_paper_b_claims_are_not_shown_without_a_backbone():
    found = paper_b_claims({}, {}, None, None)
    assert found and {c.verdict for c in found} == {"not shown"}


def test_interval_verdicts():
    assert effect(Interval(1, 0.5, 1.5), +1) == "holds"
    assert effect(Interval(-1, -1.5, -0.5), +1) == "contradicted"
    assert effect(Interval(0.1, -0.5, 0.7), +1) == "inconclusive"
    assert effect(Interval(-1, -1.5, -0.5), -1) == "holds"
    assert negligible(Interval(0, -0.005, 0.005), 0.01) == "holds"
    assert negligible(Interval(0.1, 0.05, 0.15), 0.01) == "contradicted"
    assert negligible(Interval(0.0, -0.02, 0.02), 0.01) == "inconclusive"
    assert at_least(Interval(0.2, 0.15, 0.25), 0.1) == "holds"
    assert at_least(Interval(0.05, 0.0, 0.08), 0.1) == "contradicted"


def test_document_bootstrap_is_wider_than_a_token_bootstrap_when_documents_differ():
    rng = np.random.default_rng(0)
    docs = np.repeat(np.arange(20), 200)
    values = rng.normal(size=20)[docs] + 0.1 * rng.normal(size=len(docs))
    by_doc = bootstrap_mean(values, docs, 500)
    by_token = bootstrap_mean(values, np.arange(len(values)), 500)
    assert by_doc.lo < by_doc.value < by_doc.hi
    assert (by_doc.hi - by_doc.lo) > 3 * (by_token.hi - by_token.lo)
    ratio = bootstrap({"a": values, "n": np.ones_like(values)}, docs,
                      lambda s: s["a"] / s["n"], 500)
    assert ratio.value == pytest.approx(values.mean())


DOCS, PER_DOC, LOOPS, SWEEP = 20, 50, 4, 12


def cell_a(group: str = "scale-controlled", readout: str = "raw", loss: str = "per_loop",
           norm=(20.0, 20.0), tail=(0.1, 0.1), ce=(4.3, 3.8), cos=1e-2, slope=0.0,
           clamp=0.001, recipe: str = "ours", seed: int = 0) -> CellA:
    """A constructed cell: per-token norms at loops 1 and K (lognormal: centre, sigma),
    CE at loops 1 and K, radial fraction at K; a sweep whose angular step goes like
    s**slope while the scale grows (Lemma 2: -1); clamp delta CE at K."""
    rng = np.random.default_rng(seed)
    n = DOCS * PER_DOC
    doc = np.repeat(np.arange(DOCS), PER_DOC)
    noise = rng.normal(0, 0.05, n)
    tokens = {"doc": doc}
    for k in range(LOOPS + 1):
        f = k / LOOPS
        centre = norm[0] * (norm[1] / norm[0]) ** f
        sigma = tail[0] + (tail[1] - tail[0]) * f
        tokens[f"norm_{k}"] = centre * rng.lognormal(0, sigma, n)
    for k in range(1, LOOPS + 1):
        tokens[f"ce_{k}"] = ce[0] + (ce[1] - ce[0]) * (k - 1) / (LOOPS - 1) + noise
        tokens[f"cos_{k}"] = cos * rng.lognormal(0, 0.3, n)
        tokens[f"floor_{k}"] = np.full(n, 1e-9)
    sweep = {"doc": np.arange(DOCS), "tokens": np.full(DOCS, float(PER_DOC))}
    for k in range(1, SWEEP + 1):
        scale = 10.0 * 1.5 ** k * rng.lognormal(0, 0.02, DOCS)
        step = 0.3 * (1.5 ** (k - 1)) ** slope * rng.lognormal(0, 0.02, DOCS)
        sweep[f"scale_{k}"] = scale * PER_DOC
        sweep[f"step_{k}"] = step * PER_DOC
    iv = {"value": clamp, "lo": clamp - 0.003, "hi": clamp + 0.003}
    return CellA(group, loss, readout, recipe, LOOPS, pd.DataFrame(tokens), pd.DataFrame(sweep),
                 {"freeze_loop1": {"delta_ce_last": iv}, "remove_radial": {"delta_ce_last": iv}},
                 {f"k{k}": 1000.0 for k in range(1, 5)}, {f"k{k}": 1e6 for k in range(1, 5)})


NORMED = dict(group="normed baseline", readout="normed", norm=(40.0, 4000.0),
              tail=(0.1, 0.6), ce=(4.0, 4.0), cos=1e-9, slope=-1.0)


def paper_a_cells(**normed) -> dict[str, CellA]:
    return {
        "perloop_normed": cell_a(**{**NORMED, **normed}),
        "perloop_raw": cell_a(seed=1),
        "perloop_penalty": cell_a(readout="normed", ce=(4.2, 3.85), cos=1e-9, seed=2),
    }


CLAIMS_A = ["drift", "tail", "lemma1", "lemma2", "k-invariance", "depth gain", "frontier",
            "clamp"]


def verdicts_a(cells: dict[str, CellA]) -> dict[str, str]:
    found = paper_a_claims(cells, 0.01, 200)
    return dict(zip(CLAIMS_A, [c.verdict for c in found], strict=True))


def test_paper_a_claims_hold_on_paper_like_metrics():
    found = paper_a_claims(paper_a_cells(), 0.01, 200)
    assert [c.verdict for c in found] == ["holds"] * 8, [(c.claim, c.value) for c in found]
    assert {c.magnitude for c in found} <= {"holds", "n/a"}, [c.value for c in found]


@pytest.mark.parametrize("claim, normed, verdict", [
    ("drift", dict(norm=(40.0, 15.0)), "contradicted"),
    ("tail", dict(tail=(0.6, 0.1)), "contradicted"),
    ("lemma1", dict(cos=1e-1), "contradicted"),
    ("lemma2", dict(slope=0.5), "contradicted"),
    ("k-invariance", dict(ce=(4.5, 4.0)), "contradicted"),
    ("k-invariance", dict(ce=(4.01, 4.0)), "inconclusive"),
    ("depth gain", dict(ce=(5.0, 4.0)), "contradicted"),
    ("frontier", dict(ce=(3.0, 3.0)), "contradicted"),
    ("clamp", dict(clamp=0.05), "contradicted"),
    ("clamp", dict(clamp=0.009), "inconclusive"),
])
def test_each_paper_a_claim_can_fail(claim, normed, verdict):
    assert verdicts_a(paper_a_cells(**normed))[claim] == verdict


def test_lemma2_magnitude_fails_when_the_step_does_not_shrink_like_one_over_s():
    found = paper_a_claims(paper_a_cells(slope=-0.2), 0.01, 200)[3]
    assert (found.verdict, found.magnitude) == ("holds", "contradicted")


def test_a_mean_shift_is_not_a_heavy_tail():
    # every token grows alike: p99/median stays put
    found = verdicts_a(paper_a_cells(tail=(0.3, 0.3)))
    assert found["tail"] in ("inconclusive", "contradicted")


def test_drift_under_another_recipe_gets_its_own_row():
    cells = paper_a_cells()
    cells["perloop_normed_ref"] = cell_a(**{**NORMED, "norm": (40.0, 50.0)}, recipe="ref")
    cells["perloop_raw_ref"] = cell_a(recipe="ref", seed=3)
    found = paper_a_claims(cells, 0.01, 200)
    assert len(found) == 9 and "[ref]" in found[1].claim
    assert found[1].verdict == "holds" and found[1].magnitude == "contradicted"
    assert found[0].value == paper_a_claims(paper_a_cells(), 0.01, 200)[0].value


def test_paper_a_claims_are_not_shown_without_their_cells():
    found = paper_a_claims({"perloop_raw": cell_a()}, 0.01, 200)
    assert {c.verdict for c in found} == {"not shown"}


def test_weighted_quantile_matches_numpy_on_the_sample():
    rng = np.random.default_rng(0)
    values, docs = rng.normal(size=999), np.repeat(np.arange(9), 111)
    draws = Documents(docs, 50).quantile(docs, values, 0.5)
    assert draws[0] == pytest.approx(np.quantile(values, 0.5, method="inverted_cdf"))
    assert draws[1:].std() > 0
