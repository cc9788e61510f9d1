"""Outside models in the claims: a released looped model measured beside the trained
cells (loopscope.weights.outside_config) is not the papers' model, so neither paper's
verdicts read it. Its rows are extensions: the statistics paper A's and paper B's claims
are judged by, measured on it by the same stages, each with its interval where the
stage gives one, beside the same statistic of this run's main paper B backbone, and
where it stands against paper B's regime (loopscope.judge.backbone.Backbone). The claims
stage writes them under `outside` in tables/claims.json (only where params.yaml names an
outside model, so a run without one writes the document it always wrote).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loopscope.base import paths
from loopscope.base.outputs import read_metrics
from loopscope.judge.backbone import Backbone
from loopscope.judge.criteria import Criteria, criteria_of
from loopscope.weights.outside_config import load_outside

Metrics = dict[str, dict[str, Any]]  # a model's metrics by stage kind


def _at_r(m: Metrics, key: str) -> Any:
    return m["diagnose"][key][f"k{m['convergence']['r']}"]


def _matched(m: Metrics, field: str) -> Any:
    kl = m["policies"].get("kl", {})
    return kl.get(field) if kl.get("matched") else None


# (statistic, its unit, how it is read from a model's metrics): a number or an interval
STATISTICS: tuple[tuple[str, str, Callable[[Metrics], Any]], ...] = (
    ("perplexity at R", "perplexity", lambda m: _at_r(m, "ppl_at_depth")),
    ("mean hidden-state norm at R", "norm", lambda m: _at_r(m, "norm_mean")),
    ("hidden-state scale growth over the depth sweep", "ratio",
     lambda m: m["diagnose"]["lemma2"]["scale_growth"]),
    ("Lemma 1: radial gradient fraction per token at R", "fraction",
     lambda m: _at_r(m, "radial_fraction_token")),
    ("Lemma 1: the readout's eps floor at R", "fraction", lambda m: _at_r(m, "radial_floor")),
    ("Lemma 2: log-log slope of the angular step on the scale", "slope",
     lambda m: m["diagnose"]["lemma2"]["slope"]),
    ("clamp freeze_loop1: change in CE at R", "nats",
     lambda m: m["clamp"]["freeze_loop1"]["delta_ce_last"]),
    ("clamp remove_radial: change in CE at R", "nats",
     lambda m: m["clamp"]["remove_radial"]["delta_ce_last"]),
    ("useful depth", "loops", lambda m: m["convergence"]["saturation"]["useful_depth_iv"]),
    ("median convergence loop", "loops",
     lambda m: m["convergence"]["convergence"]["median_loop"]),
    ("share of tokens still changing after R", "share",
     lambda m: m["convergence"]["convergence"]["share_after_r"]),
    ("A1 (KL exit) mean loops at depth R's quality", "loops",
     lambda m: _matched(m, "mean_loops")),
    ("A1's FLOPs against depth R", "ratio", lambda m: _matched(m, "flops_ratio")),
)


def metrics_of(name: str) -> Metrics:
    """A model's metrics as the measuring stages wrote them (a missing file names the
    stage to run; policies: empty where they were not swept)."""
    found = {kind: read_metrics(kind, name) for kind in ("diagnose", "clamp", "convergence")}
    policies = paths.metrics_file("policies", name)  # a cell of policies.cells only
    found["policies"] = read_metrics("policies", name) if policies.is_file() else {}
    return found


def _value(read: Callable[[Metrics], Any], m: Metrics) -> dict[str, Any]:
    """A statistic as {value, lo, hi, units} (lo, hi, units None where no interval)."""
    found = read(m)
    if isinstance(found, dict):
        return {k: found.get(k) for k in ("value", "lo", "hi", "units")}
    return {"value": found, "lo": None, "hi": None, "units": None}


def outside_record(name: str, values: dict[str, float] | Criteria, beside: dict[str, Metrics]
                   ) -> dict[str, Any]:
    """One outside model's record: what it is (adapter, checkpoint, R, the depth it
    trained at, precision), its regime against paper B's, and its rows (STATISTICS),
    each beside the same statistic of the cells in `beside` (by name)."""
    cfg = load_outside(paths.config_file(name))
    mine = metrics_of(name)
    conv = mine["convergence"]
    regime = Backbone(name, conv, mine["policies"], criteria_of(values))
    rows = []
    for statistic, unit, read in STATISTICS:
        rows.append({"statistic": statistic, "unit": unit, **_value(read, mine),
                     "beside": {c: _value(read, m)["value"] for c, m in beside.items()}})
    return {"kind": "extension", "adapter": cfg.adapter, "path": cfg.path,
            "precision": cfg.precision, "device": cfg.device, "r": conv["r"],
            "nominal_mean": conv.get("nominal_mean"), "sampler_mean": conv.get("sampler_mean"),
            "tokens": conv["tokens"], "unit": conv["unit"], "units": conv["units"],
            "regime": {"state": regime.state(), "words": regime.regime()},
            "rows": rows}


def outside_records(names: list[str], values: dict[str, float] | Criteria, main: str | None
                    ) -> dict[str, Any]:
    """Every outside model's record (outside_record), beside this run's main paper B
    backbone where there is one."""
    beside = {} if main is None else {main: metrics_of(main)}
    return {name: outside_record(name, values, beside) for name in names}
