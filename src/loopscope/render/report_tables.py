"""The tables and sentences every report shows, and the front of index.html, computed
from this run's outputs; paper A's own are loopscope.render.tables_a, paper B's
loopscope.render.tables_b. A notebook calls these, displays what they return and draws
with loopscope.render.figures: every value a report shows is computed, and tested, here.
Files are read through loopscope.base.outputs, so a missing one names the stage to run.

    every report   table_display, paper_line, computed_from, inputs_html, claims_view,
                   claims_intro, forest_rows, specification_rows, parameters_table,
                   rules_list, scale_table, scale_line, units_statement,
                   experiment_verdicts, init_effect
    index          claims_summary, provenance_table, headline_table

What a report was computed from (its provenance) is recorded by its stage before the
notebook runs (loopscope.base.provenance) and handed to the notebook as a parameter;
computed_from, provenance_table and inputs_html show it.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from loopscope.base import paths
from loopscope.base.outputs import read_json, read_metrics
from loopscope.judge.cells import cell_group
from loopscope.judge.experiments import flips, recorded, run_counts, stale, verdict_columns
from loopscope.stats.units import FEWEST_UNITS, MIN_UNITS
from loopscope.weights.config import load_cell

PAPERS = {"paper_a": "A", "paper_b": "B"}
VERDICTS = ("holds", "contradicted", "inconclusive", "not shown")

# --- Every report ---------------------------------------------------------------------


def table_display() -> None:
    """pandas' table display for the reports: 4 significant decimals rather than 6, and
    "-" where a value does not apply (a paper A cell has no A1 exit, say) instead of
    "nan". Called by every report before its first table."""
    pd.set_option("display.precision", 4)
    pd.set_option("styler.format.precision", 4)
    pd.set_option("styler.format.na_rep", "-")
    pd.set_option("display.float_format", lambda v: "-" if v != v else f"{v:.4g}")


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """"1 row", "2 rows": a count with its noun in the right number."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def _provenance(found: dict[str, Any]) -> dict[str, str]:
    """A report's provenance (its stage's record, with the seeds and the precision) in
    words, a line each: what computed_from and provenance_table show."""
    commit = found.get("commit")
    packages = found.get("packages", {})
    precision = found.get("precision", {})
    return {
        "commit": (f"{commit[:10]} (checked out when the run started; the code that ran "
                   "is named by its digests among the inputs)" if commit
                   else "none (not a git checkout)"),
        "inputs": (f"{plural(len(found.get('inputs', {})), 'input')} by their DVC digests, as "
                   f"dvc.lock records the deps of `{found.get('stage', '?')}` (listed at the end)"),
        "params": (f"{', '.join(found.get('params', {}).get('keys', []))}: sha256 "
                   f"{found.get('params', {}).get('sha256', '?')}"),
        "packages": ", ".join(f"{k} {v}" for k, v in packages.items()),
        "cpu": found.get("cpu", "?"),
        "training precision": (f"{precision.get('training', '?')} (measured in "
                               f"{precision.get('measuring', 'fp32')})"),
        "seeds": ", ".join(map(str, found.get("seeds", []))),
        "date": found.get("date", "?")}


def computed_from(provenance: dict[str, Any]) -> str:
    """The line under a report's title that says what it was computed from: the
    record its stage took before the run (loopscope.base.provenance)."""
    return "Computed from: " + "; ".join(f"{k} {v}" for k, v in _provenance(provenance).items())


def inputs_html(provenance: dict[str, Any]) -> str:
    """Every input of the report by its DVC digest, and the params' digest, as a
    collapsed HTML table: the same digests dvc.lock records for the report's stage."""
    rows = [{"input": path, "DVC digest": digest}
            for path, digest in provenance.get("inputs", {}).items()]
    params = provenance.get("params", {})
    rows.append({"input": f"params.yaml ({', '.join(params.get('keys', []))})",
                 "DVC digest": f"sha256:{params.get('sha256', '?')}"})
    return ("<details><summary>The inputs of this page by their DVC digests "
            f"({plural(len(rows), 'row')})</summary>"
            + pd.DataFrame(rows).to_html(index=False) + "</details>")


