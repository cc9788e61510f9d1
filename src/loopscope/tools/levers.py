"""Paper B's depth use, searched: what in the backbone's recipe moves its useful depth.

Paper B's backbones use their depth (useful depth = the training mean); at our scale the
default backbone uses far fewer of its R loops. Each entry of EXPERIMENTS changes one
lever of the `backbone` cell
(per-loop core size, width, training tokens, learning rate, the truncated-backprop
window, the depth sampler's sigma, the FFN, a prelude and coda, Parcae's stable
injection) and is one named `dvc
exp` experiment that retrains that cell alone and measures it (train@backbone ->
convergence@backbone: nothing else reruns). The `training tokens` axis is the trend:
8x around the default, does useful depth approach the training mean as training grows?
RUNTIME times the exit runtime (bench_exits) on one deeper backbone.

    python -m loopscope.tools.levers queue [NAME]  # queue every experiment (dvc exp run --queue)
    dvc exp run --run-all                    # run them one after another
    python -m loopscope.tools.levers collect [REV] # docs/depth/: results.json, the table, figure
    python -m loopscope.tools.levers add NAME [REV] # one finished experiment into results.json
    python -m loopscope.tools.levers render        # the figure and page again from results.json
    python -m loopscope.tools.levers command NAME  # the command that reruns one point here
    python -m loopscope.tools.levers check NAME    # after it: does it agree with results.json?

`make depth` does the first three. Every experiment, `default` included, varies the
search's own base recipe (SEARCH_BASE: paper B's sampler sigma 0.5, one seed), not whatever
params.yaml's backbone is now, so a point reruns to the same recipe on any later commit.
The results are read from `dvc exp show --json`,
so they are what the experiments measured; results.json records the commit they were
queued on. Every statistic is metrics/convergence/backbone.json's (intervals resample
documents): useful depth (smallest depth within convergence.useful_share of the gain,
depths 1..4R), elasticity (CE(1) - CE(R)), the tail (share of tokens whose convergence
loop is after R), and the training time from metrics/train_timings.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from loopscope.base import paths
from loopscope.base.errors import DataError, LoopscopeError, ParamsError
from loopscope.base.files import atomic_output, write_json
from loopscope.base.machine import cpu_model
from loopscope.base.outputs import loop_order
from loopscope.judge.params import ClaimsConfig
from loopscope.params import parse_params
from loopscope.render.summary import markdown_table, runtime_rows
from loopscope.stage import execute
from loopscope.stats.intervals import Interval
from loopscope.weights.resolve import resolve_cell

CELL = "backbone"  # the cell every experiment retrains
TARGET = f"convergence@{CELL}"  # dvc exp run reproduces this stage and its upstream only
RESULTS, FIGURE, PAGE = paths.DEPTH_RESULTS, paths.DEPTH_FIGURE, paths.DEPTH_PAGE
# A rerun agrees with the committed point within these (the acceptance of the trend).
AGREE_LOOPS = 1
AGREE_NATS = 0.02
TREND = "training tokens"
DEFAULT = "default recipe"
# The recipe the search varies: the backbone cell with paper B's sampler width, one seed.
# The pipeline's backbone has since moved to sigma 0.1 (this search's finding) and two
# seeds of 360 steps; the experiments keep 0.5, seed 42 and 720 steps so their points
# stay comparable with each other and rerunnable.
SEARCH_BASE: tuple[str, ...] = ("train.depth_sigma=0.5", "seeds=[42]", "train.steps=720")


@dataclass(frozen=True)
class Experiment:
    """One point of the search: a lever set to one value on the backbone cell.

    overrides: keys under cells.<CELL> ("train.steps=180"); axis/x: where the point is
    drawn (the trend's axis is training tokens, x then comes from the resolved cell)."""

    name: str
    lever: str
    overrides: tuple[str, ...]
    axis: str = TREND
    x: float | None = None
    target: str = TARGET  # the stage dvc exp run reproduces (with its upstream)
    series: str = DEFAULT  # the recipe: points of one series differ in tokens alone

    @property
    def sets(self) -> tuple[str, ...]:
        """SEARCH_BASE where the experiment does not set that key itself, then its own."""
        own = {o.split("=", 1)[0] for o in self.overrides}
        return tuple(o for o in SEARCH_BASE if o.split("=", 1)[0] not in own) + self.overrides

    def command(self, queue: bool = True) -> list[str]:
        sets = [a for o in self.sets for a in ("-S", f"++cells.{CELL}.{o}")]
        return (["dvc", "exp", "run"] + (["--queue", "-n", self.name] if queue else [])
                + [self.target] + sets)


def lever(name: str, label: str, *overrides: str, axis: str = TREND, x: float | None = None,
          series: str | None = None) -> Experiment:
    """A lever's experiment; its series is the lever (one recipe) unless given."""
    return Experiment(name, label, overrides, axis, x, series=series or label)


SIGMA025 = "depth sampler sigma 0.25"
EXPERIMENTS: tuple[Experiment, ...] = (
    # the trend: 8x of training tokens around the default (720 steps)
    Experiment("trend-steps-180", TREND, ("train.steps=180",)),
    Experiment("trend-steps-360", TREND, ("train.steps=360",)),
    Experiment("trend-steps-1440", TREND, ("train.steps=1440",)),
    # one lever at a time, at the default's tokens
    lever("lever-core1", "per-loop core: 1 block", "model.n_core=1", axis="model.n_core", x=1),
    lever("lever-width64", "per-loop core: width 64", "model.d_model=64",
          axis="model.d_model", x=64),
    lever("lever-lr006", "learning rate 0.006", "train.lr=0.006"),
    lever("lever-backprop8", "truncated backprop: 8 loops", "train.backprop_loops=8"),
    lever("lever-sigma025", SIGMA025, "train.depth_sigma=0.25", axis="train.depth_sigma",
          x=0.25),
    lever("lever-swiglu", "SwiGLU FFN", "model.ffn=swiglu"),
    lever("lever-prelude-coda", "prelude and coda: 1 block each", "model.n_prelude=1",
          "model.n_coda=1"),
    # further along the lever that moved depth use most: the sampler's sigma
    lever("lever-sigma01", "depth sampler sigma 0.1", "train.depth_sigma=0.1",
          axis="train.depth_sigma", x=0.1),
    # after the papers: Parcae's stable injection in place of the concat adapter
    lever("lever-stable", "stable injection (Parcae)", "model.inject=stable"),
)
# The exit runtime (bench_exits, after policies@backbone) on the backbone that uses its
# depth most at the default's cost (lever-sigma025: deeper useful depth, ~10% tail, the
# default's CE): the realized speedup against the smallest uniform depth that matches
# depth R, where a backbone needs more of its depth.
RUNTIME = Experiment("runtime-sigma025", f"the exit runtime, {SIGMA025}",
                     ("train.depth_sigma=0.25",), target="bench_exits")
BASELINE = Experiment("default", DEFAULT, ())  # SEARCH_BASE alone, at the default's tokens
BY_NAME = {e.name: e for e in (BASELINE, *EXPERIMENTS, RUNTIME)}


def dvc(args: list[str]) -> list[str]:
    """A dvc command line run by this interpreter (the venv's dvc, whatever PATH says)."""
    return [sys.executable, "-m", "dvc", *args]


def experiment(name: str) -> Experiment:
    if name not in BY_NAME:
        raise LoopscopeError(f"unknown experiment '{name}'; experiments: "
                             f"{', '.join(BY_NAME)}.")
    return BY_NAME[name]


def with_overrides(raw: dict[str, Any], e: Experiment) -> dict[str, Any]:
    """params.yaml's raw mapping with the experiment's overrides applied (a copy)."""
    out = copy.deepcopy(raw)
    for o in e.sets:
        key, value = o.split("=", 1)
        node = out["cells"][CELL]
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(value)
    return out


def validate(raw: dict[str, Any]) -> None:
    """Every experiment resolves to a valid backbone cell (before anything is queued)."""
    for e in BY_NAME.values():
        try:
            resolve_cell(parse_params(with_overrides(raw, e)), CELL)
        except ParamsError as err:
            raise ParamsError(f"experiment {e.name}: {err}") from None


def tokens(params_raw: dict[str, Any]) -> int:
    """Training tokens of the backbone cell under these params: steps x batch x context."""
    cell = resolve_cell(parse_params(params_raw), CELL)
    return cell.train.steps * cell.train.batch_size * cell.model.context


def point(e: Experiment, params_raw: dict[str, Any], conv: dict[str, Any],
          timing: dict[str, Any] | None, rev: str) -> dict[str, Any]:
    """One row of results.json from an experiment's params and metrics files."""
    r = int(conv["r"])
    n = tokens(params_raw)
    ce = loop_order(conv["ce_at_depth"])[1]  # in loop order: the file sorts k10 before k2
    choose = loop_order(conv.get("choose", {}).get("ce_at_depth", {}))[1]
    return {
        "name": e.name, "lever": e.lever, "series": e.series, "rev": rev, "axis": e.axis,
        "x": float(n if e.x is None else e.x), "tokens": n, "R": r,
        "useful_depth": Interval.of(conv["saturation"]["useful_depth_iv"]).to_dict(),
        # what the search ranks on: the `choose` windows, not the `report` ones the
        # claims are judged on (None: metrics from before the choose windows' curve)
        "choose_useful_depth": conv.get("choose", {}).get("useful_depth"),
        "choose_elasticity": choose[0] - choose[r - 1] if len(choose) >= r else None,
        "elasticity": conv["elasticity"]["gain"],
        "tail": conv["convergence"]["share_after_r"],
        "best_ce": min(ce), "ce_at_r": ce[r - 1],
        "tolerance": useful_rule(conv["saturation"]),
        "train_seconds": None if timing is None else timing["train_seconds"]}


def useful_rule(saturation: dict[str, Any]) -> str:
    """The useful depth's margin as its metrics state it: a share of the gain (the
    convergence stage's rule), or nats from the best (metrics written before it)."""
    if "share" in saturation:
        return f"{saturation['share']:.0%} of the gain CE(1) - CE(best)"
    return f"{saturation['tolerance']:g} nats"


def _margin(tolerance: float | str) -> str:
    """A results file's useful-depth margin: useful_rule's text, or nats (older files)."""
    return tolerance if isinstance(tolerance, str) else f"{tolerance:g} nats"


def _metric(data: dict[str, Any], path: str) -> dict[str, Any] | None:
    found = (data.get("metrics") or {}).get(path)
    return None if not found or "data" not in found else found["data"]


def _row(e: Experiment, data: dict[str, Any], rev: str) -> dict[str, Any] | None:
    conv = _metric(data, str(paths.metrics_file("convergence", CELL)))
    raw = ((data.get("params") or {}).get("params.yaml") or {}).get("data")
    if conv is None or raw is None:
        return None
    timing = _metric(data, str(paths.metrics_file(paths.TRAIN_TIMINGS, CELL)))
    return point(e, raw, conv, timing, rev)


def _finished(base: dict[str, Any], name: str) -> tuple[list[dict[str, Any]], set[str]]:
    """The finished runs of one named experiment on a commit, newest first, and the
    states of all its runs. A queued or running one still shows the commit's own files,
    so it must not be read as a result."""
    found = [(ex, (ex.get("executor") or {}).get("state", "success"))
             for ex in base.get("experiments") or [] if ex.get("name") == name]
    states = {state for _, state in found}
    runs = [r for ex, state in found if state == "success"
            for r in ex.get("revs") or [] if r.get("data") and not r.get("error")]
    runs.sort(key=lambda r: r["data"].get("timestamp") or "", reverse=True)
    return runs, states


def is_base(raw: dict[str, Any]) -> bool:
    """Are these params' backbone the search's base recipe (BASELINE's)?"""
    return (resolve_cell(parse_params(raw), CELL)
            == resolve_cell(parse_params(with_overrides(raw, BASELINE)), CELL))


def _baseline(base: dict[str, Any]) -> dict[str, Any]:
    """The `default` row: its newest finished experiment, or the commit's own run where
    the commit's backbone is the base recipe (as it was when the search began)."""
    runs, _ = _finished(base, BASELINE.name)
    found = [x for r in runs if (x := _row(BASELINE, r["data"], r["rev"])) is not None]
    raw = ((base["data"].get("params") or {}).get("params.yaml") or {}).get("data")
    if not found and raw is not None and is_base(raw):
        found = [x] if (x := _row(BASELINE, base["data"], base["rev"])) else []
    if not found:
        raise DataError(f"no finished `{BASELINE.name}` experiment on this commit (and its "
                        f"own backbone is not the base recipe {', '.join(SEARCH_BASE)}); run "
                        f"`python -m loopscope.tools.levers queue {BASELINE.name}` and "
                        "`dvc exp run --run-all` first.")
    return found[0]


def from_exp_show(show: list[dict[str, Any]]) -> dict[str, Any]:
    """results.json from `dvc exp show --json`: the base recipe (BASELINE), the newest
    finished run of every experiment in EXPERIMENTS queued on the commit, and the exit
    runtime's (RUNTIME) benchmark."""
    base = next((b for b in show if b.get("rev") != "workspace"), None)
    if base is None or not base.get("data"):
        raise DataError("`dvc exp show --json` lists no commit; run from the repository.")
    default = _baseline(base)
    rows, missing, failed = [default], [], []
    runtime: dict[str, Any] | None = None
    for e in (*EXPERIMENTS, RUNTIME):
        runs, states = _finished(base, e.name)
        if e is RUNTIME:
            found = [b for r in runs
                     if (b := _metric(r["data"], str(paths.bench_file("exits")))) is not None]
            runtime = found[0] if found else None
        else:
            found = [x for r in runs if (x := _row(e, r["data"], r["rev"])) is not None]
            rows += found[:1]
        if not found:
            (failed if "failed" in states else missing).append(e.name)
    return {"baseline": base["rev"], "cell": CELL, "rows": rows, "missing": missing,
            "runtime": None if runtime is None else runtime_rows(runtime),
            "runtime_depths": None if runtime is None else {
                k: runtime[k] for k in ("r", "matched_depth", "baseline_depth")},
            "failed": failed,
            "regime": base["data"]["params"]["params.yaml"]["data"].get("claims", {}).get(
                "regime", ClaimsConfig().regime), "command": "make depth",
            "tolerance": default["tolerance"], "search_base": list(SEARCH_BASE),
            "defaults": defaults(with_overrides(base["data"]["params"]["params.yaml"]["data"],
                                                BASELINE))}


def table_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The lever table: one row per run, the default first, values with intervals."""
    out = []
    for r in results["rows"]:
        u = Interval.of(r["useful_depth"])
        out.append({
            "experiment": r["name"], "lever": r["lever"],
            "tokens (M)": f"{r['tokens'] / 1e6:.2f}",
            "useful depth / R": f"{u.value:g} [{u.lo:g}, {u.hi:g}] / {r['R']}",
            "on choose": "-" if r.get("choose_useful_depth") is None
            else str(r["choose_useful_depth"]),
            "elasticity (nats)": str(Interval.of(r["elasticity"])),
            "tail at R": _pct(Interval.of(r["tail"])),
            "best CE": f"{r['best_ce']:.3f}",
            "train (s)": "-" if r["train_seconds"] is None else f"{r['train_seconds']:.0f}"})
    return out


def _pct(iv: Interval) -> str:
    return f"{iv.value:.1%} [{iv.lo:.1%}, {iv.hi:.1%}]"


def _draw(ax: Any, pts: list[dict[str, Any]], key: str, per_r: bool, **style: Any) -> None:
    """One statistic of some points against their x, with its 95% interval."""
    pts = sorted(pts, key=lambda p: p["x"])
    ivs = [(Interval.of(p[key]), p["R"] if per_r else 1) for p in pts]
    ax.errorbar([p["x"] for p in pts], [iv.value / s for iv, s in ivs],
                yerr=[[(iv.value - iv.lo) / s for iv, s in ivs],
                      [(iv.hi - iv.value) / s for iv, s in ivs]], capsize=3, **style)


def figure(results: dict[str, Any], path: Path) -> None:
    """Useful depth / R, elasticity and the tail at R: against training tokens (log x),
    one line per recipe measured at several token counts, the other levers as grey
    points; then against each lever with an axis of its own (at the default's tokens)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    default = rows[0]
    series: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault(r["series"], []).append({**r, "x": r["tokens"]})
    lines = {k: v for k, v in series.items() if len(v) > 1}
    dots = [p for k, v in series.items() if len(v) == 1 for p in v]
    levers = sorted({r["axis"] for r in rows} - {TREND})
    stats = [("useful_depth", "useful depth / R", True),
             ("elasticity", "CE(1) - CE(R) (nats)", False),
             ("tail", "share converging after R", False)]
    fig, grid = plt.subplots(len(stats), 1 + len(levers), figsize=(5 + 3.6 * len(levers), 9.5),
                             squeeze=False)
    for i, (key, label, per_r) in enumerate(stats):
        ax = grid[i][0]
        for name, pts in lines.items():
            _draw(ax, pts, key, per_r, marker="o", label=name)
        if dots:
            _draw(ax, dots, key, per_r, marker=".", ls="none", color="grey",
                  label="one lever each (table)")
        ax.set(xscale="log", xlabel="training tokens (log)", ylabel=label)
        for j, axis in enumerate(levers, 1):
            pts = [{**default, "x": results["defaults"][axis]}]
            pts += [{**r} for r in rows if r["axis"] == axis and r["tokens"] == default["tokens"]]
            _draw(grid[i][j], pts, key, per_r, marker="o", color="C3")
            grid[i][j].set(xlabel=f"{axis} (default {results['defaults'][axis]:g})")
        for ax in grid[i]:
            if key == "useful_depth":
                ax.axhline(results["regime"], color="grey", ls="--", lw=1,
                           label=f"paper B's regime ({results['regime']:g} R)")
                ax.set_ylim(0, 1.05)
            if key == "tail":
                ax.axhline(0.05, color="grey", ls=":", lw=1, label="5% goal")
    grid[0][0].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Depth use of the paper B backbone (R = {default['R']}): 95% intervals")
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def defaults(raw: dict[str, Any]) -> dict[str, float]:
    """These params' backbone's value on every lever axis ("model.n_core": 2.0)."""
    cell = resolve_cell(parse_params(raw), CELL)
    return {e.axis: float(getattr(getattr(cell, e.axis.split(".")[0]), e.axis.split(".")[1]))
            for e in EXPERIMENTS if e.axis != TREND}


def runtime_section(results: dict[str, Any]) -> str:
    """docs/depth.md's section on the exit runtime on a deeper backbone ("" if not run)."""
    if not results.get("runtime"):
        return ""
    d = results["runtime_depths"]
    return f"""

## The exit runtime on a deeper backbone

`{RUNTIME.name}`: `bench_exits` on the backbone with `{' '.join(RUNTIME.overrides)}`
(the base recipe otherwise), R = {d['r']}; the smallest uniform depth
matching depth R's quality is {d['matched_depth']}, so the baseline a per-token policy
has to beat is depth {d['baseline_depth']}. Realized: the baseline's time over the
policy's, measured side by side on this machine.

{markdown_table(results['runtime'])}"""


def page(results: dict[str, Any]) -> str:
    """docs/depth.md, every number from results.json."""
    rows = results["rows"]
    base = ", ".join(f"`{o}`" for o in results.get("search_base") or SEARCH_BASE)
    total = sum(r["train_seconds"] or 0 for r in rows[1:])
    trend = sorted((r for r in rows if r["series"] == DEFAULT), key=lambda r: r["tokens"])
    span = trend[-1]["tokens"] / trend[0]["tokens"] if trend else 0
    best, ranked_on = deepest(rows)
    ties = tied(rows, best)
    missing = (f"\n\nNot run yet: {', '.join(results['missing'])}." if results["missing"]
               else "")
    runtime = runtime_section(results)
    if results.get("failed"):
        missing += (f"\n\nFailed (`dvc queue logs NAME` says why; the collapse guard "
                    f"stops a run that does not learn): {', '.join(results['failed'])}.")
    return f"""# Depth use of paper B's backbone: levers and the training-token trend

<!-- generated by `python -m loopscope.tools.levers collect` from {RESULTS}; do not edit -->

Paper B's claims are about a backbone that uses its depth: useful depth equal to its
training mean. This page is what each lever of our backbone's recipe does to its
useful depth (the smallest uniform depth within {_margin(results['tolerance'])} of the
best CE over depths 1..4R), its elasticity (CE(1) - CE(R)) and its tail (the share of
tokens still changing after R), each with its 95% interval (resampled units), on the
`report` windows the claims are judged on. The search ranks on `on choose`: the useful
depth on the `choose` windows, apart from those the verdicts read. Each
row is one `dvc exp` experiment on the `{CELL}` cell, queued on commit
`{results['baseline'][:7]}`. Every experiment changes one lever of the search's base
recipe, `default`: the backbone cell with {base}. Paper B's regime, as the claims read
it: useful depth at least {results['regime']:g} m, the sampler's nominal mean (= R here).

Reproduce: `make depth` (queues every experiment, runs them, rewrites this page); the
experiments here trained for {total / 60:.0f} minutes on {results['machine']}. One point:
`python -m loopscope.tools.levers command NAME` prints its `dvc exp run`, and
`python -m loopscope.tools.levers check NAME` compares the rerun with this table (useful
depth within {AGREE_LOOPS} loop, elasticity within {AGREE_NATS} nats).

{markdown_table(table_rows(results))}

![useful depth, elasticity and tail by lever](depth/{FIGURE.name})

The trend spans {span:g}x of training tokens. The deepest useful depth measured
{ranked_on}: `{best['name']}`, {_useful(best)} of R = {best['R']}.{ties}{runtime}{missing}
"""


def deepest(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """The run with the deepest useful depth (ties: the larger elasticity), ranked on
    the `choose` windows where every run has them, and which windows it was ranked on.
    A recipe chosen on the `report` windows would be judged on the data it was chosen
    on, so results without the choose windows' curve say so; a tie on `choose` is broken
    on `choose` too (tied() says when it cannot be)."""
    if rows and all(r.get("choose_useful_depth") is not None for r in rows):
        return (max(rows, key=lambda r: (r["choose_useful_depth"],
                                         r.get("choose_elasticity") or 0.0)),
                "on the `choose` windows (the claims read `report`)")
    return (max(rows, key=lambda r: (r["useful_depth"]["value"], r["elasticity"]["value"])),
            "on the `report` windows, the ones the claims are judged on: these results "
            "predate the `choose` windows' useful depth; rerun `make depth` to rank away "
            "from the verdicts' data")


def tied(rows: list[dict[str, Any]], best: dict[str, Any]) -> str:
    """A sentence naming the runs tied with the deepest on `choose` and how the tie is
    broken: by the elasticity on `choose` where every tied run has it; otherwise it
    stands (results collected before that elasticity was recorded)."""
    found = [r for r in rows if r is not best and r.get("choose_useful_depth") is not None
             and r.get("choose_useful_depth") == best.get("choose_useful_depth")]
    if not found:
        return ""
    names = ", ".join(f"`{r['name']}`" for r in found)
    if all(r.get("choose_elasticity") is not None for r in [best, *found]):
        return f" Tied on `choose` with {names}: the larger elasticity on `choose` ranks first."
    return (f" Tied on `choose` with {names}, and the tie stands: these results carry no "
            "elasticity on `choose` to break it (rerun `make depth`), and breaking it on "
            "`report` would choose the recipe on the data the claims are judged on.")


def _useful(row: dict[str, Any]) -> str:
    found = row.get("choose_useful_depth")
    return (f"{found} on `choose` ({row['useful_depth']['value']:g} on `report`)"
            if found is not None else f"{row['useful_depth']['value']:g}")


def _exp_show(rev: str | None) -> list[dict[str, Any]]:
    out = subprocess.run(dvc(["exp", "show", "--json", *(["--rev", rev] if rev else [])]),
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise DataError(f"`dvc exp show --json` failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def add(name: str, rev: str | None = None) -> dict[str, Any]:
    """One experiment's newest finished run on a commit (rev; None: HEAD) into the
    committed results.json, beside the points measured before (each row records the
    commit it ran on): a new lever needs no rerun of the whole search."""
    e = experiment(name)
    show = _exp_show(rev)
    base = next((b for b in show if b.get("rev") != "workspace"), None)
    runs, states = _finished(base or {}, name)
    found = [x for r in runs if (x := _row(e, r["data"], r["rev"])) is not None]
    if not found:
        raise DataError(f"no finished `{name}` experiment on this commit (states: "
                        f"{', '.join(sorted(states)) or 'none queued'}); run "
                        f"`{' '.join(e.command(queue=False))}` first.")
    results = json.loads(RESULTS.read_text())
    results["rows"] = [r for r in results["rows"] if r["name"] != name] + found[:1]
    results["missing"] = [m for m in results.get("missing", []) if m != name]
    write_json(RESULTS, results)
    render(json.loads(RESULTS.read_text()))
    return results


def collect(rev: str | None = None) -> dict[str, Any]:
    """Read every experiment queued on a commit (rev; None: HEAD) through `dvc exp show
    --json`; write results.json, the figure and docs/depth.md."""
    results = from_exp_show(_exp_show(rev))
    results["machine"] = f"{cpu_model()}, {os.cpu_count()} CPU cores"
    write_json(RESULTS, results)
    results = json.loads(RESULTS.read_text())  # the page is what the committed file renders
    render(results)
    return results


def render(results: dict[str, Any]) -> None:
    """The figure and docs/depth.md from results.json (`levers render`: after the page's
    wording changed, without rerunning `dvc exp show`)."""
    figure(results, FIGURE)
    with atomic_output(PAGE) as tmp:
        tmp.write_text(page(results))


def check(name: str, conv: dict[str, Any], results: dict[str, Any]) -> list[str]:
    """Where a rerun of one point (its metrics/convergence) disagrees with results.json
    beyond AGREE_LOOPS / AGREE_NATS (empty: it agrees)."""
    row = next((r for r in results["rows"] if r["name"] == name), None)
    if row is None:
        raise DataError(f"{RESULTS}: no row '{name}'; run `make depth` first.")
    useful = conv["saturation"]["useful_depth_iv"]["value"]
    gain = conv["elasticity"]["gain"]["value"]
    bad = []
    if abs(useful - row["useful_depth"]["value"]) > AGREE_LOOPS:
        bad.append(f"useful depth {useful:g} vs {row['useful_depth']['value']:g}")
    if abs(gain - row["elasticity"]["value"]) > AGREE_NATS:
        bad.append(f"elasticity {gain:.3f} vs {row['elasticity']['value']:.3f}")
    return bad


def _check_workspace(name: str) -> None:
    """The workspace params are the experiment's: otherwise the comparison means nothing."""
    raw = yaml.safe_load(paths.PARAMS.read_text())
    cell = resolve_cell(parse_params(raw), CELL)
    e = experiment(name)
    for o in e.sets:
        key, value = o.split("=", 1)
        section, leaf = key.split(".")
        if getattr(getattr(cell, section), leaf) != yaml.safe_load(value):
            raise ParamsError(f"params.yaml: cells.{CELL}.{key} is not {value}; run "
                              f"`{' '.join(e.command(queue=False))}` first.")


def main(argv: list[str]) -> None:
    what = argv[0] if argv else ""
    if what == "queue":
        validate(yaml.safe_load(paths.PARAMS.read_text()))
        chosen = [experiment(n) for n in argv[1:]] or list(BY_NAME.values())
        for e in chosen:
            subprocess.run(dvc(e.command()[1:]), check=True)
        print(f"queued {len(chosen)} experiments; run them: dvc exp run --run-all")
    elif what == "add" and len(argv) in (2, 3):
        results = add(argv[1], argv[2] if len(argv) == 3 else None)
        print(markdown_table(table_rows(results)))
        print(f"wrote {RESULTS}, {FIGURE}, {PAGE}")
    elif what == "render" and len(argv) == 1:
        render(json.loads(RESULTS.read_text()))
        print(f"wrote {FIGURE}, {PAGE} from {RESULTS}")
    elif what == "collect" and len(argv) <= 2:
        results = collect(argv[1] if len(argv) == 2 else None)
        print(markdown_table(table_rows(results)))
        print(f"wrote {RESULTS}, {FIGURE}, {PAGE}")
    elif what == "command" and len(argv) == 2:
        print(" ".join(experiment(argv[1]).command(queue=False)))
    elif what == "check" and len(argv) == 2:
        _check_workspace(argv[1])
        conv = json.loads(paths.metrics_file("convergence", CELL).read_text())
        bad = check(argv[1], conv, json.loads(RESULTS.read_text()))
        if bad:
            raise DataError(f"{argv[1]} disagrees with {RESULTS}: " + "; ".join(bad))
        print(f"{argv[1]}: agrees with {RESULTS} (useful depth within {AGREE_LOOPS} "
              f"loop, elasticity within {AGREE_NATS} nats)")
    else:
        raise LoopscopeError("usage: python -m loopscope.tools.levers queue [NAME ...] | "
                             "collect [REV] | add NAME [REV] | render | command NAME | "
                             "check NAME")


if __name__ == "__main__":
    execute(lambda: main(sys.argv[1:]))
