"""End to end: the real `dvc repro` on a copy of the repository with micro params.

Every test gets the state it needs from a fixture, so each passes alone and in any
order: one from-scratch `dvc repro` (conftest's session fixture `reproduced`) is shared;
the tests that only read its results read it in place; a test that changes the
repository (params, `dvc repro`, `dvc exp run`) works on its own copy of it (`repo`), and
the queued sweep on the module's copy (`sweep`), which its tests only read. Every test
here is marked slow: `make test` leaves them out, `make test-slow` runs them.
"""

import json
import math
import re
import shutil
import time
from pathlib import Path

import jsonschema
import pytest
import yaml
from conftest import SHARES_REPRO
from micro import SEEDS, copy_repo, copy_state, params_read, sh
from test_provenance import report_digests

from loopscope.base import provenance
from loopscope.judge import claims as judged
from loopscope.render import summary
from loopscope.weights import compute
from loopscope.weights.config import TrainConfig

pytestmark = pytest.mark.slow

# Paper A's normed and raw readouts, both loss placements, and paper B's backbone.
CELLS = ["terminal_normed", "perloop_normed", "perloop_raw", "perloop_stable", "backbone"]
PER_CELL = ("train", "extract", "diagnose", "convergence", "policies")


# Keys a stage reads on some corpora only: the default reads neither (no hub corpus)
SOMETIMES = {"prepare": {"data.hub_config", "data.hub_documents"}}


@SHARES_REPRO
def test_each_stage_read_exactly_the_params_keys_dvc_yaml_lists(reproduced):
    """What each stage's code really read in the run (the params view records every key
    it hands out) against the stage's params in dvc.yaml: a key read but not listed would
    leave results DVC calls up to date after a change; a key listed but never read reruns
    a stage for nothing."""
    stages = yaml.safe_load((reproduced / "dvc.yaml").read_text())["stages"]
    recorded = {p.stem: set(json.loads(p.read_text()))
                for p in params_read(reproduced).glob("*.json")}
    assert {"prepare", "diagnose@backbone", "claims", "report_index"} <= set(recorded)
    assert not [s for s in recorded if s.startswith("train@")]  # training reads no params
    for stage, read in recorded.items():
        if stage == "configure":
            continue  # it validates the whole file, every section listed
        spec = stages[stage.split("@")[0]]
        listed = set(spec.get("do", spec).get("params", []))
        assert read <= listed, f"{stage} read {sorted(read - listed)}, not in dvc.yaml"
        unread = listed - read - SOMETIMES.get(stage, set())
        assert not unread, f"{stage} lists {sorted(unread)} and never read them"


@pytest.fixture
def repo(reproduced: Path, tmp_path: Path) -> Path:
    """A copy of the reproduced micro repository (git, DVC cache, outputs), this test's
    own to change: what it does never reaches `reproduced` or another test."""
    return copy_state(reproduced, tmp_path / "repo")


