"""The file layout of a loopscope run, written once.

Stage scripts, `plan`, the tests and the report notebooks ask this module where things
are; dvc.yaml names the same paths as stage deps and outs (tests/test_layout.py checks
that the two agree). All paths are relative to the repository root, where DVC runs the
stages.

    params.yaml                      the parameters
    prepared/                        tokenizer.json, train.bin, val.bin, meta.json
    prepared_outside/<name>/         an outside model's tokenizer.json, val.bin, meta.json
    configs/<cell>.json              each cell's (and outside model's) resolved config
    models/<cell>/seed<N>.pt         one trained model per cell and seed
    checkpoints/<cell>/seed<N>/last.pt   resume state while a run trains (not a DVC output)
    dvclive/<cell>/                  training logs
    extracts/<cell>/seed<N>/         per-loop hidden states of a validation slice
    metrics/<kind>/<cell>.json       per-cell metrics (kind: train, diagnose, clamp, ...)
    metrics/train_timings/<cell>.json   the training runs' wall times (vary between runs)
    metrics/stage_timings/<stage>.json  each stage's wall time and peak memory (timings)
    metrics/headline.json            the few numbers `dvc exp show` should list
    tables/<kind>/<cell>.parquet     per-token or per-setting tables the reports draw
    tables/plots/<name>.csv          long tables across cells for `dvc plots` (plot_tables)
    metrics/bench/<name>.json        benchmark timings (python -m loopscope.tools.bench)
    reports/<name>.ipynb             report templates; reports/html/<name>.html rendered
    experiments/<name>.json          committed experiments' params and verdicts
    README.md, docs/results.md, docs/results/   the front page and results (summary)
    docs/depth.md, docs/depth/       paper B's depth-use search (tools/levers)
"""

from __future__ import annotations

from pathlib import Path

PARAMS = Path("params.yaml")
PREPARED = Path("prepared")
# The validation text in each outside model's own tokens (loopscope.weights.outside_config)
PREPARED_OUTSIDE = Path("prepared_outside")
CONFIGS = Path("configs")
MODELS = Path("models")
CHECKPOINTS = Path("checkpoints")
DVCLIVE = Path("dvclive")
EXTRACTS = Path("extracts")
METRICS = Path("metrics")
HEADLINE = METRICS / "headline.json"
TABLES = Path("tables")
BENCH = METRICS / "bench"
PLOTS = TABLES / "plots"
# Every verdict of both papers, as data: written by the claims stage, rendered by the
# reports (and kept per experiment, so runs with other seeds compare claim by claim).
CLAIMS = TABLES / "claims.json"
# The headline verdict counts of each paper's findings, a DVC metric (`dvc exp show`)
CLAIM_COUNTS = METRICS / "claims.json"
# The metrics kind of the training runs' wall times: kept out of metrics/train/ and the
# model files, which are then byte-identical for the same params.
TRAIN_TIMINGS = "train_timings"
# Each stage's wall time and peak memory (loopscope.base.timings), written by the stage
# runner (loopscope.stage).
STAGE_TIMINGS = METRICS / "stage_timings"
REPORTS = Path("reports")
REPORTS_HTML = REPORTS / "html"
DVC_LOCK = Path("dvc.lock")
# Committed experiments: a `dvc exp run`'s params and verdicts (loopscope.judge.experiments)
EXPERIMENTS = Path("experiments")
# The front page and its generated pages (loopscope.render.summary)
README = Path("README.md")
DOCS = Path("docs")
RESULTS_PAGE = DOCS / "results.md"
BENCHMARKS_PAGE = DOCS / "benchmarks.md"  # its `ledger` block: the summary stage's
RESULTS_FIGURES = DOCS / "results"
NORM_FIGURE = RESULTS_FIGURES / "norm.png"
# paper B's depth-use search (loopscope.tools.levers): its page, results and figure
DEPTH_PAGE = DOCS / "depth.md"
DEPTH_RESULTS = DOCS / "depth" / "results.json"
DEPTH_FIGURE = DOCS / "depth" / "depth.png"
SEED_PREFIX = "seed"


def seed_tag(seed: int) -> str:
    """The name of one training run of a cell: models/<cell>/<tag>.pt and so on."""
    return f"{SEED_PREFIX}{seed}"


def outside_prepared(name: str) -> Path:
    """prepared_outside/<name>/: the validation split in outside model name's tokens."""
    return PREPARED_OUTSIDE / name


def config_file(cell: str) -> Path:
    return CONFIGS / f"{cell}.json"


def model_dir(cell: str) -> Path:
    return MODELS / cell


def model_file(cell: str, seed: int) -> Path:
    return model_dir(cell) / f"{seed_tag(seed)}.pt"


def run_files(cell: str) -> list[Path]:
    """The trained runs of a cell on disk, in seed order."""
    paths = model_dir(cell).glob(f"{SEED_PREFIX}*.pt")
    return sorted(paths, key=lambda p: int(p.stem.removeprefix(SEED_PREFIX)))


def resume_file(cell: str, seed: int) -> Path:
    return CHECKPOINTS / cell / seed_tag(seed) / "last.pt"


def dvclive_dir(cell: str) -> Path:
    return DVCLIVE / cell


def extract_dir(cell: str, tag: str) -> Path:
    """extracts/<cell>/<tag>/ for the run named tag (see seed_tag)."""
    return EXTRACTS / cell / tag


def metrics_file(kind: str, cell: str) -> Path:
    return METRICS / kind / f"{cell}.json"


def table_file(kind: str, cell: str) -> Path:
    return TABLES / kind / f"{cell}.parquet"


def plot_table(name: str) -> Path:
    return PLOTS / f"{name}.csv"


def bench_file(name: str) -> Path:
    """metrics/bench/<name>.json: a benchmark's timings (they vary between runs)."""
    return BENCH / f"{name}.json"


def report_template(name: str) -> Path:
    return REPORTS / f"{name}.ipynb"


def report_html(name: str) -> Path:
    return REPORTS_HTML / f"{name}.html"