def paper_line(paper: str) -> str:
    """The paper a report checks, by title (tables/claims.json's `papers`), and where
    each row's number comes from."""
    title = claims()["papers"][paper]["title"]
    return (f"Paper {PAPERS[paper]}: *{title}*. Every \"paper says\" number below is the "
            "paper's own, with the section, table or figure it comes from (`where`).")


def claims() -> dict[str, Any]:
    """tables/claims.json, the claims stage's verdicts (the reports judge nothing)."""
    return read_json(paths.CLAIMS, "claims")


def criteria_values() -> dict[str, float]:
    """The criteria's parameters at the values the claims stage judged at."""
    return {p["name"]: p["value"] for p in claims()["parameters"]}


def robustness(row: dict[str, Any]) -> str:
    """A row's robustness mark in words: "robust", or "fragile: " and the values of the
    parameters that turn its verdict."""
    r = row.get("robustness")
    if not r:
        return "-"
    if r["mark"] in ("robust", "not swept"):
        return r["mark"]
    return "fragile: " + "; ".join(f"{t['parameter']} = {t['value']} -> {t['verdict']}"
                                    for t in r["turns"])


def _seed(s: dict[str, Any]) -> str:
    """One seed's own judgement: its verdict and the interval it turned on."""
    e = s.get("estimate")
    if not e:
        return s["verdict"]
    return f"{s['verdict']} ({e['statistic']} {e['value']:.4g} [{e['lo']:.4g}, {e['hi']:.4g}])"


def _note(row: dict[str, Any]) -> str:
    """What stands beside a row: the seed-spread warning and each seed's own verdict with
    the interval it turned on (where the seeds decided the row, it is their intervals,
    not the pooled one, that decided)."""
    parts = [row["note"]] if row.get("note") else []
    if seeds := row.get("seeds"):
        decided = (" (the seeds decided the " + " and ".join(seeds["decided"]) + ")"
                   if seeds.get("decided") else "")
        parts.append(f"each seed alone{decided}: " + "; ".join(_seed(s) for s in seeds["each"]))
    return "; ".join(parts)


def claims_view(paper: str, kind: str | None = None) -> pd.DataFrame:
    """One paper's rows ("paper_a" or "paper_b"; the mechanism checks: "mechanism_checks")
    for reading: the claim, its group or backbone, what the paper says and where, ours,
    the criterion, the verdict (direction and magnitude together) with each
    part, the robustness mark, what the intervals resample and, for paper B, the regime.
    kind: only rows of that kind (finding, extension, check)."""
    rows = [r for r in claims()[paper] if kind is None or r["kind"] == kind]
    return pd.DataFrame([{
        "claim": r["claim"], "group": r.get("group", ""), "kind": r["kind"],
        "paper says": r["paper_says"], "where": r.get("source", ""), "ours": r["value"],
        "criterion": r["criterion"], "verdict": r["verdict"], "direction": r["direction"],
        "magnitude": r["magnitude"], "robustness": robustness(r),
        **({"regime": r["regime"]} if paper == "paper_b" else {}),
        "resampled": r.get("resampled", ""), "note": _note(r), "id": r.get("id", "")}
        for r in rows])


def claims_intro(paper: str) -> str:
    """The sentence above a paper's claims table: its findings' verdicts, how
    many are fragile, the extensions apart, and the rules every row is decided by."""
    found = claims()
    rows = found[paper]
    counts = found["counts"][paper]
    findings = [r for r in rows if r["kind"] == "finding"]
    fragile = sum(robustness(r).startswith("fragile") for r in findings)
    extensions = [r for r in rows if r["kind"] == "extension"]
    told = ", ".join(f"{counts[v]} {v}" for v in VERDICTS if counts.get(v))
    line = (f"**{counts.get('holds', 0)} of {plural(len(findings), 'finding')} "
            f"{'holds' if len(findings) == 1 else 'hold'}** on this run "
            f"({told}); {fragile} of them fragile (the verdict turns within a parameter's "
            "declared range).")
    if extensions:
        line += (f" {plural(len(extensions), 'row')} beyond the paper (extensions: "
                 + ", ".join(f"{sum(r['verdict'] == v for r in extensions)} {v}"
                             for v in VERDICTS if any(r["verdict"] == v for r in extensions))
                 + ") are not counted among its findings.")
    return line


