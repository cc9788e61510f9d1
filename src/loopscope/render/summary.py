"""The front page's numbers, written by the pipeline rather than typed.

The `summary` stage renders, from the run's own outputs:
- docs/results.md: both papers' claims in full (criterion, paper's number, ours with its
  interval, verdict with its robustness mark, regime), the criteria's parameters, the
  scale of every cell against the papers', the headline metrics per cell, the exit
  runtime, and what training cost on the machine that ran it;
- docs/results/forest_a.png, forest_b.png: each paper's forest plot; docs/results/norm.png:
  paper A's hidden-state norm per loop, one line per cell;
- README.md's blocks between `<!-- begin NAME -->` and `<!-- end NAME -->` markers: each
  paper's counts (`counts`, at the top), the verdicts at a glance with the scale, and
  the training cost. `make repro` then writes
  the `timings` block (what every stage took, from metrics/stage_timings: `python -m
  loopscope.render.summary timings`). The rest of README is prose; these blocks are the
  only numbers in it, and tests/test_summary.py checks them against tables/claims.json
  and metrics/, so a hand edit fails the tests.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from loopscope.base import paths
from loopscope.base.errors import DataError
from loopscope.base.files import atomic_output
from loopscope.base.timings import read_all, summarize
from loopscope.judge.backbone import STATES
from loopscope.render.figures import forest, forest_alt
from loopscope.render.report_tables import forest_rows, plural
from loopscope.render.tables_b import depth_check_line, ledger_lines, ledger_table

README, RESULTS_PAGE, NORM_FIGURE = paths.README, paths.RESULTS_PAGE, paths.NORM_FIGURE
FOREST = {"paper_a": paths.RESULTS_FIGURES / "forest_a.png",
          "paper_b": paths.RESULTS_FIGURES / "forest_b.png"}
BENCH_EXITS = paths.BENCH / "exits.json"


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """A GitHub Markdown table, the first row's keys as columns ('|' escaped)."""
    if not rows:
        return "(none)"
    cols = list(rows[0])

    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def verdict(row: dict[str, Any]) -> str:
    """A claim's verdict, its direction and magnitude beside it where the claim has a
    magnitude, and "fragile" where a parameter's declared range turns it."""
    mag = row.get("magnitude", "n/a")
    out = row["verdict"]
    if mag not in ("n/a", "", None):
        out += f" (direction {row['direction']}, magnitude {mag})"
    if (row.get("robustness") or {}).get("mark") == "fragile":
        out += ", fragile"
    return out


def _label(row: dict[str, Any]) -> str:
    return row["claim"] + (" (extension)" if row["kind"] == "extension" else "")


def regimes(row: dict[str, Any]) -> str:
    """The regime states of the backbones a paper B row reads (its `regimes` facts):
    "in the paper's regime (backbone)"; "-" for none."""
    return "; ".join(f"{STATES[r['state']]} ({r['backbone']})"
                     for r in row.get("regimes", [])) or "-"


def _beside(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each finding's extensions (by the finding's id) in a few words: the extension's
    key, its recipe group where it is the reference's, and its verdict."""
    out: dict[str, list[str]] = {}
    for r in rows:
        if r["kind"] == "extension" and r.get("extends"):
            group = " (reference)" if r.get("group") == "reference" else ""
            out.setdefault(r["extends"], []).append(f"{r['key']}{group}: {verdict(r)}")
    return out


