"""Every verdict in the claims tables can come out either way: constructed metrics."""

import copy

import numpy as np
import pytest

from loopscope.claims import (
    CellA,
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


# ------------------------------------------------------------------------- paper A

def cell_a(group, loss="per_loop", norm=(10.0, 12.0), median=(9.0, 11.0), p99=(15.0, 20.0),
           ppl=(100.0, 90.0), radial=1e-2, slope=-0.2, delta=0.001):
    k = {"k1": 0, "k4": 1}
    pick = lambda pair: {key: pair[i] for key, i in k.items()}  # noqa: E731
    return CellA(group, loss, pick(norm), pick(median), pick(p99), {"k4": 0.0}, pick(ppl),
                 {"k4": radial}, {"k4": slope}, {"k4": delta}, {"k1": 1.0, "k4": 1.0})


def paper_a_cells():
    return {
        "perloop_normed": cell_a("normed baseline", norm=(40, 4000), median=(40, 3000),
                                 p99=(60, 9000), ppl=(100, 99), radial=1e-9, slope=-0.9),
        "perloop_raw": cell_a("scale-controlled", ppl=(110, 90)),
        "perloop_penalty": cell_a("scale-controlled", ppl=(105, 88)),
    }


def test_paper_a_claims_hold_on_paper_like_metrics():
    found = paper_a_claims(paper_a_cells())
    assert [c.verdict for c in found] == ["holds"] * 7, [c.value for c in found]


@pytest.mark.parametrize("cell, change, index", [
    ("perloop_normed", dict(norm=(40, 10)), 0),
    ("perloop_normed", dict(median=(40, 4000), p99=(60, 2000)), 1),
    ("perloop_normed", dict(radial=1e-3), 2),
    ("perloop_normed", dict(slope=0.3), 3),
    ("perloop_normed", dict(ppl=(150, 99)), 4),
    ("perloop_raw", dict(ppl=(110, 120)), 5),
    ("perloop_normed", dict(delta=0.05), 6),
])
def test_each_paper_a_claim_can_fail(cell, change, index):
    cells = copy.deepcopy(paper_a_cells())
    old = cells[cell]
    kwargs = dict(norm=(old.norm_mean["k1"], old.norm_mean["k4"]),
                  median=(old.norm_median["k1"], old.norm_median["k4"]),
                  p99=(old.norm_p99["k1"], old.norm_p99["k4"]),
                  ppl=(old.ppl["k1"], old.ppl["k4"]), radial=old.radial_fraction["k4"],
                  slope=old.slope["k4"], delta=old.delta_ce["k4"])
    if cell == "perloop_raw":
        cells["perloop_penalty"] = cell_a("scale-controlled", ppl=(105, 120))
    cells[cell] = cell_a(old.group, **{**kwargs, **change})
    assert paper_a_claims(cells)[index].verdict == "contradicted"


def test_paper_a_claims_are_not_shown_without_their_cells():
    found = paper_a_claims({"perloop_raw": cell_a("scale-controlled")})
    assert {c.verdict for c in found} == {"not shown"}