def rules_list() -> str:
    """The rules every row is decided by (family-wise, seeds, verdict), as a markdown
    list."""
    return "\n".join(f"- **{k}**: {v}" for k, v in claims()["rules"].items())


def parameters_table() -> pd.DataFrame:
    """The criteria's free parameters: value judged at, meaning, source, the range the
    specification curve sweeps, how many rows read it and which rows it turns."""
    found = claims()
    rows = [r for p in PAPERS for r in found[p]] + found.get("mechanism_checks", [])
    out = []
    for p in found["parameters"]:
        read = [r for r in rows if p["name"] in (r.get("robustness") or {}).get("swept", {})]
        turned = [r["id"] for r in read
                  if any(t["parameter"] == p["name"] for t in r["robustness"]["turns"])]
        out.append({"parameter": p["name"], "value": p["value"], "decides": p["meaning"],
                    "source": p["source"], "range": ", ".join(f"{v:g}" for v in p["range"]),
                    "rows reading it": len(read), "rows it turns": ", ".join(turned) or "-"})
    return pd.DataFrame(out)


PART_ESTIMATE = {"direction": "estimate", "magnitude": "magnitude_estimate"}
UNITLESS = "unitless"  # the panel of the statistics whose unit is not given


def decisive_part(row: dict[str, Any]) -> str | None:
    """Which of a row's comparisons its counted verdict turned on: "direction" or
    "magnitude" (the one whose own verdict is the row's, the direction where both are),
    None for a row not shown or judged on nothing."""
    if row["verdict"] == "not shown":
        return None
    if row.get("magnitude") in ("n/a", "", None) or row["direction"] == row["verdict"]:
        part = "direction"
    else:
        part = "magnitude"
    return part if row.get(PART_ESTIMATE[part]) else None


def forest_rows(paper: str, found: dict[str, Any] | None = None) -> pd.DataFrame:
    """A row per claim of a paper (findings and extensions): the interval its verdict
    turned on (decisive_part) on the statistic's own scale, at the level it was judged
    (0.95, or Bonferroni where the claim was decided in a family), with its unit, the
    band where the claim holds, the paper's number where it gives one, the verdict and
    the robustness mark. Rows not shown, or judged on no interval, are left out. found:
    tables/claims.json as read already (else read here)."""
    out = []
    for r in (found or claims())[paper]:
        part = decisive_part(r)
        if part is None:
            continue
        est = r[PART_ESTIMATE[part]]
        group = f" [{r['group']}]" if r.get("group") else ""
        band_lo, band_hi = est["band"]
        out.append({"row": r["key"].replace("_", " ") + group
                    + (" (magnitude)" if part == "magnitude" else ""),
                    "part": part, "unit": est.get("unit") or UNITLESS,
                    "statistic": est["statistic"], "lo": est["lo"], "value": est["value"],
                    "hi": est["hi"], "level": est.get("level", 0.95),
                    "band_lo": -math.inf if band_lo is None else band_lo,
                    "band_hi": math.inf if band_hi is None else band_hi,
                    "paper": math.nan if est.get("paper") is None else est["paper"],
                    "verdict": r["verdict"], "kind": r["kind"],
                    "robust": (r.get("robustness") or {}).get("mark", "robust") != "fragile"})
    return pd.DataFrame(out)


def specification_rows(paper: str) -> pd.DataFrame:
    """The specification curve of every row that a parameter turns: for each parameter
    the row read and each value tried (the judged value too), the verdict
    there. Rows that no value turns are left out (their verdict is the same
    everywhere)."""
    found = claims()
    judged = {p["name"]: p["value"] for p in found["parameters"]}
    out = []
    for r in found[paper]:
        rob = r.get("robustness") or {}
        if rob.get("mark") != "fragile":
            continue
        turns = {(t["parameter"], str(t["value"])): t["verdict"] for t in rob["turns"]}
        for name, values in rob["swept"].items():
            if not any(t["parameter"] == name for t in rob["turns"]):
                continue
            tried = [judged[name], *values] if name in judged else list(values)
            for v in tried:
                out.append({"row": f"{r['key'].replace('_', ' ')} [{r.get('group', '')}]",
                            "parameter": name, "value": str(v),
                            "judged": name in judged and v == judged[name],
                            "verdict": turns.get((name, str(v)), r["verdict"])})
    return pd.DataFrame(out)