@SHARES_REPRO
def test_repro_writes_report_and_finite_metrics(reproduced):
    repo = reproduced
    html = repo / "reports" / "html" / "blind_spot.html"
    assert html.is_file() and "Hidden-state scale per loop" in html.read_text()
    for cell in ("perloop_normed", "backbone"):  # the micro run's recalibrate.cells
        recal = json.loads((repo / "metrics" / "recalibrate" / f"{cell}.json").read_text())
        assert all(math.isfinite(q["ce_temperature"]) for q in recal["loops"].values()), cell
    assert "Readout recalibration" in html.read_text()
    assert "<img" in html.read_text()  # the seaborn figure is embedded
    convergence = (repo / "reports" / "html" / "convergence.html").read_text()
    assert "Elasticity" in convergence and "<img" in convergence
    index = (repo / "reports" / "html" / "index.html").read_text()
    assert 'href="blind_spot.html"' in index and 'href="convergence.html"' in index
    assert "Paper B: per-token fixed-point convergence" in index
    # the summary stage: the results page and README's generated blocks from this run
    results = (repo / "docs" / "results.md").read_text()
    assert "| claim | group | paper | where | ours | verdict | criterion |" in results
    claims = json.loads((repo / "tables" / "claims.json").read_text())
    jsonschema.validate(claims, json.loads((repo / "tables" / claims["$schema"]).read_text()))
    assert json.loads((repo / "metrics" / "claims.json").read_text()) == judged.metrics(claims)
    # what each result names as its inputs is what dvc.lock recorded for its stage
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    assert provenance.lock_digests(lock["claims"]) == (
        claims["provenance"]["inputs"], claims["provenance"]["params"]["sha256"])
    for name, page in (("blind_spot", html.read_text()), ("convergence", convergence),
                       ("index", index)):
        assert report_digests(page) == provenance.lock_digests(lock[f"report_{name}"])
        assert "uncommitted" not in page
    readme = (repo / "README.md").read_text()
    assert summary.block(readme, "verdicts") == summary.verdicts_block(claims)
    assert (repo / "docs" / "results" / "forest_a.png").is_file()
    # every figure of every report says what it shows
    for page in (html.read_text(), convergence, index):
        alts = re.findall(r'<img alt="([^"]*)"', page)
        assert alts and all(len(a) > 40 for a in alts)
    # the fourth scale control is judged: its row, and the drift row names it
    stable = next(r for r in claims["paper_a"] if r["id"] == "A.stable_injection.ours")
    assert stable["kind"] == "extension" and stable["verdict"] != "not shown"
    # the reports get the run's seeds (provenance) and the backbones' policies (A1's claim)
    for text in (convergence, index):
        assert "42, 43" in text and "no policies metrics" not in text
    bench = json.loads((repo / "metrics" / "bench" / "exits.json").read_text())
    for mode in ("scoring", "generation_batch1", "generation_batched"):
        assert set(bench[mode]["realized"]) == set(bench[mode]["flop_speedup"])
        assert {"ratio", "bound", "holds", "rounds"} <= set(bench[mode]["depth_check"])
    for cell in CELLS:
        metrics = json.loads((repo / "metrics" / "diagnose" / f"{cell}.json").read_text())
        assert set(metrics["ppl_at_depth"]) == {"k1", "k2", "k3", "k4"}
        values = [v for group in metrics.values() if isinstance(group, dict)
                  for v in group.values()]
        assert values and all(math.isfinite(v) for v in values)
        assert metrics["seeds"] == len(SEEDS)
        for seed in SEEDS:
            assert (repo / "models" / cell / f"seed{seed}.pt").is_file()
            assert (repo / "dvclive" / cell / "plots" / "metrics" / f"seed{seed}" / "train"
                    / "loss.tsv").is_file()
            assert (repo / "extracts" / cell / f"seed{seed}" / "states.npy").is_file()
        train = json.loads((repo / "metrics" / "train" / f"{cell}.json").read_text())
        assert sorted(train["runs"]) == [f"seed{s}" for s in SEEDS]
        # two seeds, two different models
        losses = [run["final_loss"] for run in train["runs"].values()]
        assert losses[0] != losses[1]
    # resume checkpoints are deleted once their cell is done
    assert not [p for p in (repo / "checkpoints").rglob("*") if p.is_file()]
    shown = sh(["dvc", "metrics", "show", "--json"], repo).stdout
    assert "norm_mean" in shown and "ppl_at_depth" in shown
    assert "metrics/policies/backbone.json" in shown  # per policy: loops and FLOP ratio
    assert "mean_loops" in shown and "flops_ratio" in shown
    # Huginn's exit rules by name, at matched quality, against depth R and the baseline
    policies = json.loads(shown)[""]["data"]["metrics/policies/backbone.json"]["data"]
    for rule in ("kl", "kl-huginn", "argmax-stability", "latent-diff", "probe"):
        assert policies[rule]["matched"], rule
        assert {"mean_loops", "flops_ratio", "flops_ratio_baseline"} <= set(policies[rule])
    headline = json.loads((repo / "metrics" / "headline.json").read_text())
    assert set(headline) == set(CELLS)
    # the A1 columns are null where no KL threshold matched depth R's quality
    assert all(v is None and k.startswith("a1_") or math.isfinite(v)
               for row in headline.values() for k, v in row.items())


