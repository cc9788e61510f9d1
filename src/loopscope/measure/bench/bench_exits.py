"""The exit benchmark: the adaptive exit runtime's realized speedup, written as JSON.

    python -m loopscope.tools.bench exits [--cell backbone] [--repeats 5] [--out FILE]

(the stage bench_exits runs it through stages/bench_exits.py). Timings, so apart from the
reproducible metrics; every number that matters is a ratio of medians measured side by
side (loopscope.measure.bench.rounds). Not a test: nothing here asserts a speed.

Does the adaptive runtime (loopscope.measure.bench.runtime) turn a policy's saved loops into
wall-clock time? On the cell's first trained run, with each policy at the threshold the
policies stage chose on the `choose` windows (timed on the disjoint `report` windows),
for teacher-forced scoring (policies.batch_size windows per call) and for decoding (one
stream, and policies.batch_size streams decoded together, depth-wise batched), every
mode a median over bench.repeats (>= 3) interleaved rounds, each round's seconds kept.
Every ratio reads against the honest baseline, uniform depth B = min(R, M) with M the
smallest uniform depth that matches depth R's quality (metrics/policies' baseline_depth):
a per-token policy saves nothing unless it beats the depth a uniform model needs anyway.
The same ratio against depth R sits beside it (`_vs_r`).

    realized        time of uniform depth B / time of the policy (the headline)
    flop_speedup    FLOPs of uniform depth B / FLOPs of the same exit decisions, checks
                    included (LoopedModel.cost: attention at the mean query position). Not a
                    ceiling on `realized`: time is not proportional to FLOPs at this size
                    (at batch 1 a KL check costs less time than its FLOPs say, and A1
                    realizes more than its FLOP speedup)
    measured_speedup  the FLOP speedup with each loop and check costed at its measured
                    time for its number of active tokens (scoring only): what skipping
                    can give on this machine once per-call overheads are counted
    masked_forward_realized  time of uniform depth B / time of A1 through the masked
                    forward (scoring; paper B's setting, which skips no work)
    ledger          for the policy realizing most in scoring, each mode's time split into
                    loops, key/value handling, gathering, checks, once-per-token work
                    and the rest (loopscope.measure.bench.ledger), beside uniform depth B run
                    through the same runtime
    depth_check     each mode's check of its timings (below): uniform depth R's median
                    time over uniform depth B's against the bound, the rounds kept, set
                    aside (`retimed_seconds` keeps them) and still failing, their spread
    not_timed       each timed rule left out (no matched setting, or no exit before R)

A model whose `gathers` is False (loopscope.looped.interface: its blocks cannot run on a
subset of a batch's tokens, as the runtime calls them) is not timed at all: the JSON then
holds `timed: false` and `why`, and nothing else.

The depth check: only the loops grow with depth (the prelude, coda and readout run once a
token), so uniform depth R takes at most R/B the time of uniform depth B. Every round of
every mode is checked against R/B x (1 + DEPTH_SLACK); a round above it says the machine
changed speed inside the round, and is timed again; where rounds spread, more are timed
(loopscope.measure.bench.rounds.checked_rounds). A mode whose medians still break the bound is
flagged (`depth_check.holds` false): its ratios are the machine's noise as much as the
runtime's.

It imports neither the training benchmark (loopscope.tools.bench_train) nor the training loop
(loopscope.weights.train): the bench_exits stage depends on exactly the modules it imports
(tests/test_layout.py), and an edit to either must not rerun it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from loopscope.base.errors import ParamsError
from loopscope.base.machine import cpu_model
from loopscope.looped.interface import LoopedModel, run_loops
from loopscope.measure.bench import ledger, runtime
from loopscope.measure.bench.rounds import checked_rounds, interleaved, timed_round, top_ops
from loopscope.measure.exit_rules.exits import Policy, Uniform, make
from loopscope.measure.exit_rules.masked import flops_per_token, masked_forward
from loopscope.measure.exit_rules.rules import TIMED
from loopscope.measure.runs import Windows, measuring_threads, runs_of
from loopscope.weights.params import View

# The keys the benchmark reads (the bench_exits stage's params)
READS = ("bench.repeats", "bench.decode_tokens", "convergence.windows", "policies.first",
         "policies.every", "policies.batch_size")
MIN_REPEATS = 3  # every mode is a median over at least this many interleaved rounds
# The depth check's slack (module doc): uniform depth R may take up to R/B x (1 + this) the
# time of uniform depth B in a round. The bound R/B is already above what the model can
# take (the once-per-token work does not grow with depth); the slack is for timing
# jitter alone.
DEPTH_SLACK = 0.1
MODES = ("scoring", "generation_batch1", "generation_batched")


def _batches(w: Windows, size: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    return [(w.x[i:i + size], w.y[i:i + size], None if w.h0 is None else w.h0[i:i + size])
            for i in range(0, len(w.x), size)]


def _ce(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float(F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()))


def matched_policies(metrics: dict[str, Any], first: int, every: int) -> dict[str, Policy]:
    """Each rule of TIMED (loopscope.measure.exit_rules.rules) at the threshold the policies stage
    chose, where it exits before the cap: a rule that never matched depth R's quality, or
    matched it only by not exiting (a threshold of 0 is uniform depth R plus checks), has
    nothing to time."""
    reference = metrics["r"]
    return {rule: make(rule, metrics[rule]["threshold"], first, every)
            for rule in TIMED if metrics.get(rule, {}).get("matched")
            and metrics[rule]["mean_loops"] < reference}


def uniform_depth(model: LoopedModel, x: torch.Tensor, loops: int, h0: torch.Tensor | None
            ) -> torch.Tensor:
    """A plain forward pass at uniform depth `loops`, read out once at the last loop
    (through the interface: what the exit runtime is timed against)."""
    _, states = run_loops(model, x, loops, h0)
    return model.read(states[-1], last=True)


def calibrate(model: LoopedModel, x: torch.Tensor, h0: torch.Tensor | None,
              reads_logits: bool, repeats: int = 5) -> dict[str, Any]:
    """Measured seconds of one runtime loop and one check readout at several numbers of
    active tokens (random, spread over the batch), and of the work every token does
    once (prelude and final readout)."""
    scorer = runtime.Scorer(model, x, h0)
    g = torch.Generator().manual_seed(0)
    counts, loop_s, check_s = [], [], []
    for frac in (1.0, 0.75, 0.5, 0.3, 0.15, 0.08, 0.04):
        active = (torch.rand(x.shape, generator=g) < frac).to(x.device)
        active.view(-1)[0] = True
        jobs = {"loop": lambda a=active: scorer.advance(runtime.Layout.of(a), 2)}
        if reads_logits:
            jobs["check"] = lambda a=active: scorer.logits(runtime.Layout.of(a))
        got = interleaved(jobs, repeats)
        counts.append(int(active.sum()))
        loop_s.append(got["loop"])
        check_s.append(got.get("check", 0.0))
    order = np.argsort(counts)
    once = interleaved({"once": lambda: model.read(model.inputs(x), last=True)}, repeats)
    return {"active_tokens": np.array(counts)[order].tolist(),
            "loop_s": np.array(loop_s)[order].tolist(),
            "check_s": np.array(check_s)[order].tolist(), "once_s": once["once"]}


def _predicted(active_per_loop: list[int], checks: list[int], cal: dict[str, Any]) -> float:
    """Seconds of one batch from the calibration: each loop and check at its count."""
    at = cal["active_tokens"]
    return float(cal["once_s"] + sum(np.interp(n, at, cal["loop_s"]) for n in active_per_loop)
                 + sum(np.interp(n, at, cal["check_s"]) for n in checks))


def speedups(base: float, cost: dict[str, float]) -> dict[str, float]:
    """A baseline's cost (seconds, or FLOPs) over each policy's."""
    return {n: base / c for n, c in cost.items()}


def depth_bound(r: int, b: int) -> float:
    """The most uniform depth r may take against uniform depth b: r/b and the slack."""
    return r / b * (1 + DEPTH_SLACK)


def timed(time_round: Callable[[int], dict[str, float]], r: int, b: int, repeats: int,
          tokens: int, bar: tqdm | None = None) -> dict[str, Any]:
    """A mode's timings under the depth check (module doc): time_round(i) times round i
    of the mode's jobs, uniform depths r and b among them; each job's median seconds,
    every kept round, the rounds set aside by a retime, and the check on the medians."""
    ur, ub, bound = f"uniform_{r}", f"uniform_{b}", depth_bound(r, b)
    checked = checked_rounds(time_round, repeats, lambda got: got[ur] <= bound * got[ub], bar)
    seconds = {n: statistics.median(v) for n, v in checked.rounds.items()}
    ratio = seconds[ur] / seconds[ub]
    return {"seconds": seconds, "round_seconds": checked.rounds,
            "retimed_seconds": checked.retimed,
            "tokens_per_s": {n: tokens / v for n, v in seconds.items()},
            "depth_check": {"uniform": [r, b], "ratio": ratio, "bound": bound,
                            "holds": ratio <= bound,
                            "rounds": len(checked.rounds[ur]),
                            "retimed": len(checked.retimed.get(ur, [])),
                            "failed_rounds": checked.failed, "spread": checked.spread,
                            "extended": checked.extended}}


def _ratios(out: dict[str, Any], flops: dict[str, float], model: LoopedModel, r: int, b: int
            ) -> None:
    """The ratios of one mode (module doc): the policies' median seconds and FLOPs
    against uniform depth b's (the honest baseline) and depth R's."""
    seconds, cost = out["seconds"], model.cost()
    times = {n: seconds[n] for n in flops}
    out.update({"realized": speedups(seconds[f"uniform_{b}"], times),
                "realized_vs_r": speedups(seconds[f"uniform_{r}"], times),
                "flop_speedup": speedups(cost.uniform(b), flops),
                "flop_speedup_vs_r": speedups(cost.uniform(r), flops)})


def scoring(model: LoopedModel, w: Windows, policies: dict[str, Policy], r: int, b: int,
            batch: int, repeats: int, bar: tqdm | None = None) -> dict[str, Any]:
    """Teacher-forced scoring of the windows: uniform depths R and b (plain forward
    passes), every policy through the runtime, and A1 through the masked forward."""
    data = _batches(w, batch)
    decisions: dict[str, dict[str, Any]] = {}
    for name, policy in policies.items():
        runs = [runtime.score(model, xb, policy, r, hb) for xb, _, hb in data]
        exits = torch.cat([rn.exit_loop.flatten() for rn in runs]).cpu().numpy()
        checks = torch.cat([rn.checks.flatten() for rn in runs]).cpu().numpy()
        decisions[name] = {
            "mean_loops": float(exits.mean()),
            "ce": float(np.mean([_ce(rn.logits, yb) for rn, (_, yb, _) in
                                 zip(runs, data, strict=True)])),
            "flops": flops_per_token(model, exits, checks, policy.needs_logits),
            "active": [rn.active_per_loop for rn in runs],
            "checks": [[int(c) for c in _checks_per_loop(rn, policy, r)] for rn in runs],
        }
    jobs: dict[str, Callable[[], Any]] = {  # one job when b is R
        f"uniform_{k}": (lambda k=k: [uniform_depth(model, xb, k, hb) for xb, _, hb in data])
        for k in sorted({r, b})[::-1]}
    for name, policy in policies.items():
        jobs[name] = (lambda p=policy: [runtime.score(model, xb, p, r, hb)
                                        for xb, _, hb in data])
    if "kl" in policies:
        jobs["kl_masked_forward"] = lambda: [masked_forward(model, xb, policies["kl"], r, hb)
                                                 for xb, _, hb in data]
    for name in set(jobs) - set(policies):  # warm-up, untimed (the policies ran above)
        jobs[name]()
    out: dict[str, Any] = {"tokens": int(w.x.numel()), "batch_windows": batch,
                           **timed(lambda i: timed_round(jobs, i), r, b, repeats,
                                   int(w.x.numel()), bar)}
    seconds = out["seconds"]
    _ratios(out, {n: d["flops"] for n, d in decisions.items()}, model, r, b)
    cal = calibrate(model, data[0][0], data[0][2], any(p.needs_logits for p in policies.values()))
    uniform = {k: _predicted([data[0][0].numel()] * k, [], cal) * len(data) for k in (r, b)}
    predicted = {n: sum(_predicted(a, c, cal) for a, c in zip(d["active"], d["checks"],
                                                               strict=True))
                 for n, d in decisions.items()}
    out.update({
        "measured_speedup": speedups(uniform[b], predicted),
        "measured_speedup_vs_r": speedups(uniform[r], predicted),
        "mean_loops": {n: d["mean_loops"] for n, d in decisions.items()},
        "ce": {n: d["ce"] for n, d in decisions.items()},
        "calibration": cal,
    })
    if "kl" in policies:
        masked = seconds["kl_masked_forward"]
        out["masked_forward_realized"] = seconds[f"uniform_{b}"] / masked
        out["masked_forward_realized_vs_r"] = seconds[f"uniform_{r}"] / masked
    return out


def _checks_per_loop(rn: runtime.ScoreRun, policy: Policy, r: int) -> list[int]:
    """How many tokens each check of a scoring run read out (the active ones)."""
    if not policy.needs_logits:
        return []
    return [n for loop, n in enumerate(rn.active_per_loop, 1)
            if loop < r and policy.checks_at(loop)]


def decoding(model: LoopedModel, w: Windows, policies: dict[str, Policy], r: int, b: int,
             streams: int, tokens: int, repeats: int, bar: tqdm | None = None
             ) -> dict[str, Any]:
    """Token-by-token decoding, teacher-forced on the first `streams` windows cut to
    `tokens` tokens, streams depth-wise batched; uniform depths R and b through the same
    decoder (every token runs the cap)."""
    x, y = w.x[:streams, :tokens], w.y[:streams, :tokens]
    h0 = None if w.h0 is None else w.h0[:streams, :tokens]
    configs: dict[str, tuple[Policy, int]] = {f"uniform_{k}": (Uniform(), k)
                                              for k in sorted({r, b})[::-1]}
    configs.update({n: (p, r) for n, p in policies.items()})
    jobs = {n: (lambda p=p, cap=cap: runtime.generate(model, x, p, cap, h0))
            for n, (p, cap) in configs.items()}
    runs = {n: job() for n, job in jobs.items()}  # the decisions, and the warm-up
    out: dict[str, Any] = {"streams": streams, "tokens_per_stream": tokens,
                           **timed(lambda i: timed_round(jobs, i), r, b, repeats,
                                   int(x.numel()), bar)}
    flops = {n: flops_per_token(model, runs[n].exit_loop.cpu().numpy(),
                                runs[n].checks.cpu().numpy(), p.needs_logits)
             for n, p in policies.items()}
    _ratios(out, flops, model, r, b)
    out.update({
        "steps": {n: rn.steps for n, rn in runs.items()},
        "mean_loops": {n: float(rn.exit_loop.float().mean()) for n, rn in runs.items()},
        "ce": {n: _ce(rn.logits, y) for n, rn in runs.items()},
    })
    return out


def ledgers(model: LoopedModel, w: Windows, name: str, policy: Policy, r: int, b: int,
            batch: int, tokens: int, repeats: int, bar: tqdm | None = None
            ) -> dict[str, Any]:
    """Where the time goes (loopscope.measure.bench.ledger), in each mode, for one policy at
    its matched threshold and for uniform depth b through the same runtime: the
    seconds of each part (its marks timed; the call of median wall time), and the same
    calls' median seconds without the marks (`measured`, interleaved), against which
    the parts are checked. `bar` advances a step a mode."""
    xb, hb = w.x[:batch], None if w.h0 is None else w.h0[:batch]
    xs, hs = w.x[:, :tokens], None if w.h0 is None else w.h0[:, :tokens]

    def decode(n: int) -> Callable[[Policy, int], Any]:
        return lambda p, cap: runtime.generate(model, xs[:n], p, cap,
                                               None if hs is None else hs[:n])
    calls: dict[str, Callable[[Policy, int], Any]] = {
        "scoring": lambda p, cap: runtime.score(model, xb, p, cap, hb),
        "generation_batch1": decode(1), "generation_batched": decode(batch)}
    modes = {}
    for mode, call in calls.items():
        jobs = {f"uniform_{b}": lambda c=call: c(Uniform(), b),
                name: lambda c=call: c(policy, r)}
        modes[mode] = {"parts": _median_ledgers(jobs, repeats, w.x.device),
                       "measured": interleaved(jobs, repeats)}
        if bar is not None:
            bar.set_description(f"bench exits: ledger ({mode})")
            bar.update()
    return {"policy": name, "uniform_depth": b, "labels": ledger.PARTS, "modes": modes}


def _median_ledgers(jobs: dict[str, Callable[[], Any]], repeats: int,
                    device: torch.device) -> dict[str, dict[str, float]]:
    """Each job's ledger (its marks timed) over `repeats` interleaved calls: the call
    of median wall time, so its parts are one call's and comparable with the median of
    the unmarked calls."""
    calls: dict[str, list[dict[str, float]]] = {n: [] for n in jobs}
    for _ in range(repeats):
        for n, job in jobs.items():
            calls[n].append(ledger.measure(job, device))
    return {n: sorted(c, key=lambda x: x["wall"])[len(c) // 2] for n, c in calls.items()}


def profile(model: LoopedModel, w: Windows, policy: Policy, r: int, batch: int) -> list[dict]:
    """Where one runtime scoring call spends its time."""
    xb, hb = w.x[:batch], None if w.h0 is None else w.h0[:batch]
    return top_ops(lambda: runtime.score(model, xb, policy, r, hb))


def not_timed(metrics: dict[str, Any]) -> dict[str, str]:
    """Each rule of TIMED that matched_policies leaves out, and why."""
    out = {}
    for rule in TIMED:
        q = metrics.get(rule)
        if q is None:
            out[rule] = "not swept"
        elif not q.get("matched"):
            out[rule] = "no setting matched depth R's quality"
        elif q["mean_loops"] >= metrics["r"]:
            out[rule] = "matched only by running every token to depth R"
    return out


def exits(params: View, cell: str, metrics: dict[str, Any], repeats: int | None = None
          ) -> dict[str, Any]:
    """The exit benchmark (module doc) on `cell`, whose policies stage wrote metrics
    (metrics/policies/<cell>.json). params: bench.repeats, bench.decode_tokens,
    convergence.windows, policies.first, .every and .batch_size (READS). A progress bar
    counts the modes' rounds, then the ledger's modes. cell may name an outside model
    (its run reaches the runtime through the looped-model interface alone, like a
    trained cell's)."""
    repeats = params.bench.repeats if repeats is None else repeats
    if repeats < MIN_REPEATS:
        raise ParamsError(f"--repeats is {repeats}; every mode is a median over at least "
                          f"{MIN_REPEATS} interleaved rounds.")
    r, m, b = (metrics["r"], metrics["uniform"]["matched_depth"],
               metrics["baseline_depth"])
    first = next(runs_of(cell))
    tokens = min(params.bench.decode_tokens, first.context)
    model, cfg = first.model, params.policies
    if not getattr(model, "gathers", True):  # a layout the runtime cannot call on subsets
        return {"cell": cell, "run": first.tag, "timed": False,
                "why": f"{type(model).__name__} refuses calls on a subset of a batch's tokens "
                       "(its `gathers` is False), which the exit runtime makes: not timed"}
    if first.cell is not None:  # an outside model runs on outside.<name>.threads
        torch.set_num_threads(measuring_threads(cell) or first.cell.train.threads)
    sets = first.window_sets(params.convergence.windows, "convergence.windows")
    policies = matched_policies(metrics, cfg.first, cfg.every)
    report = sets["report"]
    with torch.no_grad(), tqdm(total=len(MODES) * repeats + len(MODES) * bool(policies),
                               desc="bench exits", unit="step", mininterval=2) as bar:
        def mode(name: str) -> tqdm:
            bar.set_description(f"bench exits: {name}")
            return bar
        result = {  # fp32 (first.compute), as the policies stage measured
            "cell": cell, "run": first.tag, "r": r, "matched_depth": m,
            "baseline_depth": b, "repeats": repeats,
            "thresholds": {n: metrics[n]["threshold"] for n in policies},
            "not_timed": not_timed(metrics),
            "check_schedule": {"first": cfg.first, "every": cfg.every},
            "machine": {"cpu": cpu_model(),
                        "threads": torch.get_num_threads(), "torch": torch.__version__,
                        "device": str(first.compute.device)},
            "scoring": scoring(model, report, policies, r, b, cfg.batch_size, repeats,
                               mode("scoring")),
            "generation_batch1": decoding(model, report, policies, r, b, 1, tokens, repeats,
                                          mode("generation_batch1")),
            "generation_batched": decoding(model, report, policies, r, b, cfg.batch_size,
                                           tokens, repeats, mode("generation_batched")),
        }
        if policies:
            best = max(policies, key=lambda n: result["scoring"]["realized"][n])
            result["profile"] = {"policy": best, "top_ops": profile(
                model, report, policies[best], r, cfg.batch_size)}
            result["ledger"] = ledgers(model, report, best, policies[best], r, b,
                                       cfg.batch_size, tokens, repeats, bar)
    return result


def headline(result: dict[str, Any]) -> str:
    """The scoring speedups against the baseline depth, in one line."""
    if result.get("timed") is False:
        return f"bench exits {result['cell']}: {result['why']}"
    s = result["scoring"]
    found = ", ".join(f"{n} {v:.2f}x (FLOPs {s['flop_speedup'][n]:.2f}x; "
                      f"{s['realized_vs_r'][n]:.2f}x vs depth {result['r']})"
                      for n, v in s["realized"].items())
    flagged = "".join(f"; {mode} fails the depth check (uniform {c['uniform'][0]} took "
                      f"{c['ratio']:.2f}x uniform {c['uniform'][1]}, bound {c['bound']:.2f}x)"
                      for mode in MODES if not (c := result[mode]["depth_check"])["holds"])
    return (f"bench exits {result['cell']}: scoring against uniform depth "
            f"{result['baseline_depth']}: {found}{flagged}")