def scale_table(paper: str) -> pd.DataFrame:
    """What this run's cells of a paper were trained at (parameters, training tokens,
    seeds, recipe group), and the paper's own scale as its last row."""
    scale = claims()["scale"]
    backbone = paper == "paper_b"
    rows = [{"cell": c, "parameters": f"{s['parameters']:,}",
             "training tokens": f"{s['training_tokens']:,}", "seeds": str(s["seeds"]),
             "recipe group": s["recipe_group"]}
            for c, s in scale["cells"].items() if s["paper_b_backbone"] == backbone]
    theirs = scale["papers"][paper]
    rows.append({"cell": f"paper {PAPERS[paper]}", "parameters": theirs["parameters"],
                 "training tokens": theirs["training"], "seeds": theirs["seeds"],
                 "recipe group": "-"})
    return pd.DataFrame(rows).set_index("cell")


def scale_line(paper: str) -> str:
    """The corpus this run trained on against the paper's, and what the reference
    recipe is, in one line above scale_table."""
    scale = claims()["scale"]
    c = scale["corpus"]
    docs = f"{c['documents']:,} documents, " if c.get("documents") else ""
    line = (f"**Scale.** Every verdict here is measured on the models below, trained on "
            f"{docs}{c['train_tokens']:,} training tokens (validation {c['val_tokens']:,}); "
            f"paper {PAPERS[paper]} trained on {scale['papers'][paper]['corpus']}.")
    if paper == "paper_a":
        line += f" The `reference` recipe group is {scale['reference_recipe']}."
    return line


UNIT_RULE = {"diagnose": FEWEST_UNITS, "convergence": MIN_UNITS}  # documents wanted


def units_statement(stage: str, cells: list[str]) -> str:
    """What the report's intervals resample, read from the units `stage` recorded for
    each of `cells` ("diagnose" for paper A's, "convergence" for paper B's). Each stage
    takes documents as units where the windows span at least UNIT_RULE[stage] of them,
    and blocks of windows within documents otherwise (loopscope.stats.units); where
    blocks are used the statement says within how many documents, and whether documents
    were resampled first (with the design effect: the variance that adds)."""
    groups: dict[tuple[str, int], list[str]] = {}
    metrics = {c: read_metrics(stage, c) for c in cells}
    for c, m in metrics.items():
        groups.setdefault((m["unit"], m["units"]), []).append(c)
    parts = [f"{n} {'documents' if unit == 'document' else f'units ({unit})'} for "
             f"{', '.join(names)}" for (unit, n), names in groups.items()]
    line = "Intervals resample " + "; ".join(parts) + "."
    if any(unit != "document" for unit, _ in groups):
        line += (f" **The validation windows span fewer than {UNIT_RULE[stage]} documents, "
                 "so the units are blocks of consecutive windows within those documents**, "
                 "each as long as it takes for adjacent blocks to be nearly uncorrelated; "
                 "the intervals speak for these texts, not for documents in general.")
        effects = {c: m["design_effect"]["value"] for c, m in metrics.items()
                   if "design_effect" in m}
        if effects:
            line += (" Documents are resampled first, then blocks within them (design "
                     "effect: the variance resampling documents adds, "
                     + ", ".join(f"{c} {v:.2f}" for c, v in effects.items()) + ").")
    return line


def init_effect() -> str:
    """The claims stage's sentence on what the recipe does to paper A's drift magnitude."""
    return ("**What the recipe does to the magnitude.** "
            + (claims()["init_effect"] or "This run has one recipe group."))


