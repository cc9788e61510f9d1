"""Paper B's claims (per-token fixed-point convergence, exit rules, useful depth), one
function per claim with its criterion beside its logic. Every interval is computed by
the convergence and policies stages from one set of resamples per cell (documents first,
then their blocks); each claim states its comparisons (verdicts.Comparison), decided by the
family-wise rule, and its free parameters are the criteria's, swept for every row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from loopscope.judge.backbone import FINDINGS, RESULTS, Backbone, shares, steps, worst_step
from loopscope.judge.criteria import Criteria, criteria_of, specification
from loopscope.judge.metrics_b import ConvergenceMetrics
from loopscope.judge.policies_b import (
    a1_beats_a2,
    a1_below_baseline,
    a1_curve,
    a1_fewer_loops,
    a1_matches_quality,
    a1_saves_compute,
    a1_saves_counted,
    a2_saves_nothing,
)
from loopscope.judge.settling import settled
from loopscope.judge.verdicts import (
    FEW_SEEDS,
    Claim,
    Comparison,
    at_least,
    at_most,
    below,
    claim,
    effect,
    extension,
    inside,
    negligible,
    not_shown,
    seed_rule,
)
from loopscope.measure.trajectory.token_types import SMALLEST_TYPE
from loopscope.stats.intervals import Interval

# Paper B's KL decay, 3.9e-1 at loop 2 to 8.5e-6 at loop 16: log10 of the ratio
PAPER_KL_DECADES = math.log10(3.9e-1 / 8.5e-6)  # 4.66
PAPER_TAIL = 0.1  # "a tail of about 10% of tokens continues updating" at R
PAPER_MEDIAN = 0.75  # the median token converges at loop 6 of R = 8


def _pct(iv: Interval) -> str:
    return f"{iv.value:.1%} [{iv.lo:.1%}, {iv.hi:.1%}]"


def _shifted(raw: dict[str, float], by: float) -> dict[str, float]:
    """A stored interval minus a constant (a comparison with a threshold as an effect)."""
    return {**raw, **{k: raw[k] - by for k in ("value", "lo", "hi")}}


def elasticity(b: Backbone) -> Claim:
    """Paper B: "monotone improvement from 1 to 8", on its one statistic: no step
    k -> k+1 up to R makes CE worse by more than flat_nats. That the second half of the
    depth still helps is ours (elasticity_second_half, an extension)."""
    e, flat = b.metrics.elasticity, b.p.flat_nats
    tests = [b.test(f"CE({k + 1}) - CE({k})", e.steps[k], at_most, flat, unit="nats",
                    of="CE(k+1) - CE(k)") for k in sorted(steps(e))]
    worst = worst_step(e)
    worst_text = (f"; worst step CE({worst[0] + 1}) - CE({worst[0]}) {worst[1]}"
                  if worst is not None else "")
    return claim(
        f"Elasticity [{b.name}]: CE improves monotonically from depth 1 to {b.depth}",
        "monotone improvement from 1 to 8",
        f"every step CE(k+1) - CE(k), k < R, below +{flat:g} nats (upper bounds; paired "
        "intervals)",
        f"CE(1) - CE(R) {Interval.of(e.gain)}{worst_text} nats", tests, key="elasticity",
        source=f"{RESULTS}: 'a monotone quality improvement from depth 1 to 8'")


def elasticity_second_half(b: Backbone) -> Claim:
    """Beyond the paper (an extension of elasticity): the second half of the depth still
    helps, CE(R/2) - CE(R) above flat_nats. A curve that gains everything in its first
    loops and is flat after passes the paper's monotone test; this says whether loops
    R/2..R are used at all."""
    e, flat = b.metrics.elasticity, b.p.flat_nats
    return extension(claim(
        f"The second half of the depth still helps [{b.name}]: CE(R/2) > CE(R) + "
        f"{flat:g} nats, {b.depth}", "(not in the paper: it says 'monotone')",
        f"CE(R/2) - CE(R) above {flat:g} nats (lower bound; paired interval)",
        f"CE({e.half_depth}) - CE(R) {Interval.of(e.half_gain)} nats; CE(1) - CE(R) "
        f"{Interval.of(e.gain)} nats",
        [b.test(f"CE({e.half_depth}) - CE(R) - {flat:g}", _shifted(e.half_gain, flat),
                effect, 1, unit="nats")], key="elasticity_second_half"), "elasticity")


def flat_past_r(b: Backbone) -> Claim:
    """Paper B: "flat (3.20 nats) up to 32". Flat means every depth past R, not the
    last one alone: the largest |CE(D) - CE(R)| over D = R..4R inside flat_nats."""
    e = b.metrics.elasticity
    return claim(
        f"Past R the loss is flat [{b.name}]: CE(D) ~ CE(R) for D = R..{b.metrics.max_depth}, "
        f"{b.depth}", "flat at 3.20 nats from 8 to 32",
        f"max over D of |CE(D) - CE(R)| inside {b.p.flat_nats:g} nats (interval)",
        f"{Interval.of(e.flat)} nats (largest at D = {e.flat_depth}); CE(max D) - CE(R) "
        f"{Interval.of(e.tail)}",
        [b.test("max |CE(D) - CE(R)|", e.flat, negligible, b.p.flat_nats, unit="nats")],
        key="flat_past_r", source=f"{RESULTS}: 'the validation loss stabilizes (3.20 nats) "
        "even up to 32 loops'")


def kl_decay(b: Backbone) -> Claim:
    """Paper B: mean KL(p_i || p_{i-1}) 3.9e-1 at loop 2 -> 8.5e-6 at loop 16 (2R)."""
    k = b.metrics.kl_decay
    lo, hi = PAPER_KL_DECADES / b.p.kl_factor, PAPER_KL_DECADES * b.p.kl_factor
    kl = b.metrics.kl
    return claim(
        f"Successive outputs converge [{b.name}]: mean KL(p_i || p_(i-1)) falls from loop "
        f"{k.start} to loop {k.end} (2R, {b.depth})",
        "3.9e-1 -> 8.5e-6 (R = 8: loops 2 -> 16)",
        f"log10 KL(2R) / KL(2) < 0 (interval); magnitude: within {b.p.kl_factor:g}x of the "
        f"paper's {PAPER_KL_DECADES:.2f} decades, a log10 ratio in [{-hi:.2f}, {-lo:.2f}] "
        "(interval)",
        f"{kl[k.start]:.2e} -> {kl[k.end]:.2e}; log10 ratio {Interval.of(k.log10_ratio)}",
        [b.test("log10 KL(2R) / KL(2)", k.log10_ratio, effect, -1, unit="log10 ratio")],
        [b.test("log10 KL(2R) / KL(2)", k.log10_ratio, inside, -hi, -lo, unit="log10 ratio",
                paper=-PAPER_KL_DECADES)],
        key="kl_decay", source=f"{RESULTS}: mean KL 3.9e-1 at loop 2 to 8.5e-6 at loop 16")


def state_decay(b: Backbone) -> Claim:
    """Paper B: the state change per step decays, "a fixed point, not a cycle", on its
    one statistic: the mean relative change falls from R to 4R. Whether it decays to
    zero or levels off at a floor (a cycle or a drift still passes a test of decay),
    and how many tokens settle, is ours (state_decay_floor, an extension)."""
    s, ch = b.metrics.state_decay, b.metrics.state_change
    return claim(
        f"The state change per loop decays [{b.name}]",
        "decays: 'the system reaches a fixed point instead of turning in vain'",
        f"log10 of the mean relative change at loop {s.end} / at loop R < 0 (interval), "
        f"{b.depth}",
        f"{ch[s.start]:.2e} -> {ch[s.end]:.2e}; log10 ratio {Interval.of(s.log10_ratio)}",
        [b.test("log10 change(4R) / change(R)", s.log10_ratio, effect, -1,
                unit="log10 ratio")],
        key="state_decay", source=f"{RESULTS}: 'the state change decays per step, "
        "confirming a fixed point rather than turning in vain'")


def state_decay_floor(b: Backbone) -> Claim:
    """Beyond the paper (an extension of state_decay): a fixed point, not a cycle, in
    our two tests, both needed. Over the late window (claims.late_window) the floor the
    mean change levels off at, c of c + a rho^j fitted to the mean curve, is below
    floor_share of the mean change at D (a fixed point's floor is zero); and at least
    settling_share of the tokens settle, each judged on its own floor
    (loopscope.judge.settling). The mean floor is carried by the tokens that do not
    settle: the value says how many those are. The late decay per loop, the two-step
    change and the mean KL's odd/even alternation stand beside."""
    p = b.p
    text = f"The state change levels off at zero, not at a floor [{b.name}]"
    paper = "(not in the paper: it says 'a fixed point, not a cycle')"
    crit = (f"over the late window (the last {p.late_window:g}R loops): the floor c of c + "
            f"a rho^j fitted to the mean relative change below {p.floor_share:g} x the mean "
            "change at D (ratio; a fixed point's floor is 0), and at least "
            f"{p.settling_share:.0%} of tokens settling (share; a token settles where the "
            "lower end of its own floor's 95% interval is at most "
            f"{p.floor_share:g} x its change at D); a floor within {p.precision_floor:g} "
            f"float32 epsilons is rounding, {b.depth} (intervals)")
    found = settled(b)
    if found is None:
        return extension(not_shown(text, paper, crit, "no late-window floor in this "
                                    "backbone's metrics or per-token table: rerun its "
                                    "convergence stage"), "state_decay")
    w, c = found.window, b.conv["cycle"]
    value = (
        f"{found.loops}: floor {Interval.of(w['floor'])} (rho {w['rho']:g}), "
        f"{Interval.of(w['floor_share'])} of the change at D; tokens {found.text()} (the "
        "mean floor is carried by the tokens that do not settle); late decay per loop "
        f"{Interval.of(c['late_decay_per_loop'])}; two-step / one-step change "
        f"{Interval.of(w['two_step_ratio'])}; mean KL odd / even (log10) "
        f"{Interval.of(w['kl_alternation'])}")
    return extension(claim(text, paper, crit, value,
                            [found.floor_test(b), found.share_test(b)],
                            key="state_decay_floor"), "state_decay")


def period_two(b: Backbone) -> Claim:
    """Beyond the paper (an extension): over the late window (claims.late_window), do
    successive updates alternate in direction (a period-2 signature: h_i near h_(i-2)
    while it moves from h_(i-1))? Two tests, both needed: the mean two-step change over
    the mean one-step change below period2_ratio (a 2-cycle's is near 0, a monotone
    approach's about 2, uncorrelated steps' about sqrt 2), and the row's decisive number,
    the share of tokens whose two-step change at D is the smaller, at least
    period2_tokens."""
    c, p = b.conv["cycle"], b.p
    text = f"The late updates alternate in direction (a period-2 signature) [{b.name}]"
    paper = "(not in the paper: it says 'a fixed point, not a cycle')"
    crit = (f"over the last {p.late_window:g}R loops: mean ||h_i - h_(i-2)|| / mean "
            f"||h_i - h_(i-1)|| < {p.period2_ratio:g} (ratio), and the share of tokens whose "
            f"two-step change at D is the smaller at least {p.period2_tokens:.0%} (share; "
            "intervals)")
    w = b.conv.get("settling", {}).get("windows", {}).get(f"{p.late_window:g}R")
    if w is None:
        return extension(not_shown(text, paper, crit, "no late-window measurements in "
                                    "this backbone's metrics: rerun its convergence stage"),
                          "state_decay")
    share, back = c["period2_share"], Interval.of(w["backward_share"])
    return extension(claim(
        text, paper, crit,
        f"loops {w['from']}..{w['to']}: two-step / one-step {Interval.of(w['two_step_ratio'])}"
        f"; share of tokens whose two-step change at D is the smaller "
        f"{_pct(Interval.of(share))}; updates pointing back {_pct(back)}",
        [b.test("two-step / one-step change", w["two_step_ratio"], below, p.period2_ratio,
                unit="ratio"),
         b.test("share of tokens whose two-step change is the smaller", share, at_least,
                p.period2_tokens, unit="share")],
        key="period_two"), "state_decay")


def median_convergence(b: Backbone) -> Claim:
    """Paper B: "the median token converges at loop 6" with a tail "still updating" at 8.
    Both describe where a prediction stops moving for good, so the convergence loop
    (KL below epsilon from that loop on, through the largest depth measured) is the
    definition judged; A1's exit loop (the first loop KL drops below epsilon) is shown
    beside it: it is what the exit rule acts on, and is never later."""
    c, r, half = b.metrics.convergence, b.r, b.p.median_band
    ratio = {k: v / r for k, v in c.median_loop.items() if k in ("value", "lo", "hi")}
    lo, hi = PAPER_MEDIAN - half, PAPER_MEDIAN + half
    return claim(
        f"The median token converges before R [{b.name}] (epsilon {c.epsilon:g}, "
        f"{b.depth})", "median loop 6 at R = 8",
        "median convergence loop (KL stays below epsilon from it on) < R (interval); "
        f"magnitude: inside [{lo:g}, {hi:g}] x R, the paper's {PAPER_MEDIAN:g} R +- "
        f"{half:g} R (interval)",
        f"convergence loop {Interval.of(c.median_loop)} (resamples: "
        f"{shares(c.median_loop_shares)}); A1's exit loop (first drop below "
        f"epsilon) {Interval.of(c.median_exit_loop)} (resamples: "
        f"{shares(c.median_exit_loop_shares)})",
        [b.test("median convergence loop", c.median_loop, below, r, unit="loops")],
        [b.test("median convergence loop / R", {**c.median_loop, **ratio}, inside, lo, hi,
                unit="share of R", paper=PAPER_MEDIAN, of="median convergence loop")],
        key="median_convergence", source=f"{FINDINGS}: 'the median token converges at the "
        "sixth loop'")


def tail(b: Backbone) -> Claim:
    """Paper B: "a tail of about 10% of tokens continues updating" at the training mean."""
    share, band = b.metrics.convergence.share_after_r, b.p.tail_band
    lo, hi = PAPER_TAIL / band, PAPER_TAIL * band
    return claim(
        f"A tail of tokens is still updating at R [{b.name}] ({b.depth})", "~10%",
        f"share with a convergence loop after R at least {b.p.tail_floor:.0%} (interval; a "
        f"smaller share is no tail); magnitude: interval inside [{lo:.0%}, {hi:.0%}], the "
        f"paper's ~10% within {band:g}x", _pct(Interval.of(share)),
        [b.test("share converging after R", share, at_least, b.p.tail_floor, unit="share")],
        [b.test("share converging after R", share, inside, lo, hi, unit="share",
                paper=PAPER_TAIL)],
        key="tail", source=f"{FINDINGS}: 'a tail of about 10% of tokens continues updating "
        "at the training mean depth of eight'")


def token_order(b: Backbone) -> Claim:
    """Paper B: "whitespace shallowest, content words deepest". Both ends of the order,
    against every other type common enough to judge: whitespace below each, content
    words above each (paired intervals)."""
    t = b.conv["types"]
    text = (f"Convergence depth is ordered by token type [{b.name}]: whitespace shallowest, "
            "content words deepest")
    paper = "whitespace shallowest, content deepest"
    crit = ("mean convergence loop of whitespace - each other type < 0 and of content "
            f"words - each other type > 0 (paired intervals); types under "
            f"{SMALLEST_TYPE:.0%} of tokens are too rare to judge")
    rare = ", ".join(t.get("rare", [])) or "none"
    if "whitespace_minus" not in t or "content_minus" not in t:
        return not_shown(text, paper, crit, f"whitespace or content words too rare or "
                         f"absent (too rare: {rare})")
    of = "mean convergence loop of one token type - another's"
    tests = [b.test(f"whitespace - {k}", v, effect, -1, unit="loops", of=of)
             for k, v in t["whitespace_minus"].items()]
    tests += [b.test(f"content - {k}", v, effect, 1, unit="loops", of=of)
              for k, v in t["content_minus"].items()]
    means = ", ".join(f"{n} {t[n]['mean_loop']:.2f}" for n in t.get("judged", []))
    value = (f"means: {means}; " + "; ".join(f"{x.statistic} {x.iv}" for x in tests)
             + f"; too rare: {rare}")
    return claim(text, paper, crit, value, tests, key="token_order",
                 source=f"{RESULTS}: 'structural tokens (whitespace) exit earliest, content "
                 "tokens compute longest'")


def _saturates(backbones: list[Backbone], useful: list[Interval], regime: float
               ) -> list[Comparison]:
    """Every backbone's useful depth / m inside [regime, 2 - regime]."""
    return [Comparison(f"{b.name}: useful depth / m", i.map(lambda v, m=b.m: v / m), inside,
                       (regime, 2 - regime), unit="share of m", paper=1.0)
            for b, i in zip(backbones, useful, strict=True)]


def saturation(backbones: list[Backbone]) -> Claim:
    """Paper B's hypothesis: useful depth saturates at the training mean, 4 -> 4 and
    8 -> 8. It is a claim about two backbones: with one, nothing is tested. Judged on
    its own criterion: a backbone whose useful depth falls short contradicts it, and
    the regime marks beside it explain nothing away. Its specification curve runs over
    the sensitivity table's tolerances too (_saturation_row)."""
    text = "Useful depth saturates at the training-mean depth"
    paper = "mean 4 -> 4, mean 8 -> 8"
    regime = backbones[0].p.regime if backbones else 0.75
    crit = (f"useful depth (smallest depth within {{share}} of the gain CE(1) - CE(best)) "
            f"/ m inside [{regime:g}, {2 - regime:g}] for every backbone (interval; m the "
            "sampler's nominal mean, paper B's \"mean\")")
    if len(backbones) < 2:
        return replace(not_shown(text, paper, crit.format(share="a share"), "needs two "
                                 f"backbones of different R; this run has {len(backbones)}"),
                       key="saturation")
    share = backbones[0].metrics.saturation.share
    share = float("nan") if share is None else share
    return claim(text, paper, crit.format(share=f"{share:.0%}"),
                 "; ".join(f"{b.name}: m = {b.m:g} -> {b.useful} (resamples: "
                           f"{b.useful_shares})" for b in backbones),
                 _saturates(backbones, [b.useful for b in backbones], regime),
                 key="saturation", source=f"{FINDINGS}: 'models trained with a mean of 4 "
                 "saturate at depth 4; with a mean of 8, at depth 8' (a hypothesis)")


def _tolerance(row: dict[str, Any]) -> str:
    t = row["tolerance"]
    return f"{t:g} nats" if row["kind"] == "nats" else f"{t:.0%} of the gain"


ROWS_MAIN = (elasticity, elasticity_second_half, flat_past_r, kl_decay, state_decay,
             state_decay_floor, period_two, median_convergence, tail)
ROWS_POLICY = (a1_fewer_loops, a1_matches_quality, a1_below_baseline, a1_saves_compute,
               a1_saves_counted, a2_saves_nothing, a1_beats_a2, a1_curve)
# every row is named by its judge's name (its id's middle), kept where it is not shown


def _seed_metrics(metrics: dict[str, Any] | None, i: int | None) -> dict[str, Any] | None:
    """A backbone's metrics (convergence or policies): pooled (i None), or its i-th
    seed's own (`per_seed`, in seed order); a backbone of one seed is that seed."""
    if metrics is None or i is None or "per_seed" not in metrics:
        return metrics
    seeds = metrics["per_seed"]
    return seeds[sorted(seeds, key=lambda k: int(k.removeprefix("seed")))[i]]


Row = Callable[[list[Backbone]], Claim]
Extra = tuple[str, list[Any], Callable[[Any], Claim]]


@dataclass
class _Judging:
    """Paper B's backbones as every row reads them: their metrics (conv, pol), the
    names read (main first), the criteria's values (base). A row is judged on the
    backbones' pooled metrics, and with the seed rule on each seed's own."""

    conv: dict[str, dict[str, Any]]
    pol: dict[str, dict[str, Any]]
    names: list[str]
    base: Criteria

    def at(self, p: Criteria, i: int | None = None) -> list[Backbone]:
        """The backbones at criteria p, pooled or (i) the i-th seed's own."""
        return [Backbone(c, _seed_metrics(self.conv[c], i), _seed_metrics(self.pol.get(c), i),
                         p) for c in self.names]

    def seeded(self, row: Row, read: list[str]) -> Callable[[Criteria], Claim]:
        """The row at given criteria, with the seed rule over the backbones it reads."""
        few = [c for c in read if 1 < int(self.conv[c].get("seeds", 1)) < FEW_SEEDS]
        seeds = max((int(self.conv[c]["seeds"]) for c in few), default=0)

        def judged(p: Criteria) -> Claim:
            found = row(self.at(p))
            if found.direction != "not shown":
                seed_rule(found, [row(self.at(p.fresh(), i)) for i in range(seeds)], few)
            return found
        return judged

    def curve(self, row: Row, read: list[str], extra: list[Extra] | None = None) -> Claim:
        """The row at the criteria's values, over its specification curve."""
        return specification(self.seeded(row, read), self.base, extra or [])

    def moved(self, row: Row, read: list[str], move: Callable[[Backbone], Backbone]
              ) -> Claim:
        """The row at the criteria's values on moved backbones (another KL epsilon,
        another useful-depth tolerance), with the seed rule."""
        return self.seeded(lambda bs: row([move(b) for b in bs]), read)(self.base.fresh())


def paper_b_claims(conv: dict[str, dict[str, Any]], pol: dict[str, dict[str, Any]],
                   main: str | None, second: str | None, values: dict[str, float] | Criteria
                   ) -> list[Claim]:
    """Paper B's claims from metrics/convergence and metrics/policies of its backbones,
    each judged at the criteria's values (values: the claims section's), with the seed
    rule (a backbone of 2 seeds: a verdict stands only where each seed's own metrics
    agree) and over its specification curve. main: the backbone of paper B's main
    setting (mean depth 8 there), second: the other one of the saturation test (mean
    4); None: absent. Token order is judged on both backbones, one row each."""
    if main is None or main not in conv:
        why = "no paper B backbone in this run"
        return [replace(not_shown(text, paper, "-", why), key=key)
                for key, text, paper in (
                    ("elasticity", "Elasticity", "monotone to 8, flat after"),
                    ("median_convergence", "Per-token convergence", "median loop 6, ~10% at R"))]
    names = [main, *[c for c in (second,) if c is not None and c in conv]]
    j = _Judging(conv, pol, names, criteria_of(values))
    rows: list[tuple[Claim, list[str]]] = []
    for judge in (*ROWS_MAIN, *ROWS_POLICY):
        row = _first(_keyed(judge))
        rows.append((j.curve(row, [main], _epsilons(j, judge, row, main)), [main]))
    for i, name in enumerate(names):
        rows.append((j.curve(lambda bs, i=i: _keyed(token_order)(bs[i]), [name]), [name]))
    rows.append((_saturation_row(j), [*names[1:], main]))
    return [_marked(c, [Backbone(n, conv[n], pol.get(n), j.base) for n in read])
            for c, read in rows]


def _first(judge: Callable[[Backbone], Claim]) -> Row:
    return lambda backbones: judge(backbones[0])


def _keyed(judge: Callable[[Backbone], Claim]) -> Callable[[Backbone], Claim]:
    """The row a judge returns, named by the judge (a row not shown keeps its key)."""
    def keyed(b: Backbone) -> Claim:
        found = judge(b)
        found.key = judge.__name__
        return found
    return keyed


# The rows whose criterion reads the convergence loop, and so the KL epsilon it is
# measured at: their curves also run over convergence.sensitivity_epsilons
AT_EPSILON = ("median_convergence", "tail")


def _epsilons(j: _Judging, judge: Callable[[Backbone], Claim], row: Row, main: str
              ) -> list[Extra]:
    """The KL epsilon of the convergence loop as a swept parameter of the rows that
    read it, at the values the convergence stage measured (by_epsilon)."""
    measured = [c.epsilon for c in ConvergenceMetrics(j.conv[main]).by_epsilon]
    if judge.__name__ not in AT_EPSILON or not measured:
        return []
    return [("KL epsilon", measured,
             lambda eps: j.moved(row, [main],
                                 lambda b: b.at_epsilon(eps) if b.name == main else b))]


def _saturation_row(j: _Judging) -> Claim:
    """Saturation (backbones in the order second, main) over its criteria and over the
    sensitivity table's tolerances of the useful depth, with the seed rule."""
    def row(backbones: list[Backbone]) -> Claim:
        return saturation([*backbones[1:], backbones[0]])
    keys = [t.key for t in ConvergenceMetrics(j.conv[j.names[0]]).saturation.sensitivity]
    labels = [_tolerance({"kind": k, "tolerance": t}) for k, t in keys]
    def at(label: str) -> Callable[[Backbone], Backbone]:
        return lambda b: b.at_tolerance(keys[labels.index(label)])
    extra = [("useful depth's tolerance", labels,
              lambda label: j.moved(row, j.names, at(label)))]
    found = j.curve(row, j.names, extra if keys else [])
    found.facts["tolerances"] = [_at_tolerance(j, row, label, at(label)) for label in labels]
    return found


def _at_tolerance(j: _Judging, row: Row, label: str, move: Callable[[Backbone], Backbone]
                  ) -> dict[str, Any]:
    """The saturation row at one tolerance of the sensitivity table, as the report's
    table shows it: the verdict (with the seed rule, as the specification curve judges
    it) and each backbone's useful depth and regime state there."""
    moved = [move(b) for b in j.at(j.base.fresh())]
    return {"tolerance": label, "verdict": j.moved(row, j.names, move).verdict,
            "backbones": [{"backbone": b.name, "useful_depth": b.useful.to_dict(),
                           "state": b.state()} for b in moved]}


def _marked(c: Claim, read: list[Backbone]) -> Claim:
    """A row with the marks of the backbones it reads: useful depth, regime (in words
    and as data), what its intervals resample."""
    c.facts["backbones"] = [b.name for b in read]
    c.facts["regimes"] = [b.regime_fact() for b in read]
    return replace(c, depth_use="; ".join(b.depth_use for b in read),
                   regime="; ".join(b.regime() for b in read),
                   resampled="; ".join(b.resampled for b in read))