def verdict_rows(claims: dict[str, Any]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Paper A: one row per claim (its key), a verdict column per recipe group; paper B:
    one row per claim and backbone, with the regime of the backbones it reads. An
    extension stands beside the finding it extends (`extensions`), not on a row of its
    own (one without `extends` keeps a row, marked)."""
    beside_a, beside_b = _beside(claims["paper_a"]), _beside(claims["paper_b"])
    a: dict[str, dict[str, str]] = {}
    for r in claims["paper_a"]:
        if r["kind"] == "extension" and r.get("extends"):
            continue
        turned = " (the recipe turns it)" if r.get("recipe_turns") else ""
        row = a.setdefault(r["key"] or r["claim"], {"claim": _label(r) + turned,
                                                    "our recipe": "-",
                                                    "reference recipe": "-", "extensions": []})
        row["reference recipe" if r.get("group") == "reference" else "our recipe"] = verdict(r)
        row["extensions"] += beside_a.get(r["id"], [])
    rows_a = [{**row, "extensions": "; ".join(row["extensions"]) or "-"} for row in a.values()]
    b = [{"claim": _label(r), "verdict": verdict(r), "regime": regimes(r),
          "extensions": "; ".join(beside_b.get(r["id"], [])) or "-"}
         for r in claims["paper_b"] if not (r["kind"] == "extension" and r.get("extends"))]
    return rows_a, b


def scale_line(claims: dict[str, Any]) -> str:
    """What every verdict is measured on, against the papers: the cells' parameters and
    training tokens, the corpus and the seeds (claims.json's `scale`)."""
    scale = claims["scale"]
    cells = scale["cells"].values()
    if not cells:
        return ""
    params = [c["parameters"] for c in cells]
    tokens = [c["training_tokens"] for c in cells]
    seeds = sorted({c["seeds"] for c in cells})
    per_cell = (" or ".join(map(str, seeds)) + (" seed" if seeds == [1] else " seeds")
                + " per cell")
    corpus = scale["corpus"]
    return (f"Scale: every verdict is measured on models of {min(params) / 1e6:.2f}-"
            f"{max(params) / 1e6:.2f}M parameters trained on {min(tokens) / 1e6:.2f}-"
            f"{max(tokens) / 1e6:.2f}M tokens of a {corpus['train_tokens'] / 1e6:.2f}M-token "
            f"corpus, {per_cell}; paper A: "
            f"{scale['papers']['paper_a']['parameters']} parameters, "
            f"{scale['papers']['paper_a']['corpus']}; paper B: "
            f"{scale['papers']['paper_b']['parameters']} parameters.")


def forest_image(claims: dict[str, Any], paper: str, folder: str = "") -> str:
    """A paper's forest plot as a Markdown image, its alt text what the figure shows
    (figures.forest_alt over the same rows)."""
    rows = forest_rows(paper, claims)
    alt = forest_alt(rows, f"paper {paper[-1].upper()}'s claims")
    return f"![{alt}]({folder}{FOREST[paper].name if folder else FOREST[paper].as_posix()})"


def topic(claims: dict[str, Any], paper: str) -> str:
    """**Paper A** (the readout blind spot, *its title*)."""
    named = claims["papers"][paper]
    return f"**Paper {paper[-1].upper()}** ({named['topic']}; *{named['title']}*)"


def counts_line(claims: dict[str, Any], paper: str) -> str:
    """A paper's findings counted by verdict: "7 of 20 findings hold (8 contradicted, 4
    inconclusive, 1 not shown)"."""
    c = claims["counts"][paper]
    rest = ", ".join(f"{n} {v}" for v, n in c.items() if n and v != "holds")
    return (f"{c.get('holds', 0)} of {plural(sum(c.values()), 'finding')} "
            f"{'holds' if sum(c.values()) == 1 else 'hold'}" + (f" ({rest})" if rest else ""))


def counts_block(claims: dict[str, Any]) -> str:
    """README's first numbers: each paper's findings counted by verdict."""
    return ("What the committed run found, at its scale (extensions beyond the papers are "
            "not counted):\n\n"
            + "\n".join(f"- **Paper {p[-1].upper()}** ({claims['papers'][p]['topic']}): "
                        f"{counts_line(claims, p)}." for p in ("paper_a", "paper_b")))


def verdicts_block(claims: dict[str, Any]) -> str:
    """README's verdicts at a glance: the scale, both forest plots, each paper's rows."""
    a, b = verdict_rows(claims)
    forest = "\n".join(forest_image(claims, p) for p in FOREST)
    return (f"{scale_line(claims)}\n\n{forest}\n\n"
            f"**Paper A** ({claims['papers']['paper_a']['topic']}), in each recipe group:\n\n"
            f"{markdown_table(a)}\n\n"
            f"**Paper B** ({claims['papers']['paper_b']['topic']}). {backbone_recipes(claims)}"
            f"\n\n{markdown_table(b)}")


def train_seconds(timings: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each cell's training wall time: its runs together (`wall_seconds`: runs trained
    side by side count once), else summed over its runs (seeds)."""
    return {cell: t.get("wall_seconds") or sum(r["train_seconds"] for r in
                                               t.get("runs", {}).values())
            or float(t["train_seconds"]) for cell, t in sorted(timings.items())}


def cost_block(timings: dict[str, dict[str, Any]], machine: str) -> str:
    """README's training cost: each cell's training wall time (its runs together),
    summed (the one place README gives a training time)."""
    secs = train_seconds(timings)
    runs = sum(max(1, len(t.get("runs", {}))) for t in timings.values())
    return (f"Training the default's {plural(len(secs), 'cell')} ({plural(runs, 'run')}) took "
            f"{sum(secs.values()) / 60:.0f} min on {machine} (metrics/train_timings, summed; "
            f"per cell in [docs/results.md](docs/results.md#what-training-cost)).")


def _block_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- begin {name}\b[^>]*-->\n)(.*?)(<!-- end {name} -->)", re.S)


def replace_block(text: str, name: str, body: str) -> str:
    """text with the generated block `name` replaced by body (markers kept)."""
    if not _block_pattern(name).search(text):
        raise DataError(f"no `<!-- begin {name} -->` ... `<!-- end {name} -->` block to "
                        f"fill (README.md, or {paths.BENCHMARKS_PAGE} for the ledger); "
                        "restore the markers.")
    return _block_pattern(name).sub(lambda m: m.group(1) + body + "\n" + m.group(3), text)


def block(text: str, name: str) -> str:
    """The body of the generated block `name` in text."""
    m = _block_pattern(name).search(text)
    if m is None:
        raise DataError(f"{README}: no generated block `{name}`.")
    return m.group(2).removesuffix("\n")


def headline_rows(headline: dict[str, Any]) -> list[dict[str, str]]:
    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)
    return [{"cell": cell, "final-loop norm": num(h["norm_final"], ".1f"),
             "final-loop PPL": num(h["ppl_final"], ".1f"),
             "A1 mean loops": num(h["a1_mean_loops"], ".2f"),
             "A1 FLOPs / depth R (checks counted)": num(h["a1_flops_ratio"], ".2f")}
            for cell, h in sorted(headline.items())]


def runtime_rows(bench: dict[str, Any]) -> list[dict[str, str]]:
    """metrics/bench/exits.json as rows: each mode and policy's realized (wall clock) and
    FLOP speedup against the baseline (the smallest uniform depth matching depth R) and
    against depth R, and whether the mode's timings pass the depth check (uniform depth
    R within its share of uniform depth B's time; loopscope.measure.bench.bench_exits)."""
    base = bench["baseline_depth"]
    return [{"mode": mode, "policy": p, "mean loops": f"{b['mean_loops'][p]:.2f}",
             f"realized vs depth {base}": f"{b['realized'][p]:.2f}x",
             f"FLOP speedup vs depth {base}": f"{b['flop_speedup'][p]:.2f}x",
             "realized vs depth R": f"{b['realized_vs_r'][p]:.2f}x",
             "FLOP speedup vs depth R": f"{b['flop_speedup_vs_r'][p]:.2f}x",
             "depth check": _depth_check(b)}
            for mode in ("scoring", "generation_batch1", "generation_batched")
            if (b := bench.get(mode)) for p in b["realized"]]


def _depth_check(mode: dict[str, Any]) -> str:
    check = mode.get("depth_check")
    return ("not checked" if check is None else "holds" if check["holds"] else
            f"fails ({check['ratio']:.2f}x > {check['bound']:.2f}x)")


def backbone_recipes(claims: dict[str, Any]) -> str:
    """One line: each paper B backbone's recipe against paper B's (claims.json)."""
    found = claims.get("paper_b_recipe") or {}
    return ("Backbones, against paper B's recipe: "
            + "; ".join(f"`{c}` ({text})" for c, text in found.items()) + "."
            if found else "No paper B backbone in this run.")


def claim_rows(rows: list[dict[str, Any]], paper: str) -> list[dict[str, str]]:
    """A paper's rows for docs/results.md: claim, group (recipe group or backbones), the
    paper's number, ours, the verdict with its marks, the criterion (and paper B's
    regime)."""
    out = []
    for r in rows:
        row = {"claim": _label(r), "group": r.get("group") or "-",
               "paper": r["paper_says"], "where": r.get("source") or "-", "ours": r["value"],
               "verdict": verdict(r), "criterion": r["criterion"]}
        if paper == "b":
            row["regime"] = regimes(r)
        out.append(row)
    return out


def parameter_rows(claims: dict[str, Any]) -> list[dict[str, str]]:
    return [{"parameter": p["name"], "value": f"{p['value']:g}", "decides": p["meaning"],
             "source": p["source"], "range": ", ".join(f"{v:g}" for v in p["range"])}
            for p in claims["parameters"]]


def scale_rows(claims: dict[str, Any]) -> list[dict[str, str]]:
    return [{"cell": c, "parameters": f"{s['parameters']:,}",
             "training tokens": f"{s['training_tokens']:,}", "seeds": str(s["seeds"]),
             "recipe group": s["recipe_group"]} for c, s in claims["scale"]["cells"].items()]


def claims_sections(claims: dict[str, Any]) -> str:
    """docs/results.md's verdicts: the counts, scale and rules, each paper's forest plot
    and rows, the criteria's parameters and every cell's scale."""
    counts = "; ".join(f"paper {p[-1].upper()}'s findings: "
                       + ", ".join(f"{n} {v}" for v, n in c.items() if n)
                       for p, c in claims["counts"].items())
    rules = "\n".join(f"- **{k}**: {v}" for k, v in claims["rules"].items())
    return f"""What the committed run measured, claim by claim, for {topic(claims, "paper_a")}
and {topic(claims, "paper_b")}. Each "paper" number is the paper's own, with the section,
table or figure it comes from (`where`). Verdicts (each the direction and the magnitude
together): {counts}. How each claim is judged (the criterion, the intervals, the regime marks):
[methods](methods.md). The reports draw the same numbers:
[reports/html/index.html](../reports/html/index.html).

{scale_line(claims)}

{rules}

## Paper A: the readout blind spot

*{claims["papers"]["paper_a"]["title"]}*

{forest_image(claims, "paper_a", "results/")}

![Hidden-state norm per loop, a line per paper A cell, our recipe and the reference recipe \
side by side](results/{NORM_FIGURE.name})

{markdown_table(claim_rows(claims["paper_a"], "a"))}

{claims.get("init_effect", "")}

## Paper B: per-token fixed-point convergence

*{claims["papers"]["paper_b"]["title"]}*

{backbone_recipes(claims)}

{forest_image(claims, "paper_b", "results/")}

{markdown_table(claim_rows(claims["paper_b"], "b"))}

## The criteria's free parameters

Each row is judged at these values and again at every other value of the range of each
parameter it reads; a row whose verdict turns is marked fragile.

{markdown_table(parameter_rows(claims))}

## Scale

{markdown_table(scale_rows(claims))}
"""


def page(claims: dict[str, Any], headline: dict[str, Any], timings: dict[str, Any],
         bench: dict[str, Any], machine: str) -> str:
    """docs/results.md: every number from the run's files."""
    secs = train_seconds(timings)
    cost = [{"cell": c, "runs": max(1, len(timings[c].get("runs", {}))),
             "train (s)": f"{s:.0f}"} for c, s in secs.items()]
    runtime = (f"`bench_exits` on `{bench['cell']}` ({bench['run']}), R = "
               f"{bench['r']}: the smallest uniform depth matching depth R's "
               f"quality is {bench['matched_depth']}, so the baseline is depth "
               f"{bench['baseline_depth']}. Realized: the baseline's wall time over the "
               f"policy's, measured side by side ({bench['repeats']} repeats).\n\n"
               + markdown_table(runtime_rows(bench)) + "\n\n" + depth_check_line(bench))
    return f"""# Results of the default run

<!-- generated by the `summary` stage (loopscope.render.summary) from tables/claims.json and
metrics/; do not edit: `dvc repro summary` rewrites it -->

{claims_sections(claims)}
## Headline metrics per cell

metrics/headline.json (`dvc exp show` lists the same):

{markdown_table(headline_rows(headline))}

## The exit runtime

{runtime}

## What training cost

On {machine}; metrics/train_timings, each cell's runs summed. The measuring stages
(extract, diagnose, policies, convergence, bench, reports) come on top.

{markdown_table(cost)}

Total: {sum(secs.values()) / 60:.0f} min of training.
"""


def norm_figure(norm_csv: Path, out: Path, cells: dict[str, dict[str, Any]]) -> None:
    """Paper A's figure: mean ||H_k|| per loop, log scale, one labelled line per cell;
    our recipe and the reference recipe side by side (cells: claims.json's facts of
    each cell, its group and recipe group)."""
    df = pd.read_csv(norm_csv)
    df = df[df["series"].map(lambda c: cells[c]["group"] != "paper B backbone")]
    ref = df["series"].map(lambda c: cells[c]["recipe_group"] == "reference")
    groups = [("our recipe", df[~ref]), ("paper A's reference recipe", df[ref])]
    setting = {c: (f["loss"], f["readout"], f["control"]) for c, f in cells.items()}
    names = sorted({setting[c] for c in df["series"]})
    colour = {n: f"C{i % 10}" for i, n in enumerate(names)}  # one colour per setting
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (title, part) in zip(axes, groups, strict=True):
        for series, g in part.groupby("series", sort=True):
            ax.plot(g["loop"], g["norm"], marker="o", color=colour[setting[series]],
                    label=series,
                    ls="-" if cells[series]["group"] == "normed baseline" else "--")
        ax.set(yscale="log", xlabel="loop k", title=title)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("mean ||H_k|| (log)")
    fig.suptitle("Hidden-state norm per loop, paper A's cells: normed readout without "
                 "scale control solid, the others dashed")
    fig.tight_layout()
    with atomic_output(out) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)


def forest_figures(out: dict[str, Path]) -> None:
    """Each paper's forest plot (loopscope.render.figures.forest) for the front page."""
    for paper, path in out.items():
        drawn = forest(forest_rows(paper), f"paper {paper[-1].upper()}'s claims")
        with atomic_output(path) as tmp:
            drawn.fig.savefig(tmp, dpi=100, format="png", bbox_inches="tight")
        plt.close(drawn.fig)


def machine_of(bench: dict[str, Any]) -> str:
    """The machine the pipeline ran on, as the exit benchmark recorded it: a function of
    the committed files, so the generated blocks check on any machine."""
    m = bench["machine"]
    return f"{m['cpu']} {m['device']}, {m['threads']} threads"


def _read(path: Path) -> Any:
    if not path.exists():
        raise DataError(f"{path} is missing; run `dvc repro` (it comes before the summary).")
    return json.loads(path.read_text())


def read_timings(cells: list[str]) -> dict[str, Any]:
    return {c: _read(paths.metrics_file(paths.TRAIN_TIMINGS, c)) for c in cells}


def inputs(cells: list[str]) -> dict[str, Any]:
    """Everything the generated text is a function of, read from the run's files."""
    bench = _read(BENCH_EXITS)
    return {"claims": _read(paths.CLAIMS), "headline": _read(paths.HEADLINE),
            "timings": read_timings(cells), "bench": bench, "machine": machine_of(bench)}


def readme_blocks(x: dict[str, Any]) -> dict[str, str]:
    """README's generated blocks, by name."""
    return {"counts": counts_block(x["claims"]), "verdicts": verdicts_block(x["claims"]),
            "cost": cost_block(x["timings"], x["machine"])}


def ledger_block(bench: dict[str, Any]) -> str:
    """docs/benchmarks.md's generated block: where the exit runtime's time goes, per
    mode (tables_b.ledger_table and ledger_lines), on the machine that ran it."""
    table = ledger_table(bench)
    if table is None:
        return "This run timed no policy at matched quality: no ledger."
    rows = [{k: f"{v:.4f}" if isinstance(v, float) else v for k, v in r.items()}
            for r in table.to_dict("records")]
    return (f"On {machine_of(bench)}, `{bench['ledger']['policy']}` at its matched threshold "
            f"against uniform depth {bench['ledger']['uniform_depth']} (metrics/bench/"
            f"exits.json's `ledger`):\n\n{markdown_table(rows)}\n\n"
            + "\n\n".join(ledger_lines(bench)))


def timings_block(found: dict[str, dict[str, Any]]) -> str:
    """What every stage took, each as it last ran (metrics/stage_timings, summed by
    loopscope.base.timings): the pipeline's own time, without the venv's install. The
    training time alone is the cost block's (README gives it once)."""
    t = summarize(found)
    total = (t["training_seconds"] + t["measuring_seconds"]) / 60
    cores = "/".join(str(c) for c in sorted({f.get("cores", 0) for f in found.values()}))
    return (f"The {plural(t['stages'], 'stage')} of this run, each as it last ran, took "
            f"{total:.0f} min on {', '.join(t['cpus'])} ({cores} cores), training included; "
            f"the stages after training took {t['measuring_seconds'] / 60:.1f} min of it "
            "(metrics/stage_timings; `python -m loopscope.base.timings` itemizes them).")


def stale_blocks(text: str, x: dict[str, Any]) -> list[str]:
    """The generated blocks of README text that differ from the run's files (empty:
    README says what the run measured)."""
    found = {**readme_blocks(x), "timings": timings_block(read_all())}
    return [name for name, body in found.items() if block(text, name) != body]


def write_timings() -> None:
    """README's `timings` block from metrics/stage_timings (`make repro` runs it after
    `dvc repro`: the summary stage cannot read the timings of stages that run after it,
    its own included)."""
    text = replace_block(README.read_text(), "timings", timings_block(read_all()))
    with atomic_output(README) as tmp:
        tmp.write_text(text)


def write(cells: list[str]) -> None:
    """Render docs/results.md, its figure and README's generated blocks."""
    x = inputs(cells)
    norm_figure(paths.PLOTS / "norm.csv", NORM_FIGURE, x["claims"]["cells"])
    forest_figures(FOREST)
    with atomic_output(RESULTS_PAGE) as tmp:
        tmp.write_text(page(**x))
    text = README.read_text()
    for name, body in readme_blocks(x).items():
        text = replace_block(text, name, body)
    with atomic_output(README) as tmp:
        tmp.write_text(text)
    bench = replace_block(paths.BENCHMARKS_PAGE.read_text(), "ledger", ledger_block(x["bench"]))
    with atomic_output(paths.BENCHMARKS_PAGE) as tmp:
        tmp.write_text(bench)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["timings"]:
        raise SystemExit("usage: python -m loopscope.render.summary timings")
    write_timings()
    print(f"{README}: timings block written")