@SHARES_REPRO
def test_second_repro_runs_nothing_and_a_forced_configure_changes_nothing(repo):
    """A second `dvc repro` runs nothing. `make repro` forces configure (train.precision
    auto resolves on the machine): on the same machine its files come out byte-identical,
    so nothing after it reruns and the status stays clean."""
    def ran(out: str) -> set[str]:
        return {line.split("'")[1] for line in out.splitlines()
                if line.startswith("Running stage")}
    out = sh(["dvc", "repro"], repo).stdout
    assert ran(out) == set(), out
    assert json.loads(sh(["dvc", "status", "--json"], repo).stdout) == {}
    out = sh(["dvc", "repro", "--force", "configure"], repo).stdout
    assert ran(out) == {"configure"}, out
    status = sh(["dvc", "status", "--json"], repo).stdout
    assert json.loads(status) == {}, status


@SHARES_REPRO
def test_cells_record_the_precision_they_trained_and_were_timed_in(reproduced):
    """configure writes auto as what it resolves to here; throughput times each cell in
    that precision and says which; the reports' provenance names it."""
    repo = reproduced
    expected = compute.precision_of(TrainConfig())  # micro params: device, precision auto
    for cell in CELLS:
        config = json.loads((repo / "configs" / f"{cell}.json").read_text())
        assert config["train"]["precision"] == expected
        timed = json.loads((repo / "metrics" / "throughput" / f"{cell}.json").read_text())
        assert timed["precision"] == expected
    index = (repo / "reports" / "html" / "index.html").read_text()
    assert f"{expected} (measured in fp32)" in index


@SHARES_REPRO
def test_one_cell_change_reruns_that_cell_only(repo):
    """A cell's own param: configure rewrites that cell's config alone, so `dvc repro`
    would retrain that cell only. What would rerun is all this test is about, so it
    asks `dvc repro --dry` once configure (which the train stages depend on) has run."""
    params = (repo / "params.yaml").read_text()
    changed = params.replace("  perloop_raw:\n    train:\n      loss: per_loop\n",
                             "  perloop_raw:\n    train:\n      loss: per_loop\n      lr: 0.002\n")
    assert changed != params
    (repo / "params.yaml").write_text(changed)
    sh(["dvc", "repro", "configure"], repo)
    out = sh(["dvc", "repro", "--dry"], repo).stdout
    assert "Running stage 'train@perloop_raw'" in out
    for cell in set(CELLS) - {"perloop_raw"}:
        assert f"Running stage 'train@{cell}'" not in out
        assert f"Stage 'train@{cell}' didn't change, skipping" in out


