"""The front page's numbers, written by the pipeline rather than typed.

The `summary` stage renders, from the run's own outputs:
- docs/results.md: both papers' claims in full (criterion, paper's number, ours with its
  interval, verdict, regime), the headline metrics per cell, the exit runtime, and what
  training cost on the machine that ran it;
- docs/results/norm.png: paper A's hidden-state norm per loop, one line per cell;
- README.md's blocks between `<!-- begin NAME -->` and `<!-- end NAME -->` markers: the
  verdicts at a glance and the training cost. The rest of README is prose; these blocks
  are the only numbers in it, and tests/test_summary.py checks them against
  tables/claims.json and metrics/, so a hand edit fails the tests.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from loopscope.base import paths
from loopscope.base.errors import DataError
from loopscope.base.files import atomic_output

README = Path("README.md")
RESULTS_PAGE = Path("docs") / "results.md"
NORM_FIGURE = Path("docs") / "results" / "norm.png"
REFERENCE_PREFIX = "ref_"  # paper A's reference-recipe group (params.yaml's cells)
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
    """A claim's verdict, its magnitude's beside it where the claim has one."""
    mag = row.get("magnitude", "n/a")
    return row["verdict"] + ("" if mag in ("n/a", "", None) else f" (magnitude: {mag})")


def _group(row: dict[str, Any]) -> str:
    """A paper A row's recipe group; a row with no recipe (a claim "not shown" because
    params.yaml has no paper A cells, as in the paper B presets) is ours."""
    return ("reference" if row.get("recipe", "").startswith("paper A's reference")
            else "ours")


def short_regime(marks: str) -> str:
    """paper_b.Backbone.regime's marks without their numbers: "in the paper's regime
    (backbone)"; "-" for none."""
    found = re.findall(r"((?:in|outside|at the edge of) the paper's regime) \((\w+):", marks)
    return "; ".join(f"{state} ({name})" for state, name in found) or "-"


def verdict_rows(claims: dict[str, Any]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Paper A: one row per claim, a verdict column per recipe group; paper B: one row
    per claim and backbone, with the regime mark of the backbones it reads (in, at the
    edge of, or outside the paper's regime; "-" for a row read on none)."""
    a: dict[str, dict[str, str]] = {}
    for r in claims["paper_a"]:
        row = a.setdefault(r["claim"], {"claim": r["claim"], "our recipe": "-",
                                        "reference recipe": "-"})
        row["our recipe" if _group(r) == "ours" else "reference recipe"] = verdict(r)
    b = [{"claim": r["claim"], "verdict": verdict(r),
          "regime": short_regime(r.get("regime", ""))}
         for r in claims["paper_b"]]
    return list(a.values()), b


def verdicts_block(claims: dict[str, Any]) -> str:
    a, b = verdict_rows(claims)
    return (f"**Paper A** (the readout blind spot), in each recipe group:\n\n"
            f"{markdown_table(a)}\n\n"
            f"**Paper B** (per-token fixed-point convergence). {backbone_recipes(claims)}"
            f"\n\n{markdown_table(b)}")


def train_seconds(timings: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each cell's training wall time, summed over its runs (seeds)."""
    return {cell: sum(r["train_seconds"] for r in t.get("runs", {}).values())
            or float(t["train_seconds"]) for cell, t in sorted(timings.items())}


def cost_block(timings: dict[str, dict[str, Any]], machine: str) -> str:
    secs = train_seconds(timings)
    runs = sum(max(1, len(t.get("runs", {}))) for t in timings.values())
    return (f"Training the default's {len(secs)} cells ({runs} runs) took "
            f"{sum(secs.values()) / 60:.0f} min on {machine} (metrics/train_timings, summed; "
            f"per cell in [docs/results.md](docs/results.md#what-training-cost)).")


def _block_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- begin {name}\b[^>]*-->\n)(.*?)(<!-- end {name} -->)", re.S)


def replace_block(text: str, name: str, body: str) -> str:
    """text with the generated block `name` replaced by body (markers kept)."""
    if not _block_pattern(name).search(text):
        raise DataError(f"{README}: no `<!-- begin {name} -->` ... `<!-- end {name} -->` "
                        "block to fill; restore the markers.")
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
             "A1 FLOPs / depth R": num(h["a1_flops_ratio"], ".2f")}
            for cell, h in sorted(headline.items())]


def runtime_rows(bench: dict[str, Any]) -> list[dict[str, str]]:
    """metrics/bench/exits.json as rows: each mode and policy's realized speedup against
    the baseline (the smallest uniform depth matching depth R) and against depth R."""
    base = bench["baseline_depth"]
    return [{"mode": mode, "policy": p, "mean loops": f"{b['mean_loops'][p]:.2f}",
             f"realized vs depth {base}": f"{b['realized'][p]:.2f}x",
             f"FLOP speedup vs depth {base}": f"{b['flop_speedup'][p]:.2f}x",
             "realized vs depth R": f"{b['realized_vs_r'][p]:.2f}x"}
            for mode in ("scoring", "generation_batch1", "generation_batched")
            if (b := bench.get(mode)) for p in b["realized"]]


