"""Reports: papermill executes a notebook template, nbconvert writes a self-contained
HTML page (titled, nothing loaded from another site); the helpers the notebooks share;
and `python -m loopscope.report screenshots` (make screenshots), which renders the pages
to PNG in headless Chromium."""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import nbformat
import numpy as np
import pandas as pd
import papermill as pm
import torch
from jupyter_client.manager import KernelManager
from nbconvert import HTMLExporter

from loopscope import paths
from loopscope.claims import CellA, init_effect, paper_a_claims, paper_b_claims, table
from loopscope.config import CellConfig, load_cell
from loopscope.depth import SAMPLERS
from loopscope.errors import atomic_write_bytes, require_output

# Every verdict of both papers, as data: written by the claims stage, rendered by the
# reports (and kept per experiment, so runs with other seeds compare claim by claim).
CLAIMS = paths.TABLES / "claims.json"

# nbconvert's `lab` page with every block that loads a script from a CDN emptied:
# require.js (only widgets and old-style JS outputs need it; the reports have neither),
# MathJax (the reports write no LaTeX), mermaid.js (imported on demand from a CDN) and
# the widget manager. The reports then read the same offline as online, and opening one
# contacts no third party. Kept here, not in a template file, so that the report
# stages, which depend on this module, rerun when it changes.
OFFLINE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""


def table_display() -> None:
    """pandas' table display for the reports: 4 significant decimals rather than 6, and
    "-" where a value does not apply (a paper A cell has no A1 exit, say) instead of
    "nan". Called by every report before its first table."""
    pd.set_option("display.precision", 4)
    pd.set_option("styler.format.precision", 4)
    pd.set_option("styler.format.na_rep", "-")
    pd.set_option("display.float_format", lambda v: "-" if v != v else f"{v:.4g}")


def cell_group(cell: CellConfig) -> str:
    """Which group of paper A's comparisons a cell belongs to: the normed baseline, a
    scale-controlled variant (raw readout, norm penalty or inter-loop norm), final-norm
    only, or a paper B backbone (sampled depth), which no paper A claim uses."""
    m, t = cell.model, cell.train
    if SAMPLERS[t.depth].varies:
        return "paper B backbone"
    if m.inter_loop_norm or t.norm_penalty > 0 or m.readout == "raw":
        return "scale-controlled"
    return "normed baseline" if m.readout == "normed" else "final-norm only"


def recipe(cell: CellConfig) -> str:
    """A label for a cell's training recipe: architecture and init (what paper A's
    reference code uses is named so), then the schedule (ours unless it is the
    reference's constant lr 3e-4 with AdamW betas 0.9/0.999). Paper A's cells are
    compared within one recipe."""
    m, t = cell.model, cell.train
    reference = m.init == "paper_a" and m.ffn == "swiglu" and t.decay_on == "all"
    arch = ("paper A's reference architecture and init" if reference else "ours")
    arch += f" (init {m.init}, {m.ffn}, decay on {t.decay_on})"
    warm = f", warm-up {t.warmup_steps}" if t.warmup_steps else ""
    theirs = t.schedule == "constant" and t.lr == 3e-4 and tuple(t.betas) == (0.9, 0.999)
    return (f"{arch}; schedule {'paper A' if theirs else 'ours'} ({t.schedule} lr {t.lr:g}"
            f"{warm}, betas {t.betas[0]:g}/{t.betas[1]:g})")


def paper_a_cells(cells: list[str]) -> dict[str, CellA]:
    """claims.CellA of each cell, read from configs/, tables/diagnose, tables/sweep,
    metrics/clamp, metrics/throughput and metrics/diagnose (its resampling unit); a
    missing file names the stage to run."""
    def table(kind: str, cell: str) -> pd.DataFrame:
        return pd.read_parquet(require_output(paths.table_file(kind, cell),
                                              f"diagnose@{cell}"))

    def metrics(kind: str, cell: str) -> dict[str, Any]:
        path = paths.metrics_file(kind, cell)
        stage = kind if kind == "throughput" else f"{kind}@{cell}"
        return json.loads(require_output(path, stage).read_text())

    out = {}
    for c in cells:
        cfg = load_cell(paths.config_file(c))
        speed = metrics("throughput", c)
        out[c] = CellA(cell_group(cfg), cfg.train.loss, cfg.model.readout, recipe(cfg),
                       cfg.model.loops, table("diagnose", c), table("sweep", c),
                       metrics("clamp", c), speed["tokens_per_s"], speed["flops_per_token"],
                       metrics("diagnose", c).get("unit", "document"))
    return out