@SHARES_REPRO
def test_exp_run_reruns_only_the_cells_that_inherit_the_change(repo):
    """`dvc exp run -S model.readout=raw`: the backbone inherits the readout and retrains
    with everything downstream of it; the paper A cells pin theirs and are skipped."""
    result = sh(["dvc", "exp", "run", "-n", "raw-readout", "-S", "model.readout=raw"], repo)
    out = result.stdout
    ran = {line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage")}
    # throughput times every cell side by side, so any retrained cell reruns it
    assert ran == {"configure", *(f"{s}@backbone" for s in PER_CELL), "bench_exits",
                   "recalibrate@backbone", "throughput", "headline", "plots", "claims",
                   "report_blind_spot", "report_convergence", "report_index", "summary"}, out
    for cell in CELLS[:-1]:
        assert f"Stage 'train@{cell}' didn't change, skipping" in out
    assert "Stage 'prepare' didn't change, skipping" in out
    config = json.loads((repo / "configs" / "backbone.json").read_text())
    assert config["model"]["readout"] == "raw"
    shown = json.loads(sh(["dvc", "exp", "show", "--json"], repo).stdout)
    text = json.dumps(shown)
    assert "raw-readout" in text and "headline.json" in text and "ppl_final" in text


PENALTIES = ["0.001", "0.01"]
# What the sweep's tests read: the norm figure's table and the headline metrics. The
# queued runs reproduce these targets (and what they depend on) only, not the reports.
SWEEP_TARGETS = ["plots", "headline"]


@pytest.fixture(scope="module")
def sweep(reproduced: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A sweep over the norm penalty on the module's copy of the reproduced repository:
    two experiments queued, run by `dvc queue start -j 2`. Module-scoped, since running
    it is the expensive part and its two tests only read it (`dvc exp show`, `dvc plots`).
    (repo, the last `dvc queue status`)"""
    repo = copy_state(reproduced, tmp_path_factory.mktemp("sweep") / "repo")
    for lam in PENALTIES:
        sh(["dvc", "exp", "run", "--queue", "-n", f"pen{lam}",
            "-S", f"+cells.perloop_raw.train.norm_penalty={lam}", *SWEEP_TARGETS], repo)
    sh(["dvc", "queue", "start", "-j", "2"], repo)
    deadline = time.time() + 600
    while time.time() < deadline:
        status = sh(["dvc", "queue", "status"], repo).stdout
        if "Queued" not in status and "Running" not in status:
            break
        time.sleep(5)
    return repo, status


@SHARES_REPRO
def test_queued_sweep_runs_in_two_workers(sweep):
    """`dvc exp run --queue` + `dvc queue start -j 2`: every queued run succeeds in its
    own copy of the workspace, and `dvc exp show` lists them with their headline."""
    repo, status = sweep
    assert status.count("Success") == len(PENALTIES), status
    rows = json.loads(sh(["dvc", "exp", "show", "--json"], repo).stdout)
    text = json.dumps(rows)
    for lam in PENALTIES:
        assert f"pen{lam}" in text
    assert text.count("ppl_final") >= len(PENALTIES)


@SHARES_REPRO
def test_plots_cover_every_cell_and_diff_overlays_experiments(sweep):
    """dvc.yaml's top-level plots: `dvc plots show` draws every cell in one plot per
    figure, and `dvc plots diff` of two experiments (the queued sweep's) carries both
    revisions, with the norm-penalty cell's norms different between them."""
    repo, _ = sweep
    shown = json.loads(sh(["dvc", "plots", "show", "--json"], repo, timeout=180, tries=2)
                       .stdout)["data"]
    figures = [k for k in shown if "(paper" in k]
    assert len(figures) == 8, figures
    rows = shown["Hidden-state norm vs loop (paper A)"][0]["content"]["data"]["values"]
    assert {r["series"] for r in rows} == set(CELLS)
    frontier = shown["Policy frontier, CE vs mean loops (paper B)"][0]["content"]
    assert {r["series"].split()[0] for r in frontier["data"]["values"]} == {"backbone"}
    revs = [f"pen{lam}" for lam in PENALTIES]  # the sweep fixture ran them
    diff = json.loads(sh(["dvc", "plots", "diff", *revs, "--json"], repo, timeout=180,
                         tries=2).stdout)
    norm = diff["data"]["Hidden-state norm vs loop (paper A)"][0]["content"]["data"]["values"]
    assert {r["rev"] for r in norm} == set(revs)
    by_rev = [{r["loop"]: float(r["norm"]) for r in norm
               if r["rev"] == rev and r["series"] == "perloop_raw"} for rev in revs]
    assert by_rev[0] and by_rev[0].keys() == by_rev[1].keys() and by_rev[0] != by_rev[1]


@pytest.mark.parametrize("key, value, message", [
    ("readout: normed", "readout: sideways",
     "'model.readout' is 'sideways'; allowed values: normed, raw, final_norm"),
    ("loops: 4", "loops: 0", "'model.loops' is 0; it must be >= 1"),
])
def test_bad_params_fail_before_training(tmp_path, key, value, message):
    repo = copy_repo(tmp_path)
    params = (repo / "params.yaml").read_text()
    assert key in params
    (repo / "params.yaml").write_text(params.replace(key, value, 1))
    start = time.perf_counter()
    result = sh(["dvc", "repro"], repo, check=False)
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
    assert time.perf_counter() - start < 60
    assert not (repo / "models").exists() or not any((repo / "models").rglob("*.pt"))
    assert "Running stage 'train@" not in result.stdout


OUTSIDE_STAGES = ("outside_prepare", "outside_extract", "outside_diagnose",
                  "outside_convergence", "outside_policies", "outside_bench_exits",
                  "outside_recalibrate")


def test_an_outside_model_runs_through_every_measuring_stage(tmp_path):
    """A checkpoint directory in Huginn's layout (tests/fixtures/huginn_tiny: random
    weights, Huginn's parameter names and config keys, a tokenizer.json) held as an
    outside model by the micro params: `dvc repro` trains nothing for it, runs every
    outside stage on it, and the claims and the index report show its rows; a second
    `dvc repro` runs nothing."""
    repo = copy_repo(tmp_path)
    shutil.copytree(Path(__file__).parent / "fixtures" / "huginn_tiny",
                    repo / "outside" / "huginn_tiny")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["outside"] = {"huginn_tiny": {"adapter": "huginn", "path": "outside/huginn_tiny",
                                         "loops": 4}}
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "an outside model"], repo)
    out = sh(["dvc", "repro"], repo).stdout
    ran = {line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage")}
    assert {f"{s}@huginn_tiny" for s in OUTSIDE_STAGES} <= ran, out
    assert "train@huginn_tiny" not in ran and {f"train@{c}" for c in CELLS} <= ran
    assert (repo / "prepared_outside" / "huginn_tiny" / "val.bin").is_file()
    assert (repo / "extracts" / "huginn_tiny" / "seed42" / "states.npy").is_file()
    for kind in ("diagnose", "clamp", "convergence", "policies"):
        metrics = json.loads((repo / "metrics" / kind / "huginn_tiny.json").read_text())
        assert metrics, kind
    # an outside model always gets final-loop key/value reuse and the settle-depth oracle
    conv = json.loads((repo / "metrics" / "convergence" / "huginn_tiny.json").read_text())
    assert set(conv["kv_reuse"]) == {"R", "2R"}
    pol = json.loads((repo / "metrics" / "policies" / "huginn_tiny.json").read_text())
    assert pol["exit_mode"] == "frozen" and pol["oracle"]["r"] == 4
    assert all("oracle" in pol[r] for r, m in pol.items() if isinstance(m, dict)
               and m.get("matched"))
    for kind in ("diagnose", "sweep", "clamp", "convergence", "policies", "recalibrate"):
        assert (repo / "tables" / kind / "huginn_tiny.parquet").is_file(), kind
    # ... and readout recalibration, shown in the blind-spot report beside the cells'
    recal = json.loads((repo / "metrics" / "recalibrate" / "huginn_tiny.json").read_text())
    assert recal["r"] == 4 and set(recal["loops"]) == {"1", "2", "3", "4"}
    assert "ce_affine" in recal["loops"]["1"] and "ce_affine" in recal["loops"]["2"]
    blind = (repo / "reports" / "html" / "blind_spot.html").read_text()
    assert "Readout recalibration" in blind and "huginn_tiny" in blind
    bench = json.loads((repo / "metrics" / "bench" / "exits_huginn_tiny.json").read_text())
    assert bench["r"] == 4 and bench["scoring"]["seconds"], bench
    claims = json.loads((repo / "tables" / "claims.json").read_text())
    jsonschema.validate(claims, json.loads((repo / "tables" / claims["$schema"]).read_text()))
    record = claims["outside"]["huginn_tiny"]
    assert record["kind"] == "extension" and record["r"] == 4 and len(record["rows"]) >= 10
    assert "huginn_tiny" not in claims["cells"]  # no paper's verdict reads it
    index = (repo / "reports" / "html" / "index.html").read_text()
    assert "Released models" in index and "huginn_tiny" in index
    for report in ("blind_spot", "convergence"):
        assert (repo / "reports" / "html" / f"{report}.html").is_file()
    again = sh(["dvc", "repro"], repo).stdout
    assert not [line for line in again.splitlines() if line.startswith("Running stage")], again
