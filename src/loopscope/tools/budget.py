"""`plan --budget-hours H`: for each outside model, the measuring sizes that fit its
whole pipeline (every outside_* stage plan prices) in H hours at plan's rate, what they
cost, and what intervals that buys.

Why: at the shipped sizes (the sizes the cells are measured at) Huginn-0125 prices at
about a day of one GPU. Someone with an hour needs to know which keys to lower, how
far, whether it can fit at all, and what the numbers are worth then, before spending it.

The levers, the measuring sizes (R itself, the depth the model is read at, never moves):
  convergence.windows       convergence, policies and bench_exits (the policies stage
                            sweeps every grid setting on these windows: most of the cost)
  diagnose.val_sequences    diagnose (the depth sweep, Lemma 1, the clamp)
  extract.val_sequences     extract
  convergence.depth_factor  convergence's depth C = factor x R
  diagnose.sweep_depth      diagnose's depth max(sweep_depth, R)
The search (search()): while the priced hours exceed the budget, halve the lever whose
halving saves the most hours, never below its floor; once they fit, raise the last lever
halved back as far as the budget allows (bisection), so the budget is spent, not
undershot by up to half. The batch sets memory, not the FLOPs plan prices, so it is kept
(and shown with its memory estimate). A key is never raised above the params' value.
policies.grids is no lever: fewer rules measure less, not smaller; where the policies
stage is most of what the floors cost, the printout says so.

Floors (floors()), never passed; where even they do not fit, that is said, with what
they cost:
  convergence.windows     paper B's sets aim at MIN_UNITS (30) resampling units
                          (loopscope.stats.units: documents, else blocks of windows); a
                          unit holds at least one window, and at the reference run's
                          windows per unit, ceil(30 x windows / units) windows
  diagnose.val_sequences  FEWEST_UNITS (10) units, below which an interval decides
  and extract's           nothing (loopscope.judge.verdicts), at the reference's windows
                          per unit
  convergence.depth_factor  1 + the longest late window (settling.WINDOWS, 2R): the
                          fixed-point windows end at C and the 2R one must lie past R
  diagnose.sweep_depth    R: the sweep runs to max(sweep_depth, R), so below R saves
                          nothing
A floor above a key's present value is that value.

What it buys: the committed run's 95% intervals of the statistics an outside model's
rows report (loopscope.judge.outside), read from the main paper B backbone's metrics
(its first run: an outside model is one run), scaled by sqrt(units then / units at the
chosen size), with units taken as proportional to windows (blocks of that run's
length; documents thinned with the windows): a scaling estimate from this run's cells,
not a measurement of the outside model. The windows are shared keys (extract.*,
diagnose.*, convergence.*): applying them reruns the trained cells' stages too; only the
batch is the outside model's own (outside.<name>.batch_size).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from loopscope.base import paths
from loopscope.judge.cells import cell_group, paper_b_backbones
from loopscope.measure.trajectory.settling import WINDOWS
from loopscope.params import Params, load_params
from loopscope.released import outside
from loopscope.stats.units import FEWEST_UNITS, MIN_UNITS
from loopscope.tools.plan_outside import batches, hours_of, stage_flops
from loopscope.weights.resolve import resolve_cell

# The levers, in the order a tie is broken in.
KEYS = ("convergence.windows", "diagnose.val_sequences", "extract.val_sequences",
        "convergence.depth_factor", "diagnose.sweep_depth")
SETS = "convergence.windows"  # the windows paper B's three sets each hold
SPREAD = "diagnose.val_sequences"  # windows spread over the whole split
# The statistics of an outside model's rows that carry an interval and vary smoothly
# (the useful depth and the median loop are whole loops: their width moves in steps):
# (statistic, its unit, the metrics kind, the path to its first run's interval, where
# RUN stands for the run's key, the path where the cell has one run, the windows key).
RUN = "<run>"
INTERVALS = (
    ("clamp remove_radial: change in CE at R", "nats", "clamp",
     ("remove_radial", "delta_ce_last_by_seed", RUN), ("remove_radial", "delta_ce_last"),
     SPREAD),
    ("clamp freeze_loop1: change in CE at R", "nats", "clamp",
     ("freeze_loop1", "delta_ce_last_by_seed", RUN), ("freeze_loop1", "delta_ce_last"),
     SPREAD),
    ("share of tokens still changing after R", "share", "convergence",
     ("per_seed", RUN, "convergence", "share_after_r"), ("convergence", "share_after_r"),
     SETS),
    ("A1 (KL exit) mean loops / R", "ratio", "policies",
     ("per_seed", RUN, "kl", "loops_ratio_iv"), ("kl", "loops_ratio_iv"), SETS),
)


@dataclass(frozen=True)
class Reference:
    """The committed run's one-run intervals a budget is read against: the cell and
    run, the windows and resampling units of each windows key, and the widths (hi - lo)
    of INTERVALS by name."""

    cell: str
    run: str
    windows: dict[str, int]
    units: dict[str, int]
    widths: dict[str, float]

    def per_unit(self, key: str) -> float:
        """Windows per resampling unit under this windows key."""
        ref = SETS if key == SETS else SPREAD
        return self.windows[ref] / self.units[ref]


def main_backbone(params: Params) -> str | None:
    """The main paper B backbone (the claims' rule: loopscope.judge.cells), the cell an
    outside model's rows stand beside."""
    configs = {name: resolve_cell(params, name) for name in params.cells}
    return paper_b_backbones({n: c for n, c in configs.items()
                              if cell_group(c) == "paper B backbone"})[0]


def _dig(found: Any, path: tuple[str, ...], run: str) -> Any:
    for step in path:
        found = found[run if step == RUN else step]
    return found


def _interval(found: dict[str, Any], one_run: tuple[str, ...], pooled: tuple[str, ...],
              run: str | None) -> dict[str, float]:
    """A statistic's interval on one run: the run's own where the metrics hold one per
    run, else the cell's (a cell of one run)."""
    return _dig(found, one_run, run) if run is not None else _dig(found, pooled, "")


def reference(params: Params, root: Path = Path(".")) -> Reference | None:
    """The committed run's intervals under root (the main backbone's metrics/, which git
    holds; its windows' length from params), None where they are not there (a checkout
    run on another corpus)."""
    cell = main_backbone(params)
    if cell is None:
        return None
    try:
        found = {kind: json.loads((root / paths.metrics_file(kind, cell)).read_text())
                 for kind in ("convergence", "diagnose", "clamp", "policies")}
        context = resolve_cell(params, cell).model.context  # configs/ may not exist yet
        conv, diag = found["convergence"], found["diagnose"]
        run = next(iter(conv["per_seed"])) if conv.get("per_seed") else None
        one = conv["per_seed"][run] if run is not None else conv
        widths = {}
        for name, _, kind, one_run, pooled, _ in INTERVALS:
            iv = _interval(found[kind], one_run, pooled, run)
            widths[name] = float(iv["hi"] - iv["lo"])
        return Reference(cell, run or "(its one run)",
                         {SETS: round(one["tokens"] / context),
                          SPREAD: round(diag["val_tokens"] / context)},
                         {SETS: int(one["units"]), SPREAD: int(diag["units"])}, widths)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def values_of(params: Params) -> dict[str, int]:
    """The levers' present values in these params."""
    return {key: getattr(getattr(params, key.split(".")[0]), key.split(".")[1])
            for key in KEYS}


def with_values(params: Params, values: dict[str, int]) -> Params:
    """The params with these keys set (section.name -> value)."""
    sections: dict[str, Any] = {}
    for key, value in values.items():
        section, name = key.split(".")
        now = sections.get(section, getattr(params, section))
        sections[section] = dataclasses.replace(now, **{name: value})
    return dataclasses.replace(params, **sections)


def floors(r: int, ref: Reference | None) -> dict[str, tuple[int, str]]:
    """Each lever's floor and why (module doc), for a model read at R = r."""
    def of_units(key: str, want: int) -> int:
        return max(want, math.ceil(want * ref.per_unit(key) - 1e-9)) if ref else want

    def seen(key: str) -> str:
        return (f"; {ref.cell}'s run: {ref.units[key]} units per {ref.windows[key]} windows"
                if ref else "; a unit holds one window at least")

    late = 1 + math.ceil(max(WINDOWS))
    return {
        SETS: (of_units(SETS, MIN_UNITS),
               f"paper B's sets need >= {MIN_UNITS} resampling units{seen(SETS)}"),
        SPREAD: (of_units(SPREAD, FEWEST_UNITS), f"an interval on fewer than {FEWEST_UNITS} "
                 f"units decides nothing{seen(SPREAD)}"),
        "extract.val_sequences": (of_units(SPREAD, FEWEST_UNITS), "as diagnose's"),
        "convergence.depth_factor": (late, f"the {max(WINDOWS):g}R late window must lie past R"),
        "diagnose.sweep_depth": (r, "R: the sweep runs to max(sweep_depth, R)"),
    }


Price = Callable[[dict[str, int]], float]


def search(price: Price, start: dict[str, int], floor: dict[str, int], budget: float
           ) -> tuple[dict[str, int], list[tuple[str, int, int]]]:
    """The values the budget allows (module doc) and the moves made, (key, from, to)."""
    values, moves = dict(start), []
    floor = {k: min(floor[k], v) for k, v in start.items()}  # never raised
    while (now := price(values)) > budget:
        halved = {k: max(floor[k], v // 2) for k, v in values.items() if v > floor[k]}
        saving = {k: now - price({**values, k: v}) for k, v in halved.items()}
        key = max(saving, key=lambda k: saving[k], default=None)
        if key is None or saving[key] <= 0:
            break
        moves.append((key, values[key], halved[key]))
        values[key] = halved[key]
    if moves and price(values) <= budget:
        key, old, low = moves[-1]
        high = old  # low fits, old did not
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if price({**values, key: mid}) <= budget else (low, mid)
        if low != values[key]:
            moves.append((key, values[key], low))
            values[key] = low
    return values, moves


def buys(ref: Reference | None, values: dict[str, int]) -> list[dict[str, Any]]:
    """The reference's interval widths scaled to these windows (module doc)."""
    if ref is None:
        return []
    out = []
    for name, unit, *_, key in INTERVALS:
        windows, units = ref.windows[key], ref.units[key]
        at = values[key]
        out.append({"statistic": name, "unit": unit, "key": key, "windows_then": windows,
                    "units_then": units, "width_then": ref.widths[name], "windows": at,
                    "units": units * at / windows,
                    "width": ref.widths[name] * math.sqrt(windows / at)})
    return out


def fit(params: Params, name: str, planned: dict[str, Any], budget: float,
        ref: Reference | None) -> dict[str, Any]:
    """One outside model's sizes for the budget (search), priced as plan prices it."""
    cfg, rate = params.outside[name], planned["rate_flops_per_s"]
    size = outside.sizing(cfg)
    start = values_of(params)
    floor = floors(planned["r"], ref)
    base = {"budget_hours": budget, "rate_source": planned["rate_source"],
            "rate_flops_per_s": rate, "start": start,
            "floors": {k: list(v) for k, v in floor.items()},
            "batch": {k: cfg.batch_size or b for k, (_, b, _, _) in batches(params).items()},
            "batch_key": f"outside.{name}.batch_size" if cfg.batch_size else None,
            "memory_gib": planned["memory_gib"], "reference": ref and dataclasses.asdict(ref)}
    if rate is None:
        return {**base, "fits": None}

    def flops(values: dict[str, int]) -> dict[str, float]:
        return stage_flops(with_values(params, values), size.cost, planned["context"],
                           planned["r"], size.vocab_size)

    def price(values: dict[str, int]) -> float:
        return hours_of(flops(values), rate) or 0.0

    values, moves = search(price, start, {k: v[0] for k, v in floor.items()}, budget)
    return {**base, "fits": price(values) <= budget, "chosen": values, "moves": moves,
            "hours_before": price(start), "hours": price(values),
            "stage_hours": {s: f / rate / 3600 for s, f in flops(values).items()},
            "settings": sum(len(g) for g in params.policies.grids.values()),
            "buys": buys(ref, values)}


def fit_all(params: Params, planned: dict[str, dict[str, Any]], budget: float,
            root: Path = Path(".")) -> dict[str, dict[str, Any]]:
    """Every outside model's fit (plan's result["outside"] for planned), by name."""
    ref = reference(params, root)
    return {name: fit(params, name, p, budget, ref) for name, p in planned.items()}


def shared_values(fitted: dict[str, dict[str, Any]]) -> dict[str, int]:
    """The shared keys that fit every model: each the smallest of the models' choices
    (every stage's cost grows with each key, so a smaller one fits still)."""
    return {k: min(f["chosen"][k] for f in fitted.values()) for k in KEYS}


def write(source: str | Path, target: str | Path, fitted: dict[str, dict[str, Any]]) -> Path:
    """Write the params file `source` with the chosen keys applied to `target`
    (comments are not kept: a YAML dump), and check it loads."""
    raw = yaml.safe_load(Path(source).read_text())
    chosen = shared_values(fitted)
    for key, value in chosen.items():
        section, name = key.split(".")
        raw.setdefault(section, {})[name] = value
    head = (f"# {Path(source).name} with the sizes `python -m loopscope.tools.plan "
            f"--budget-hours {next(iter(fitted.values()))['budget_hours']:g}` chose for "
            f"{', '.join(fitted)}: {', '.join(f'{k} {v}' for k, v in chosen.items())}\n")
    target = Path(target)
    target.write_text(head + yaml.safe_dump(raw, sort_keys=False))
    load_params(target)
    return target


# ------------------------------------------------------------------------ printing

SHARED = ("shared keys: the trained cells' extract, diagnose, convergence and policies "
          "stages read them too, so applying them reruns those; only outside.<name>.* "
          "keys rerun its stages alone")


def _h(hours: float) -> str:
    """Hours to two decimals, or minutes below a tenth of an hour."""
    return f"{hours:,.2f} h" if hours >= 0.1 else f"{hours * 60:.1f} min"


def rate_words(fitted: dict[str, Any]) -> str:
    """The rate a fit was priced at, in words."""
    rate, source = fitted["rate_flops_per_s"], fitted["rate_source"]
    if source == "assumed":
        return f"at an assumed {rate / 1e12:g} TFLOP/s on cuda (--tflops)"
    if source == "given":
        return f"at the given {rate / 1e12:g} TFLOP/s"
    if source == "matmul roof":
        return (f"at this CPU's matmul roof, {rate / 1e9:.1f} GFLOP/s (an upper rate: a "
                "lower bound of the time)")
    return "(no rate)"


def budget_lines(fitted: dict[str, dict[str, Any]]) -> list[str]:
    """The printed budget: a head line, then each outside model's (model_lines)."""
    if not fitted:
        return ["budget: no outside model in these params (`outside:` is empty): nothing "
                "to size"]
    first = next(iter(fitted.values()))
    out = [f"budget: {first['budget_hours']:g} h for each outside model's stages "
           f"{rate_words(first)}, priced as plan prices them (forward FLOPs at that rate, "
           "plus the stages' start-up); an estimate from FLOPs, not a measurement"]
    for name, f in fitted.items():
        out.extend(model_lines(name, f))
    return out


def model_lines(name: str, f: dict[str, Any]) -> list[str]:
    """One outside model's part of the printed budget."""
    if f["fits"] is None:
        return [f"outside {name}: no rate to price it by (this CPU is not calibrated): "
                "give --tflops"]
    stages = ", ".join(f"{s} {_h(h)}" for s, h in f["stage_hours"].items())
    before = f"{_h(f['hours_before'])} at the params' sizes"
    floors = ", ".join(f"{k} {v} ({why})" for k, (v, why) in f["floors"].items())
    if f["fits"]:
        out = [f"outside {name}: fits: {_h(f['hours'])} of {f['budget_hours']:g} h "
               f"({before}); by stage: {stages}"]
        out.append("  " + (moves_words(f["moves"]) if f["moves"]
                           else "nothing lowered: the params' sizes fit"))
        out.append(f"  floors, never passed: {floors}")
        out.extend(fragment(f["start"], f["chosen"]))
    else:
        out = [f"outside {name}: does not fit {f['budget_hours']:g} h: even at the floors "
               f"it prices {_h(f['hours'])} ({before}); by stage: {stages}",
               f"  floors, never passed: {floors}", "  " + largest(f),
               f"  nothing to apply: the floors need --budget-hours "
               f"{math.ceil(f['hours'] * 100) / 100:.2f} at least"]
    out.append("  " + batch_words(f))
    out.extend(buys_lines(name, f))
    return out


def moves_words(moves: list[tuple[str, int, int]]) -> str:
    """The search's moves in order, e.g. `convergence.windows 96 -> 48, ...`."""
    words = [f"{k} {a} -> {b}" + (" (raised back: the budget's rest)" if b > a else "")
             for k, a, b in moves]
    return "lowered, each time halving the lever that saves the most hours: " + ", ".join(words)


def fragment(start: dict[str, int], chosen: dict[str, int]) -> list[str]:
    """The changed keys as a params.yaml fragment, a section a line."""
    sections: dict[str, list[str]] = {}
    for key in KEYS:
        if chosen[key] != start[key]:
            section, name = key.split(".")
            sections.setdefault(section, []).append(f"{name}: {chosen[key]}")
    if not sections:
        return []
    return [f"  params.yaml fragment ({SHARED}):",
            *(f"    {s}: {{{', '.join(v)}}}" for s, v in sections.items())]


def largest(f: dict[str, Any]) -> str:
    """Which stage the floors' hours are mostly, and for the policies the lever left."""
    hours = f["stage_hours"]
    top = max(hours, key=lambda s: hours[s])
    share = hours[top] / sum(hours.values())
    out = f"{top} is {share:.0%} of the stages' FLOP time"
    if top == "policies":
        out += (f": it sweeps all {f['settings']} settings of policies.grids at R on every "
                "window; fewer rules there (a shared key: fewer rules measured) is the lever "
                "this search leaves alone")
    return out


def batch_words(f: dict[str, Any]) -> str:
    """The batch kept, and its memory estimate."""
    gib = ", ".join(f"{s} {v:,.1f}" for s, v in f["memory_gib"].items())
    if f["batch_key"]:
        which = f"{f['batch_key']} {next(iter(f['batch'].values()))} in every stage"
    else:
        which = "the stages' own " + ", ".join(f"{s}.batch_size {b}" for s, b in
                                               f["batch"].items() if s != "bench_exits")
    return (f"batch kept: {which} (the batch sets memory, not the FLOPs priced); memory "
            f"per stage (GiB, est.): {gib}")


def buys_lines(name: str, f: dict[str, Any]) -> list[str]:
    """What the sizes buy: the reference's interval widths scaled (module doc)."""
    what = "what these sizes buy" if f["fits"] else "what the floors would buy"
    ref = f["reference"]
    if not f["buys"]:
        return [f"  {what}: not estimated (no committed metrics of a paper B backbone here)"]
    out = [f"  {what} (a scaling estimate from this run's cells, not a measurement of "
           f"{name}): the 95% interval widths of {ref['cell']}'s run {ref['run']} (an outside "
           "model is one run) times sqrt(units then / units at this size), units taken as "
           "proportional to windows:"]
    for b in f["buys"]:
        unit = " nats" if b["unit"] == "nats" else ""
        out.append(f"    {b['statistic']}: {b['width_then']:.2g}{unit} at {b['windows_then']} "
                   f"windows ({b['units_then']} units) -> ~{b['width']:.2g} at {b['windows']}"
                   f" ({b['key']}; ~{b['units']:.0f} units)")
    return out