def paper_b_backbones(configs: dict[str, CellConfig]) -> tuple[str | None, str | None]:
    """(main, second) of the paper B backbones: the one with the deepest training mean
    (paper B's main setting, mean 8) and the shallowest other one (its saturation test,
    mean 4); None where absent."""
    by_depth = sorted(configs, key=lambda c: configs[c].model.loops)
    if not by_depth:
        return None, None
    main, second = by_depth[-1], by_depth[0]
    return main, second if configs[second].model.loops != configs[main].model.loops else None


def judge(cells: list[str], policy_cells: list[str], margin: float, resamples: int
          ) -> dict[str, Any]:
    """Both papers' claims on this run's outputs (tables/claims.json): each table as
    rows (loopscope.claims.table), the verdict counts, and the sentence on what the
    recipe does to paper A's drift magnitude."""
    configs = {c: load_cell(paths.config_file(c)) for c in cells}
    groups = {c: cell_group(configs[c]) for c in cells}
    data = paper_a_cells([c for c in cells if groups[c] != "paper B backbone"])
    main, second = paper_b_backbones({c: configs[c] for c in cells
                                      if groups[c] == "paper B backbone"})

    def read(kind: str, cell: str) -> dict[str, Any]:
        path = paths.metrics_file(kind, cell)
        return json.loads(require_output(path, f"{kind}@{cell}").read_text())

    found = {"paper_a": paper_a_claims(data, margin, resamples),
             "paper_b": paper_b_claims({c: read("convergence", c) for c in cells},
                                       {c: read("policies", c) for c in policy_cells},
                                       main, second)}
    out: dict[str, Any] = {k: table(v) for k, v in found.items()}
    out["counts"] = {k: {verdict: sum(c.verdict == verdict for c in v)
                         for verdict in ("holds", "contradicted", "inconclusive", "not shown")}
                     for k, v in found.items()}
    out["init_effect"] = init_effect(data, resamples)
    return out


def training_precision() -> str:
    """The precision the cells trained in, from configs/ (configure resolves auto), e.g.
    "fp32" or "bf16 (backbone, backbone_mean4), fp32 (the other 8)"."""
    by: dict[str, list[str]] = {}
    for f in sorted(paths.CONFIGS.glob("*.json")):
        by.setdefault(load_cell(f).train.precision, []).append(f.stem)
    if len(by) <= 1:
        return next(iter(by), "unknown (no configs/)")
    rest = max(by, key=lambda p: len(by[p]))
    named = [f"{p} ({', '.join(c)})" for p, c in by.items() if p != rest]
    return ", ".join(named) + f", {rest} (the other {len(by[rest])})"