def experiment_verdicts(paper: str, cells: list[str] | None = None,
                        exclude: list[str] | None = None
                        ) -> tuple[pd.DataFrame, pd.DataFrame, str] | None:
    """The default's verdicts on `paper`'s claims beside every committed experiment's
    (loopscope.judge.experiments) that changed one of `cells` but those in `exclude`
    (None: every experiment) and its baseline's, the count of each verdict per run, and
    a markdown list, an item per experiment: what it changed and the verdicts that
    turned between holds and contradicted from its baseline. None when there is none."""
    mine = [c for c in cells or [] if c not in (exclude or [])]
    exps = {n: e for n, e in recorded().items()
            if cells is None or any(k.startswith(f"cells.{c}.") for k in e["params"]
                                    for c in mine)}
    if not exps:
        return None
    table = verdict_columns(claims()[paper],
                            {n: {"claims": e["claims"][paper], "baseline": e["baseline"][paper]}
                             for n, e in exps.items()})
    lines = []
    now = claims().get("judged_with")
    for name, e in exps.items():
        turned = flips(table, name)
        changed = ", ".join(f"{k}={v}" for k, v in e["params"].items())
        named = "; ".join(f"{r.claim} [{r.group}]" for r in turned.itertuples())
        line = f"`{name}` ({changed}; run on {e['base_commit'][:7]}): "
        if stale(e, now):
            line += ("**judged under other criteria than this report's** (its own baseline "
                     "is the default as judged then): its columns cannot say whether a "
                     "verdict of today's criteria would turn; rerun it to know. Against its "
                     f"own baseline, {plural(len(turned), 'verdict')} turned between holds "
                     "and contradicted")
        elif len(turned):
            line += (f"**{plural(len(turned), 'verdict')} turned between holds and "
                     f"contradicted**: {named}")
        else:
            line += "no verdict turned between holds and contradicted"
        lines.append(line)
    return table, run_counts(table), "\n".join(f"- {line}" for line in lines)


def claims_summary(paper: str) -> pd.DataFrame:
    """The compact claims table of index.html: claim, group, kind, verdict, robustness,
    what the paper says and where, and ours."""
    return claims_view(paper)[["claim", "group", "kind", "verdict", "robustness",
                               "paper says", "where", "ours"]]


# --- index -----------------------------------------------------------------------------


def provenance_table(provenance: dict[str, Any]) -> pd.DataFrame:
    """The report's provenance (computed_from's parts) as a one-column table, a row
    each; inputs_html lists the inputs."""
    return pd.DataFrame([_provenance(provenance)]).T.rename(columns={0: ""})


def headline_table() -> pd.DataFrame:
    """metrics/headline.json, a row per cell, led by the cell's group (cells.cell_group):
    which comparison each headline number belongs to."""
    headline = pd.DataFrame(read_json(paths.HEADLINE, "headline")).T
    headline.insert(0, "group", [cell_group(load_cell(paths.config_file(c)))
                                 for c in headline.index])
    return headline


# --- Outside models (index) -------------------------------------------------------------


def outside_intro() -> str:
    """What the outside models' section shows, or that the run measured none."""
    found = claims().get("outside", {})
    if not found:
        return ("No outside model was measured in this run (params.yaml's `outside:` is "
                "empty; docs/outside-models.md says how to measure a released one).")
    return (f"{plural(len(found), 'released model')} measured beside the cells by the same "
            "stages, through the looped-model interface, on the same validation text in "
            "its own tokens. Not the papers' model: no verdict reads these rows "
            "(extensions); each statistic is shown with its 95% interval where its stage "
            "gives one, beside this run's main paper B backbone.")


def outside_names() -> list[str]:
    """The outside models of tables/claims.json, by name."""
    return list(claims().get("outside", {}))


def outside_heading(name: str) -> str:
    """One outside model in a line: its adapter, checkpoint, depth and regime."""
    m = claims()["outside"][name]
    mean = "" if m["nominal_mean"] is None else f", trained at m = {m['nominal_mean']:g}"
    return (f"**{name}** ({m['adapter']} layout, {m['path']}; {m['device']} {m['precision']}): "
            f"read at R = {m['r']}{mean}; {m['regime']['words']}; "
            f"{m['tokens']:,} tokens, {m['units']} units ({m['unit']}).")


def outside_table(name: str) -> pd.DataFrame:
    """An outside model's rows: statistic, value with its interval, and the same
    statistic of the main paper B backbone."""
    def shown(v: float | None) -> str:
        return "-" if v is None else f"{v:.4g}"

    rows = []
    for r in claims()["outside"][name]["rows"]:
        interval = "" if r["lo"] is None else f" [{shown(r['lo'])}, {shown(r['hi'])}]"
        row = {"statistic": r["statistic"], "unit": r["unit"],
               name: shown(r["value"]) + interval}
        row.update({cell: shown(v) for cell, v in r["beside"].items()})
        rows.append(row)
    return pd.DataFrame(rows)
