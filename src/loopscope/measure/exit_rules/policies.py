"""The policies stage's sweep (paper B): every setting of every exit rule on a run's
`choose` and `report` windows through the masked forward, each rule's threshold chosen
on `choose` at matched quality, and every outcome summarized on `report` with its
interval (metrics/policies/<cell>.json) and as frontier rows (tables/policies).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from loopscope.looped.interface import LoopedModel
from loopscope.measure.exit_rules.exits import KNOWN, NATIVE, make, never_exits, rule_defaults
from loopscope.measure.exit_rules.masked import (
    Loop,
    PolicyResult,
    evaluate,
    flops_per_token,
    pool,
    token_flops,
)
from loopscope.measure.exit_rules.oracle import Oracle, describe, rule_vs_oracle
from loopscope.measure.exit_rules.probe import fit_probe
from loopscope.measure.params import PoliciesConfig
from loopscope.measure.runs import Run
from loopscope.measure.trajectory.trajectories import trajectory, uniform_ce
from loopscope.stats.intervals import Documents, Sample
from loopscope.stats.units import Units


def sweep_settings(model: LoopedModel, x: torch.Tensor, y: torch.Tensor, h0: torch.Tensor | None,
                   cap: int, batch_size: int, grids: dict[str, list[float]], first: int,
                   every: int, probe: tuple[torch.Tensor, float] | None = None,
                   desc: str = "policies", freeze: bool = True
                   ) -> dict[tuple[str, float], PolicyResult]:
    """Every (rule, threshold) of the grids (settings) on one window set, capped at
    depth `cap`; a rule that reads the model's own exit score (exits.NATIVE) only
    where the model has one. A setting that cannot exit before the cap has the never-exiting run's
    outcome; every other one replays that run's loops up to its first exit (evaluate),
    so the sweep costs a fraction of one masked forward per setting, bit for bit.
    freeze: the exit semantics (masked.masked_forward; False: the published semantics of
    a model whose own exit runs every token to the cap)."""
    loops: list[list[Loop]] = []
    never = evaluate(model, x, y, h0, never_exits(first, every), cap, batch_size,
                     record=loops, freeze=freeze)
    out = {}
    swept = {rule: grid for rule, grid in grids.items()
             if rule not in NATIVE or model.exit_score is not None}
    for rule, threshold in tqdm(settings(swept), desc=desc, unit="setting", mininterval=5):
        policy = make(rule, threshold, first, every, probe, model.exit_score)
        out[(rule, threshold)] = (
            evaluate(model, x, y, h0, policy, cap, batch_size, replay=loops, freeze=freeze)
            if policy.can_exit(cap) else never)
    return out


@dataclass
class Outcome:
    """A policy setting on one window set, tokens of all seeds pooled."""

    rule: str
    threshold: float
    ce: np.ndarray
    loops: np.ndarray
    flops: float  # mean forward FLOPs per token
    checks: np.ndarray | None = None  # per token (None: uniform depth, no checks)
    pred: np.ndarray | None = None  # per token, the final output's argmax (None: not kept)

    def token_flops(self, model: LoopedModel, checks: bool = True) -> np.ndarray:
        """Per-token forward FLOPs (masked.token_flops), for the intervals; checks:
        whether the exit checks are counted (paper B's FLOPs proxy, mean depth, does not
        count them)."""
        counted = (np.zeros_like(self.loops) if self.checks is None or not checks
                   else self.checks)
        return token_flops(model, self.loops, counted, KNOWN[self.rule].needs_logits)

    @property
    def mean_ce(self) -> float:
        return float(self.ce.mean())

    @property
    def mean_loops(self) -> float:
        return float(self.loops.mean())


def matched(outcomes: list[Outcome], target: float, match: float) -> Outcome | None:
    """The setting with the fewest mean loops whose mean CE is within `match` nats of
    target (uniform depth R's), or None when no setting gets there."""
    ok = [o for o in outcomes if o.mean_ce <= target + match]
    return min(ok, key=lambda o: (o.mean_loops, o.flops)) if ok else None


def settings(grids: dict[str, list[float]]) -> list[tuple[str, float]]:
    """Every (rule, threshold) of the grids, in a fixed order."""
    return [(rule, float(t)) for rule, grid in grids.items() for t in grid]


def is_default(rule: str, threshold: float) -> bool:
    """Whether a setting is one of its rule's defaults (A0's depths never are)."""
    return rule != "uniform" and any(math.isclose(threshold, d, rel_tol=1e-9)
                                     for d in rule_defaults(rule))


def _at(group: list[Outcome], threshold: float) -> Outcome:
    found = [o for o in group if math.isclose(o.threshold, threshold, rel_tol=1e-9)]
    if not found:
        raise ValueError(f"policy {group[0].rule}: threshold {threshold:g} was not swept "
                         "(every default must be in the rule's grid)")
    return found[0]


def outcomes_of(model: LoopedModel, uniform: dict[str, np.ndarray],
                results: dict[tuple[str, float], dict[str, PolicyResult]]
                ) -> dict[str, dict[str, list[Outcome]]]:
    """Per window set and rule, every setting's outcome; A0 ("uniform") at depths 1..R."""
    cost = model.cost()
    outcomes: dict[str, dict[str, list[Outcome]]] = {}
    for s, ce in uniform.items():
        outcomes[s] = {"uniform": [Outcome("uniform", k, ce[k - 1], np.full(ce.shape[1], k),
                                           cost.uniform(k)) for k in range(1, len(ce) + 1)]}
    for (rule, threshold), per_set in results.items():
        for s, res in per_set.items():
            outcomes[s].setdefault(rule, []).append(Outcome(
                rule, threshold, res.ce, res.exit_loop,
                flops_per_token(model, res.exit_loop, res.checks, KNOWN[rule].needs_logits),
                res.checks, res.pred))
    return outcomes


SWEPT = ("choose", "report")  # the window sets a sweep runs on (probe: A2's training)
# The threshold of a cell's pooled setting where each seed runs the threshold it chose on
# its own `choose` windows (no rule's grid holds a negative threshold)
OWN = -1.0


@dataclass
class Sweep:
    """One run's sweep (seed) of a cell at depth R: per window set of SWEPT, the CE per
    token at uniform depths 1..R, (R, tokens), and every setting's result."""

    model: LoopedModel  # what the FLOPs are counted on: the same for every run of a cell
    r: int  # R, the evaluation depth (model.loops)
    docs: np.ndarray  # the resampling unit of each `report` token
    unit: str  # what a unit is (loopscope.stats.units)
    uniform: dict[str, np.ndarray] = field(default_factory=dict)
    results: dict[str, dict[tuple[str, float], PolicyResult]] = field(default_factory=dict)
    parents: np.ndarray | None = None  # each `report` token's document, for blocks
    seed: int = 0  # the run's seed
    oracle: Oracle | None = None  # the settle-depth oracle on the `report` tokens
    tokens: np.ndarray | None = None  # the input token id of each `report` token


def summarize_sweeps(sweeps: list[Sweep], match: float, resamples: int, key: str = ""
                     ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """metrics/policies/<cell>.json and the frontier rows of a cell: summarize over the
    tokens of every run pooled (per set and setting), so the choice of a threshold and
    every interval pool the cell's seeds (the intervals resample the seeds too, key: the
    cell's name); with the seed count and resampling units, and, for a cell of several
    seeds, each seed's own metrics (`per_seed`: its threshold chosen on its own `choose`
    windows; the seed rule reads them). A rule's pooled numbers are those of each seed
    running its own matched threshold, as paper B ran A1 on its one model, not of one
    threshold chosen for all seeds together (a threshold no seed chose); a rule some
    seed cannot match is unmatched (_own_choice)."""
    metrics, rows = _pooled(sweeps, match, resamples, key)
    metrics["seeds"] = len(sweeps)
    if len(sweeps) > 1:
        own = [_pooled([w], match, resamples, key) for w in sweeps]
        metrics["per_seed"] = {f"seed{w.seed}": m for w, (m, _) in zip(sweeps, own, strict=True)}
        metrics = {**metrics, **_own_choice(sweeps, [m for m, _ in own], match, resamples,
                                            key)}
        # a rule swept on the first seed alone (policies.first_seed_only): its numbers
        # are that seed's, marked so
        alone = sorted(_rules(sweeps[0]) - set.intersection(*map(_rules, sweeps)))
        for rule in alone:
            metrics[rule] = {**own[0][0][rule], "seeds": 1}
        rows += [row for row in own[0][1] if row["rule"] in alone]
        metrics["first_seed_only"] = alone
    return metrics, rows


def _rules(sweep: Sweep) -> set[str]:
    return {rule for rule, _ in sweep.results[SWEPT[0]]}


def _own_choice(sweeps: list[Sweep], seeds: list[dict[str, Any]], match: float,
                resamples: int, key: str) -> dict[str, dict[str, Any]]:
    """Each rule swept on every seed, measured as the seeds ran it: each seed at the
    threshold it chose on its own `choose` windows (seeds: each seed's own metrics), the
    tokens pooled, every interval over the same resamples of units and seeds as the
    pooled metrics. `threshold` is the first seed's (the run the exit benchmark times),
    `thresholds` every seed's; unmatched where a seed matches no setting."""
    shared = set.intersection(*map(_rules, sweeps))
    own = {r: [m[r]["threshold"] for m in seeds] for r in shared
           if all(m[r].get("matched") for m in seeds)}
    metrics, _ = _pooled(sweeps, match, resamples, key, own)
    out: dict[str, dict[str, Any]] = {r: {"matched": False, "unmatched_seeds": [
        f"seed{w.seed}" for w, m in zip(sweeps, seeds, strict=True) if not m[r].get("matched")]}
        for r in shared - set(own)}
    for rule, ts in own.items():
        out[rule] = {**metrics[rule], "threshold": ts[0], "chosen": "each seed's own",
                     "thresholds": {f"seed{w.seed}": t for w, t in zip(sweeps, ts, strict=True)},
                     "at_grid_edge": any(m[rule]["at_grid_edge"] for m in seeds)}
        if rule == "kl" and "probe" not in own:  # A2 not on each seed's own choice
            out[rule].pop("vs_probe", None)
    return out


def _pooled(sweeps: list[Sweep], match: float, resamples: int, key: str,
            own: dict[str, list[float]] | None = None
            ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """summarize over the tokens of the sweeps pooled; own: per rule, each sweep's own
    threshold, whose results pooled are the rule's setting (at threshold OWN)."""
    cell = sweeps[0]
    uniform = {s: np.concatenate([w.uniform[s] for w in sweeps], axis=1) for s in cell.uniform}
    results = {k: {s: pool([w.results[s][k] for w in sweeps]) for s in cell.results}
               for k in cell.results[SWEPT[0]]
               if all(k in w.results[SWEPT[0]] for w in sweeps)}
    for rule, ts in (own or {}).items():
        results[(rule, OWN)] = {s: pool([w.results[s][(rule, t)]
                                         for w, t in zip(sweeps, ts, strict=True)])
                                for s in cell.results}
    docs = np.concatenate([w.docs for w in sweeps])
    parents = None if cell.parents is None else np.concatenate([w.parents for w in sweeps])
    seeds = (np.concatenate([np.full(len(w.docs), w.seed) for w in sweeps])
             if len(sweeps) > 1 else None)
    sample = Sample(Documents(docs, resamples, parents=parents), docs, seeds, key)
    oracle = (None if any(w.oracle is None for w in sweeps)
              else Oracle.concat([w.oracle for w in sweeps]))
    metrics, rows = summarize(cell.model, uniform, results, sample, cell.r, match, oracle)
    metrics.update(Units(docs, cell.unit, parents).describe())
    return metrics, rows


def headline(metrics: dict[str, Any]) -> str:
    """Where each rule matches depth R's quality, in one line, from the metrics."""
    found = ", ".join(f"{rule} {m['mean_loops']:.2f} loops (FLOPs x{m['flops_ratio']:.2f}, "
                      f"x{m['flops_ratio_baseline']:.2f} of the baseline)"
                      if m.get("matched") else f"{rule} unmatched"
                      for rule, m in metrics.items() if isinstance(m, dict) and "matched" in m)
    return (f"depth-{metrics['r']} quality at: uniform depth "
            f"{metrics['uniform']['matched_depth']}, {found}")


@dataclass
class _Report:
    """What every number of a cell's policies metrics is read against on the `report`
    windows: one set of resamples of their units and the cell's seeds (sample: so every
    interval is paired and counts training noise), uniform depth R's outcome and the
    baseline's, uniform depth min(R, M)."""

    model: LoopedModel
    sample: Sample
    base: Outcome
    baseline: Outcome

    def interval(self, values: np.ndarray) -> dict[str, float]:
        return self.sample.interval(self.sample.mean(values)).to_dict()

    def delta(self, o: Outcome) -> dict[str, float]:
        """CE - CE(R) with its interval."""
        return self.interval(o.ce - self.base.ce)

    def measured(self, o: Outcome) -> dict[str, Any]:
        """A setting's outcome: loops, CE, and FLOPs against depth R's and the
        baseline's, with intervals (depth R's FLOPs are fixed): its checks counted, and
        not counted (paper B's proxy)."""
        iv = self.sample.interval
        flops = self.sample.mean(o.token_flops(self.model))  # per draw
        bare = self.sample.mean(o.token_flops(self.model, checks=False))
        return {"threshold": o.threshold, "mean_loops": o.mean_loops, "ce": o.mean_ce,
                "delta_ce": self.delta(o), "flops_ratio": o.flops / self.base.flops,
                "flops_ratio_baseline": o.flops / self.baseline.flops,
                "flops_ratio_iv": iv(flops / self.base.flops).to_dict(),
                "flops_ratio_baseline_iv": iv(flops / self.baseline.flops).to_dict(),
                "flops_ratio_unchecked_iv": iv(bare / self.base.flops).to_dict(),
                "flops_ratio_baseline_unchecked_iv": iv(bare / self.baseline.flops).to_dict()}


    def curve(self, report: list[Outcome], uniform: list[Outcome]) -> list[dict[str, Any]]:
        """A rule's quality-compute curve against uniform depth's (paper B's A1 figure):
        at each setting on `report` whose tokens do not all stop at one loop, CE minus
        uniform depth's CE at the same mean loops (the uniform curve interpolated
        linearly between the two depths around it, per token: a mix of those depths
        runs those mean loops), with its interval."""
        out = []
        for o in sorted((o for o in report if o.threshold != OWN), key=lambda o: o.mean_loops):
            if np.all(o.loops == o.loops.flat[0]):
                continue  # every token at one depth: uniform depth itself
            k = min(int(o.mean_loops), len(uniform) - 1)
            w = min(o.mean_loops - k, 1.0)
            mix = (1 - w) * uniform[k - 1].ce + w * uniform[k].ce
            out.append({"threshold": o.threshold, "mean_loops": o.mean_loops,
                        "delta_ce_uniform": self.interval(o.ce - mix)})
        return out

    def paired(self, a: Outcome, b: Outcome) -> dict[str, Any]:
        """Two policies' chosen settings on the same `report` tokens, paired: a's mean
        loops minus b's (and as a share of R) and a's CE minus b's, with intervals."""
        diff = (a.loops - b.loops).astype(np.float64)
        return {"loops_diff": self.interval(diff),
                "loops_diff_ratio": self.interval(diff / self.base.threshold),
                "ce_diff": self.interval(a.ce - b.ce)}


def _chosen(choose: list[Outcome], target: float, margin: float) -> Outcome | None:
    """A rule's setting on `choose`: the one with the fewest mean loops within `margin`
    of depth R's CE (target); where the seeds' own choices are pooled (a setting at
    OWN), that one. None: nothing matched."""
    own = [o for o in choose if o.threshold == OWN]
    return own[0] if own else matched([o for o in choose if o.threshold != OWN], target,
                                      margin)


def _rule_metrics(rule: str, choose: list[Outcome], report: list[Outcome],
                  chosen: Outcome | None, rep: _Report, baseline_depth: int
                  ) -> dict[str, Any]:
    """One rule's metrics at its chosen setting (_chosen), measured on `report`, beside
    its defaults."""
    if chosen is None:
        return {"matched": False}
    got = _at(report, chosen.threshold)
    swept = [o for o in choose if o.threshold != OWN]
    defaults = [rep.measured(_at(report, d)) for d in rule_defaults(rule)]
    return {
        "matched": True, **rep.measured(got),
        "mean_loops_iv": rep.interval(got.loops.astype(np.float64)),
        "loops_ratio_iv": rep.interval(got.loops / rep.base.threshold),
        "loops_ratio_baseline": got.mean_loops / baseline_depth,
        "default": defaults[0], "defaults": defaults,
        # the grid's most aggressive setting matched: the grid may stop too early
        "at_grid_edge": chosen is min(swept, key=lambda o: (o.mean_loops, o.flops)),
    }


def summarize(model: LoopedModel, uniform: dict[str, np.ndarray],
              results: dict[tuple[str, float], dict[str, PolicyResult]], sample: Sample,
              r: int, match: float, oracle: Oracle | None = None
              ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """metrics/policies/<cell>.json and the frontier rows, from pooled per-token results.

    uniform[set]: CE per depth 1..R and token, (R, N). results[(rule, threshold)][set].
    A setting is chosen on the `choose` windows: the fewest mean loops whose mean CE is
    within choose_nats = match / 2 of uniform depth R's there. The margin is half the
    claim's (match_nats), so that the CE difference measured on `report`, where every
    reported number comes from, is not at the claim's margin by construction. The same
    choice gives A0's matched depth M; min(R, M) is the honest baseline a policy's FLOPs
    are also read against. Intervals resample the `report` tokens' units (sample:
    documents first where the units are blocks within them, and the seeds). oracle: the
    settle-depth oracle on the `report` tokens; given it, every matched rule is read
    against it (loopscope.measure.exit_rules.oracle), and the oracle's own numbers are
    kept under "oracle".
    """
    choose = match / 2
    outcomes = outcomes_of(model, uniform, results)
    base = {s: group["uniform"][r - 1] for s, group in outcomes.items()}
    report_uniform = outcomes["report"]["uniform"]
    m = int(matched(outcomes["choose"]["uniform"], base["choose"].mean_ce, choose).threshold)
    rep = _Report(model, sample, base["report"], report_uniform[min(r, m) - 1])
    metrics: dict[str, Any] = {
        "r": r, "match_nats": match, "choose_nats": choose,
        "uniform": {"ce": {f"k{o.threshold}": o.mean_ce for o in report_uniform},
                    "flops": {f"k{o.threshold}": o.flops for o in report_uniform},
                    "matched_depth": m, "delta_ce": rep.delta(report_uniform[m - 1])},
        "baseline_depth": min(r, m),
    }
    got: dict[str, Outcome] = {}
    for rule, group in outcomes["choose"].items():
        if rule != "uniform":
            chosen = _chosen(group, base["choose"].mean_ce, choose)
            report = outcomes["report"][rule]
            metrics[rule] = _rule_metrics(rule, group, report, chosen, rep, min(r, m))
            if chosen is not None:
                got[rule] = _at(report, chosen.threshold)
    if "kl" in outcomes["report"]:  # A1 against uniform depth along the whole curve
        metrics["kl_curve"] = rep.curve(outcomes["report"]["kl"], report_uniform)
    if "kl" in got and "probe" in got:  # A1 against A2, on the same tokens
        metrics["kl"]["vs_probe"] = rep.paired(got["kl"], got["probe"])
    if oracle is not None:  # every matched rule against the settle-depth oracle
        metrics["oracle"] = describe(oracle, sample)
        for rule, o in got.items():
            if o.pred is not None:
                metrics[rule]["oracle"] = rule_vs_oracle(o.loops, o.pred, oracle, sample)
    rows = [{"set": s, "rule": o.rule, "threshold": o.threshold, "mean_loops": o.mean_loops,
             "ce": o.mean_ce, "flops": o.flops, "flops_ratio": o.flops / base[s].flops,
             "default": is_default(o.rule, o.threshold)}
            for s in outcomes for group in outcomes[s].values() for o in group
            if o.threshold != OWN]
    return metrics, rows


def sweep_run(run: Run, cfg: PoliciesConfig, windows: int, desc: str,
              first_seed: int | None = None, freeze: bool = True) -> Sweep:
    """One run's policy sweep at depth R (policies.Sweep): A2's probe fit on the `probe`
    windows (fit_probe), then on each set of SWEPT the uniform depths 1..R and every
    setting of policies.grids (policies.sweep_settings); a run other than its cell's
    first seed (first_seed; None: every run is) skips the rules of
    policies.first_seed_only. It lives here, beside fit_probe, because the probe's
    labels and the uniform depths' CE are read from trajectories; windows:
    convergence.windows, the windows per set; freeze: the exit semantics
    (masked.masked_forward)."""
    grids = (cfg.grids if first_seed is None or run.seed == first_seed else
             {rule: g for rule, g in cfg.grids.items() if rule not in cfg.first_seed_only})
    sets = run.window_sets(windows, "convergence.windows")
    r, batch, p = run.model.loops, cfg.batch_size, sets["probe"]
    probe = fit_probe(trajectory(run.model, p.x, p.y, p.h0, r, batch, keep_states=r - 1), r)
    report = sets["report"]
    sweep = Sweep(run.model, r, report.token_docs(), report.unit,
                  parents=report.token_parents(), seed=run.seed,
                  tokens=report.x.flatten().cpu().numpy())
    for s in SWEPT:
        w = sets[s]
        sweep.uniform[s] = uniform_ce(run.model, w.x, w.y, w.h0, r, batch)
        sweep.results[s] = sweep_settings(run.model, w.x, w.y, w.h0, r, batch,
                                          grids, cfg.first, cfg.every, probe,
                                          desc=f"{desc} {s}", freeze=freeze)
    return sweep


def attach_oracle(sweeps: list[Sweep], table: pd.DataFrame, depth: int) -> None:
    """Give each sweep the settle-depth oracle of its `report` tokens from the cell's
    tables/convergence (the convergence stage's uniform trajectory to `depth` on the
    same windows, seed by seed), after checking that the tokens are the same ones in
    the same order."""
    missing = {"settle_loop", "settle_loop_margin", "pred_r"} - set(table.columns)
    if missing:
        raise ValueError(f"tables/convergence lacks {sorted(missing)}: it was written by an "
                         "older convergence stage; rerun it (`dvc repro convergence@<cell>`)")
    for w in sweeps:
        rows = table[table["seed"] == w.seed]
        if w.tokens is None or not np.array_equal(rows["token_id"].to_numpy(), w.tokens):
            raise ValueError(f"tables/convergence: seed {w.seed}'s rows are not the `report` "
                             "tokens the policies ran on (rerun its convergence stage)")
        w.oracle = Oracle(rows["settle_loop"].to_numpy(np.int32),
                          rows["settle_loop_margin"].to_numpy(np.int32),
                          rows["pred_r"].to_numpy(), w.r, depth)