def provenance(seeds: list[int]) -> dict[str, str]:
    """What a report was computed from: commit, params digest, torch, training precision
    (measurements are fp32 whatever it was), seeds, date."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                "src", "stages", "reports/*.ipynb", "params.yaml", "dvc.yaml"],
                               capture_output=True, text=True, check=True).stdout.strip()
        commit += " (with uncommitted changes)" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown (not a git checkout)"
    return {"commit": commit,
            "params.yaml sha256": hashlib.sha256(paths.PARAMS.read_bytes()).hexdigest()[:16],
            "torch": torch.__version__,
            "training precision": training_precision() + " (measured in fp32)",
            "seeds": ", ".join(map(str, seeds)),
            "date": datetime.date.today().isoformat()}


def page_title(nb: nbformat.NotebookNode) -> str:
    """The HTML page's title: the notebook's `title` metadata, else its first level-1
    markdown heading, as plain text.

    nbconvert falls back to the notebook's file name, and for a notebook exported from
    memory to "Notebook": every report's browser tab, bookmark and history entry then
    read "Notebook". The heading is what the page says it is, so the title cannot drift
    from it."""
    if nb.metadata.get("title"):
        return str(nb.metadata["title"])
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            if line.startswith("# "):
                text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line[2:])  # [text](url) -> text
                return re.sub(r"[*`]", "", text).strip()
    raise ValueError("the report has no title: give its first markdown cell a '# heading' "
                     "(or set the notebook's metadata 'title').")


def export_html(nb: nbformat.NotebookNode) -> str:
    """nb as a self-contained HTML page: code and prompts hidden, titled by page_title,
    and no script or stylesheet fetched from another site (OFFLINE_TEMPLATE); figures
    are inline PNGs already."""
    exporter = HTMLExporter(raw_template=OFFLINE_TEMPLATE, exclude_input=True,
                            exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": page_title(nb)}})
    return body


def render(template: Path, html_out: Path, parameters: dict[str, Any], timeout_s: int) -> None:
    """Execute template with parameters and write the HTML (export_html) atomically.

    A failing notebook cell raises papermill's PapermillExecutionError and no HTML is
    written, so a broken report is never cached as a good one.
    """
    if not template.is_file():
        raise FileNotFoundError(f"{template}: report template not found.")
    page_title(nbformat.read(template, as_version=4))  # a missing title fails before running
    # The kernel inherits our environment; a non-inline MPLBACKEND would drop every figure.
    os.environ.pop("MPLBACKEND", None)
    with tempfile.TemporaryDirectory() as tmp:
        executed = Path(tmp) / template.name

        class LocalKernel(KernelManager):
            """The kernel talks over IPC sockets in our temporary folder: no TCP ports
            opened, and no 'running over TCP without encryption' warning."""

            def __init__(self, **kwargs: Any) -> None:
                super().__init__(transport="ipc", ip=str(Path(tmp) / "kernel"), **kwargs)

        pm.execute_notebook(str(template), str(executed), parameters=parameters,
                            kernel_name="python3", cwd=os.getcwd(), progress_bar=False,
                            execution_timeout=timeout_s, kernel_manager_class=LocalKernel)
        nb = nbformat.read(executed, as_version=4)
    body = export_html(nb)
    html_out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(html_out, body.encode())


# Screenshots: `make screenshots` renders each reports/html page in headless Chromium, to
# look at a run's reports as a reader will without opening a browser.
SCREENSHOT_WIDTH = 1400  # px: the reports' widest figures (about 1300 px) fit unscaled
# The viewport is this tall, then the blank rows below the page are cut off: headless
# Chromium's --screenshot captures the viewport, not the page, and has no full-page
# option. 20000 px holds the longest report with room to spare (convergence: ~10000).
SCREENSHOT_MAX_HEIGHT = 20000
CHROMIUM_PACKAGE = "chromium"  # Debian's package, and the command it installs


def screenshot(page: Path, png: Path, width: int = SCREENSHOT_WIDTH,
               max_height: int = SCREENSHOT_MAX_HEIGHT) -> int:
    """Write a full-page PNG of an HTML page; returns its height in px.

    Chromium runs headless, offline (every host name resolves to nothing: the PNG shows
    the page as a reader without network sees it), with its own throwaway profile. A
    page taller than max_height raises, rather than being cut silently."""
    from PIL import Image  # matplotlib's dependency; only screenshots need it

    browser = shutil.which(CHROMIUM_PACKAGE)
    if browser is None:
        raise FileNotFoundError(f"screenshots need headless Chromium: apt-get install -y "
                                f"{CHROMIUM_PACKAGE} (Debian's package)")
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)  # a PNG left by an earlier run must not pass for this one
    with tempfile.TemporaryDirectory() as profile:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--force-device-scale-factor=1", "--host-resolver-rules=MAP * ~NOTFOUND",
               f"--user-data-dir={profile}", f"--window-size={width},{max_height}",
               f"--screenshot={png.resolve()}", page.resolve().as_uri()]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or not png.is_file():
        raise RuntimeError(f"{browser} failed on {page} ({done.returncode}): "
                           f"{done.stderr.strip()[-2000:]}")
    with Image.open(png) as im:
        rgb = np.asarray(im.convert("RGB"))
    # the last row that differs from the page's background (the bottom-left pixel)
    drawn = np.nonzero((rgb != rgb[-1, 0]).any(axis=(1, 2)))[0]
    bottom = int(drawn[-1]) if len(drawn) else 0
    if bottom >= rgb.shape[0] - 1:
        raise ValueError(f"{page} is taller than {max_height} px: raise the height "
                         "(make screenshots SCREENSHOT_HEIGHT=...)")
    height = min(rgb.shape[0], bottom + 24)  # keep a margin below the page's last line
    Image.fromarray(rgb[:height]).save(png)
    return height


def main(argv: list[str] | None = None) -> None:
    """`python -m loopscope.report screenshots [HTML_DIR] [PNG_DIR]`: one PNG per page."""
    parser = argparse.ArgumentParser(prog="python -m loopscope.report")
    parser.add_argument("command", choices=["screenshots"])
    parser.add_argument("html_dir", nargs="?", type=Path, default=paths.REPORTS_HTML)
    parser.add_argument("png_dir", nargs="?", type=Path,
                        default=paths.REPORTS / "screenshots")
    parser.add_argument("--width", type=int, default=SCREENSHOT_WIDTH)
    parser.add_argument("--height", type=int, default=SCREENSHOT_MAX_HEIGHT,
                        help="the tallest page the viewport holds (px)")
    args = parser.parse_args(argv)
    pages = sorted(args.html_dir.glob("*.html"))
    if not pages:
        sys.exit(f"no *.html in {args.html_dir}: render the reports first (dvc repro)")
    for page in pages:
        png = args.png_dir / f"{page.stem}.png"
        height = screenshot(page, png, args.width, args.height)
        print(f"{png}: {args.width} x {height} px")


if __name__ == "__main__":
    main()