def backbone_recipes(claims: dict[str, Any]) -> str:
    """One line: each paper B backbone's recipe against paper B's (claims.json)."""
    found = claims.get("paper_b_recipe") or {}
    return ("Backbones, against paper B's recipe: "
            + "; ".join(f"`{c}` ({text})" for c, text in found.items()) + "."
            if found else "No paper B backbone in this run.")


def claim_rows(rows: list[dict[str, Any]], paper: str) -> list[dict[str, str]]:
    keys = (["claim", "recipe"] if paper == "a" else ["claim", "depth_use"]) + [
        "paper", "value", "verdict", "criterion"] + (["regime"] if paper == "b" else [])
    return [{k.replace("_", " "): (verdict(r) if k == "verdict" else r.get(k) or "-")
             for k in keys} for r in rows]


def page(claims: dict[str, Any], headline: dict[str, Any], timings: dict[str, Any],
         bench: dict[str, Any], machine: str) -> str:
    """docs/results.md: every number from the run's files."""
    secs = train_seconds(timings)
    cost = [{"cell": c, "runs": max(1, len(timings[c].get("runs", {}))),
             "train (s)": f"{s:.0f}"} for c, s in secs.items()]
    runtime = (f"`bench_exits` on `{bench['cell']}` ({bench['run']}), R = "
               f"{bench['reference_depth']}: the smallest uniform depth matching depth R's "
               f"quality is {bench['matched_depth']}, so the baseline is depth "
               f"{bench['baseline_depth']}. Realized: the baseline's wall time over the "
               f"policy's, measured side by side ({bench['repeats']} repeats).\n\n"
               + markdown_table(runtime_rows(bench)))
    counts = "; ".join(f"paper {p[-1].upper()}: " + ", ".join(f"{n} {v}" for v, n in c.items())
                       for p, c in claims["counts"].items())
    return f"""# Results of the default run

<!-- generated by the `summary` stage (loopscope.render.summary) from tables/claims.json and
metrics/; do not edit: `dvc repro summary` rewrites it -->

What the committed run measured. Verdicts: {counts}. How each claim is judged (the
criterion, the intervals, the regime marks): [methods](methods.md). The reports draw the
same numbers: [reports/html/index.html](../reports/html/index.html).

## Paper A: the readout blind spot

![Hidden-state norm per loop](results/{NORM_FIGURE.name})

{markdown_table(claim_rows(claims["paper_a"], "a"))}

{claims.get("init_effect", "")}

## Paper B: per-token fixed-point convergence

{backbone_recipes(claims)}

{markdown_table(claim_rows(claims["paper_b"], "b"))}

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


def norm_figure(norm_csv: Path, out: Path) -> None:
    """Paper A's figure: mean ||H_k|| per loop, log scale, one labelled line per cell;
    our recipe and the reference recipe side by side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.read_csv(norm_csv)
    df = df[~df["series"].str.startswith("backbone")]
    groups = [("our recipe", df[~df["series"].str.startswith(REFERENCE_PREFIX)]),
              ("paper A's reference recipe", df[df["series"].str.startswith(REFERENCE_PREFIX)])]
    names = sorted({s.removeprefix(REFERENCE_PREFIX) for s in df["series"]})
    colour = {n: f"C{i % 10}" for i, n in enumerate(names)}  # one colour per setting
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (title, part) in zip(axes, groups, strict=True):
        for series, g in part.groupby("series", sort=True):
            name = series.removeprefix(REFERENCE_PREFIX)
            ax.plot(g["loop"], g["norm"], marker="o", color=colour[name], label=series,
                    ls="-" if name.endswith("_normed") else "--")
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
    return {"verdicts": verdicts_block(x["claims"]),
            "cost": cost_block(x["timings"], x["machine"])}


def stale_blocks(text: str, x: dict[str, Any]) -> list[str]:
    """The generated blocks of README text that differ from the run's files (empty:
    README says what the run measured)."""
    return [name for name, body in readme_blocks(x).items() if block(text, name) != body]


def write(cells: list[str]) -> None:
    """Render docs/results.md, its figure and README's generated blocks."""
    x = inputs(cells)
    norm_figure(paths.PLOTS / "norm.csv", NORM_FIGURE)
    with atomic_output(RESULTS_PAGE) as tmp:
        tmp.write_text(page(**x))
    text = README.read_text()
    for name, body in readme_blocks(x).items():
        text = replace_block(text, name, body)
    with atomic_output(README) as tmp:
        tmp.write_text(text)
