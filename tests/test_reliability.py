"""Reliability: interruption and resume, divergence and silent collapse, corruption,
determinism (byte-identical outputs), full disk.

The fast tests call the library in-process; the end-to-end ones run the real
`dvc repro` on a micro copy of the repository (micro.copy_repo), since what
matters there is how the stage scripts and DVC behave together.
"""

import dataclasses
import errno
import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from conftest import BACKBONE, run_stage
from conftest import tiny_cell as cell
from conftest import tiny_corpus as corpus
from micro import ROOT, copy_repo, sh, sh_env

from loopscope.base import paths, timings
from loopscope.base.errors import CheckpointError, CollapseError, DataError
from loopscope.base.files import temp_path, write_json
from loopscope.measure.save import write_outputs
from loopscope.params import load_params
from loopscope.stage import execute
from loopscope.weights.checkpoint import discard_resume, load_model, save_model
from loopscope.weights.config import TrainConfig
from loopscope.weights.data import check_context, write_prepared
from loopscope.weights.resolve import resolve_cell
from loopscope.weights.tokenizer import train_tokenizer
from loopscope.weights.train import check_collapse, train_cell

# The cell the end-to-end tests train: a healthy one at micro size (the micro
# perloop_raw, 32 wide with a raw readout, collapses within 200 steps and is stopped).
CELL = "perloop_normed"
SEED = 42  # the default seed
# The sandwich backbone's known collapse (Huginn's init and noise state, as the default
# backbone's): at this lr it maps every token onto one state within 5 steps while the
# loss stays finite (as the default backbone once did at 3e-3).
COLLAPSING = dict(model=dataclasses.replace(BACKBONE, init="huginn"), steps=120, lr=0.3,
                  log_every=5)


class Killed(Exception):
    """Stands in for a kill in the in-process tests."""


class RecordingLive:
    """A dvclive.Live stand-in: records (step, name, value) as dvclive stamps them, and
    raises Killed on the first value logged at or after kill_at."""

    def __init__(self, kill_at: int | None = None) -> None:
        self.step, self.rows, self.kill_at = 0, [], kill_at

    def log_metric(self, name: str, value: float) -> None:
        if self.kill_at is not None and self.step >= self.kill_at:
            raise Killed
        self.rows.append((self.step, name, value))

    def next_step(self) -> None:
        self.step += 1


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


# --- interruption and resume, in-process ----------------------------------------------

def test_resume_continues_bitwise_and_replays_the_log(tmp_path, capsys):
    config = cell(steps=30, checkpoint_every=10, log_every=5)
    # dropout draws from torch's global RNG, so its state must be restored too
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, dropout=0.1))
    ref_live = RecordingLive()
    ref_model, ref = train_cell(config, corpus(), ref_live)

    path = tmp_path / "last.pt"
    with pytest.raises(Killed):  # dies at step 25; the last checkpoint is after step 20
        train_cell(config, corpus(), RecordingLive(kill_at=25), path)
    assert path.is_file()
    live = RecordingLive()
    model, summary = train_cell(config, corpus(), live, path)

    assert "resuming from step 20" in capsys.readouterr().out
    assert summary["final_loss"] == ref["final_loss"]
    assert_same_weights(model.state_dict(), ref_model.state_dict())
    assert live.rows == ref_live.rows  # steps 0..15 replayed, then the same values
    assert sorted({step for step, _, _ in live.rows}) == [0, 5, 10, 15, 20, 25, 29]


def test_resume_checkpoint_of_another_config_is_ignored(tmp_path, capsys):
    path = tmp_path / "last.pt"
    train_cell(cell(steps=30, checkpoint_every=10), corpus(), resume=path)
    assert path.is_file()
    other = cell(steps=30, checkpoint_every=10, lr=1e-3)
    _, summary = train_cell(other, corpus(), resume=path)
    out = capsys.readouterr().out
    assert "was written for another config, corpus or code of cell 'tiny'; training from " \
        "step 0" in out
    assert "resuming" not in out
    assert summary["final_loss"] == train_cell(other, corpus())[1]["final_loss"]


def test_resume_checkpoint_of_another_corpus_is_ignored(tmp_path, capsys):
    path = tmp_path / "last.pt"
    config = cell(steps=30, checkpoint_every=10)
    train_cell(config, corpus(), resume=path)
    changed = corpus()
    changed[100] = (changed[100] + 1) % 64  # one token of the training split
    train_cell(config, changed, resume=path)
    out = capsys.readouterr().out
    assert "was written for another config, corpus or code" in out and "resuming" not in out


def test_damaged_resume_checkpoint_is_ignored_with_a_note(tmp_path, capsys):
    path = tmp_path / "last.pt"
    path.write_bytes(b"not a checkpoint")
    _, summary = train_cell(cell(steps=5), corpus(), resume=path)
    assert "last.pt: unreadable checkpoint" in capsys.readouterr().out
    assert summary["final_loss"] == train_cell(cell(steps=5), corpus())[1]["final_loss"]


def test_discard_resume_removes_file_temp_and_folder(tmp_path):
    path = tmp_path / paths.resume_file("tiny", 42)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x")
    temp_path(path).write_bytes(b"partial")  # a kill during a checkpoint write
    other = tmp_path / paths.resume_file("other", 42)
    other.parent.mkdir(parents=True)
    other.write_bytes(b"y")
    discard_resume(path)
    assert not (tmp_path / paths.CHECKPOINTS / "tiny").exists()
    assert other.is_file()  # another cell's run is untouched
    discard_resume(path)  # nothing left: no error


# --- silent collapse -------------------------------------------------------------------

COLLAPSE_MESSAGE = re.compile(
    r"cell 'tiny': training made no progress \(lr [0-9.]+\): past half of its (\d+) steps "
    r"and step 100, from step (\d+) to step (\d+), the final loop's CE \(([0-9.]+)\) is no "
    r"better than predicting the training split's unigram frequencies for every token "
    r"\(entropy ([0-9.]+), less 0.1 for noise\) and no lower than at step \d+ \([0-9.]+\); "
    r"the mean pairwise cosine of the tokens' final states was ([0-9., ]+); the loss stayed "
    r"finite \(([0-9.]+)\). Lower train.lr or raise train.warmup_steps \(or set "
    r"train.collapse_guard: false to train on and measure the model\). No model was saved.")


def test_a_collapsed_run_stops_like_a_nan_past_half_its_steps():
    live = RecordingLive()
    with pytest.raises(CollapseError) as err:
        train_cell(cell(**COLLAPSING), corpus(), live)
    found = COLLAPSE_MESSAGE.fullmatch(str(err.value))
    assert found, str(err.value)
    steps, first, last = (int(found.group(i)) for i in (1, 2, 3))
    assert (steps, first, last) == (120, 100, 110)  # three logged rows from step 100 on
    assert float(found.group(4)) >= float(found.group(5)) - 0.1  # about a constant's CE
    losses = [v for _, name, v in live.rows if name == "train/loss"]
    assert all(math.isfinite(v) for v in losses) and math.isfinite(float(found.group(7)))


def test_collapse_guard_off_trains_the_collapsing_cell_to_the_end():
    live = RecordingLive()
    train_cell(cell(**COLLAPSING, collapse_guard=False), corpus(), live)  # no CollapseError
    assert max(v for _, name, v in live.rows if name == "train/state_cosine") > 0.99


def test_the_same_backbone_at_a_sane_lr_stays_far_below_the_threshold():
    live = RecordingLive()
    train_cell(cell(**{**COLLAPSING, "lr": 3e-3}), corpus(), live)
    cosines = [v for _, name, v in live.rows if name == "train/state_cosine"]
    assert len(cosines) == 25 and max(cosines) < 0.6


RECOVERING = ROOT / "tests" / "fixtures" / "recovering_run.json"


def test_a_run_that_recovers_is_never_stopped():
    """A real log: the default ref_perloop_normed (paper A's reference init, N(0, 1)
    embeddings), whose final states keep a mean pairwise cosine near 0.99 all run long
    and whose CE is still above the batches' target entropy at half its steps, on its
    way to a usable model. Every prefix of its log passes the guard; had its CE stayed
    at the unigram level past half the run, the guard would have stopped it there."""
    log = json.loads(RECOVERING.read_text())
    config = TrainConfig(steps=log["steps"], warmup_steps=log["warmup_steps"],
                         log_every=log["log_every"])
    rows, unigram = log["rows"], log["unigram_entropy"]
    half = [r for r in rows if r["step"] >= config.steps // 2]
    assert all(r["train/state_cosine"] > 0.985 for r in half)  # it looks collapsed
    assert half[0]["train/ce_last"] > half[0]["train/target_entropy"]  # and unlearned
    assert rows[-1]["train/ce_last"] < unigram - 0.3  # yet it learned
    for n in range(1, len(rows) + 1):
        check_collapse("c", rows[:n], config, 3e-3, rows[n - 1]["train/loss"], unigram)
    # the same run stuck at the unigram level from step 100 on: stopped past half of it
    stuck = [{**r, "train/ce_last": unigram} if r["step"] >= 100 else r for r in rows]
    with pytest.raises(CollapseError) as err:
        for n in range(1, len(stuck) + 1):
            check_collapse("c", stuck[:n], config, 3e-3, unigram, unigram)
    assert f"from step {config.steps // 2} to step" in str(err.value)


def test_collapsed_training_stage_writes_nothing_finished(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tokens = corpus().numpy().astype("uint16")
    tok = train_tokenizer(["a tokenizer the stage never reads"], 260, "bpe", 0)
    write_prepared(tmp_path / paths.PREPARED, tok, {"train": tokens, "val": tokens[:500]}, {})
    config = cell(**COLLAPSING)
    (tmp_path / paths.CONFIGS).mkdir()
    (tmp_path / paths.config_file("tiny")).write_text(config.to_json())
    with pytest.raises(SystemExit) as exit_:
        run_stage("train", *train_args("tiny"))
    message = str(exit_.value.code)
    assert message.startswith("error: ") and COLLAPSE_MESSAGE.fullmatch(message[7:]), message
    assert not (tmp_path / paths.model_file("tiny", config.train.seed)).exists()
    for kind in ("train", paths.TRAIN_TIMINGS):
        assert not (tmp_path / paths.metrics_file(kind, "tiny")).exists()


def train_args(cell: str) -> list[str]:
    """The train stage's options as dvc.yaml passes them, for cell."""
    return ["--config", str(paths.config_file(cell)), "--prepared", str(paths.PREPARED),
            "--model", f"models/{cell}/seed{{seed}}.pt",
            "--resume", f"checkpoints/{cell}/seed{{seed}}/last.pt",
            "--live", f"dvclive/{cell}", "--metrics", f"metrics/train/{cell}.json",
            "--timings", f"metrics/train_timings/{cell}.json"]


# --- corruption ------------------------------------------------------------------------

def test_altered_weights_in_a_checkpoint_are_detected(tmp_path):
    model, _ = train_cell(cell(steps=3), corpus())
    path = tmp_path / paths.model_file("tiny", 42)
    save_model(path, model, cell(steps=3), {})
    raw = bytearray(path.read_bytes())
    at = raw.find(model.state_dict()["embed.weight"].numpy().tobytes()[:64])
    assert at > 0
    raw[at + 3] ^= 0x01  # one bit of one weight: torch.load alone would not notice
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"seed42.pt: checksum does not match its "
                       r"contents .*`dvc repro -f train@tiny`"):
        load_model(path)


def test_context_longer_than_a_split_fails_before_training():
    meta = {"splits": {"train": {"tokens": 5000}, "val": {"tokens": 100}}}
    check_context(meta, 99)  # one validation window: 99 inputs + 1 shifted target
    with pytest.raises(DataError, match=r"model.context is 100, but the val split has only "
                       r"100 tokens .* raise data.val_fraction or lower model.context"):
        check_context(meta, 100)
    with pytest.raises(DataError, match=r"the train split has only 5000 tokens .* lower "
                       r"model.context or use a larger corpus"):
        check_context({"splits": {"train": {"tokens": 5000}, "val": {"tokens": 10**6}}}, 4999)


def test_train_stage_checks_the_context_before_reading_tokens(tmp_path, monkeypatch):
    shutil.copy(ROOT / "tests" / "micro_params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    config = resolve_cell(load_params(), CELL)
    (tmp_path / paths.CONFIGS).mkdir()
    (tmp_path / paths.config_file(CELL)).write_text(config.to_json())
    (tmp_path / paths.PREPARED).mkdir()  # meta.json of a tiny validation split, no tokens
    splits = {"train": {"tokens": 10**6}, "val": {"tokens": config.model.context}}
    (tmp_path / paths.PREPARED / "meta.json").write_text(json.dumps({"splits": splits}))
    with pytest.raises(SystemExit) as exit_:
        run_stage("train", *train_args(CELL))
    assert str(exit_.value.code).startswith(
        f"error: model.context is {config.model.context}, but the val split has only")
    assert "data.val_fraction" in str(exit_.value.code)
    assert not (tmp_path / "dvclive").exists()  # stopped before training began


# --- missing corpus, full disk ---------------------------------------------------------

def test_missing_corpus_stops_prepare_with_what_to_do(tmp_path, monkeypatch):
    shutil.copy(ROOT / "tests" / "micro_params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        run_stage("prepare")
    assert str(exit_.value.code).startswith("error: data/: corpus directory not found. Run "
                                            "`make repro`")
    assert not (tmp_path / paths.PREPARED).exists()


def test_full_disk_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "metrics" / "m.json"
    write_json(path, {"ok": 1})

    def no_space(fd: int) -> None:  # what a full disk does: an OSError naming no file
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(SystemExit) as exit_:
        execute(lambda: write_json(path, {"ok": 2}))
    message = str(exit_.value.code)
    assert message.startswith(f"error: {path}: {os.strerror(errno.ENOSPC)}. Free disk space, "
                              "then rerun `dvc repro`")
    assert json.loads(path.read_text()) == {"ok": 1}  # the complete old file, untouched
    assert not temp_path(path).exists()  # and no partial file left to fill the disk


def test_write_outputs_puts_each_table_and_the_metrics_where_paths_says(tmp_path,
                                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    table = pd.DataFrame({"doc": [0, 1], "ce": [1.5, 2.5]})
    write_outputs("diagnose", "cell", {"b": 1, "a": 2}, {"diagnose": table, "sweep": table[:1]})
    pd.testing.assert_frame_equal(pd.read_parquet(paths.table_file("diagnose", "cell")), table)
    assert len(pd.read_parquet(paths.table_file("sweep", "cell"))) == 1
    assert paths.metrics_file("diagnose", "cell").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'
    write_outputs("clamp", "cell", {"a": 1})  # metrics alone
    assert json.loads(paths.metrics_file("clamp", "cell").read_text()) == {"a": 1}
    assert not paths.table_file("clamp", "cell").exists()
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


# --- end to end: the real dvc repro on a micro copy -------------------------------------

def micro_repo(tmp_path: Path, **train) -> Path:
    """A micro copy of the repository with some train: params replaced."""
    repo = copy_repo(tmp_path)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"].update(train)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return repo


def outputs(repo: Path) -> dict:
    """What a train run leaves: metrics (the timings are apart), weights, DVCLive files."""
    metrics = json.loads((repo / paths.metrics_file("train", CELL)).read_text())
    live = repo / "dvclive" / CELL
    return {
        "metrics": metrics,
        "weights": torch.load(repo / paths.model_file(CELL, SEED), weights_only=True)["model"],
        "dvclive": {str(p.relative_to(live)): p.read_bytes()
                    for p in sorted(live.rglob("*")) if p.is_file()},
    }


@pytest.mark.slow  # the real dvc repro
def test_sigkill_then_repro_resumes_to_the_same_result(tmp_path):
    repo = micro_repo(tmp_path, steps=200, checkpoint_every=20)
    sh(["dvc", "repro", "configure", "prepare"], repo)  # so the kill lands in training
    stage = ["dvc", "repro", f"train@{CELL}"]
    job = subprocess.Popen(stage, cwd=repo, env=sh_env(), start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    resume = repo / paths.resume_file(CELL, SEED)
    deadline = time.monotonic() + 120
    while not resume.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(job.pid, signal.SIGKILL)  # dvc and the stage, as a job scheduler would
    assert job.wait() == -signal.SIGKILL, "the stage ended before it could be killed"

    # Killed midway: a resume checkpoint, no output, nothing recorded by DVC as done.
    assert resume.is_file()
    assert not (repo / paths.model_file(CELL, SEED)).exists()
    assert not (repo / paths.metrics_file("train", CELL)).exists()
    lock = repo / "dvc.lock"
    assert not lock.exists() or f"train@{CELL}" not in lock.read_text()

    out = sh(stage, repo).stdout
    step = int(re.search(rf"train {CELL}: resuming from step (\d+)", out).group(1))
    assert 20 <= step < 200 and step % 20 == 0
    assert not resume.exists()
    resumed = outputs(repo)

    out = sh(["dvc", "repro", "-f", "-s", f"train@{CELL}"], repo).stdout  # uninterrupted
    assert "resuming" not in out
    fresh = outputs(repo)
    assert resumed["metrics"] == fresh["metrics"]  # final_loss included, bit for bit
    assert_same_weights(resumed["weights"], fresh["weights"])
    assert resumed["dvclive"] == fresh["dvclive"]  # the replayed log included


# Outputs meant to hold timings, which differ between two runs of the same params.
TIMED = (f"{paths.METRICS}/throughput/", f"{paths.METRICS}/{paths.TRAIN_TIMINGS}/",
         f"{paths.BENCH}/", f"{paths.REPORTS_HTML}/", f"{timings.STAGE_TIMINGS}/")
# Every stage but the reports and the benchmark (outputs all timed), on the backbone:
# it has every source of randomness (sampled depth, noise initial state) and every stage.
BACKBONE_CELL = "backbone"
TARGETS = ["headline", f"diagnose@{BACKBONE_CELL}", f"convergence@{BACKBONE_CELL}",
           f"extract@{BACKBONE_CELL}", f"recalibrate@{BACKBONE_CELL}"]


def files_of(repo: Path, out: str) -> dict[str, bytes]:
    """An output's files (a file, or every file under a folder) and their bytes."""
    path = repo / out
    found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(repo)): p.read_bytes() for p in found}


@pytest.mark.slow  # the real dvc repro
def test_same_params_give_byte_identical_outputs(tmp_path):
    """Two copies of the repository, the same params, every stage run in each: every
    output DVC records (models, extracts, tables, metrics, logs) is byte for byte the
    same, except the files meant for timings. So a retrained cell whose weights did not
    change has the same content hash, and nothing downstream of it reruns."""
    repos = []
    for copy in ("one", "two"):
        (tmp_path / copy).mkdir()
        repo = copy_repo(tmp_path / copy)
        params = yaml.safe_load((repo / "params.yaml").read_text())
        params["cells"] = {BACKBONE_CELL: params["cells"][BACKBONE_CELL]}
        params["recalibrate"]["cells"] = [BACKBONE_CELL]
        (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        repos.append(repo)
    jobs = [subprocess.Popen(["dvc", "repro", *TARGETS], cwd=repo, env=sh_env(), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for repo in repos]  # side by side: half the wall time on two cores
    for job in jobs:
        out = job.communicate(timeout=900)[0]
        assert job.returncode == 0, out[-3000:]
    one, two = repos
    first, second = (yaml.safe_load((r / "dvc.lock").read_text())["stages"] for r in repos)
    assert first.keys() == second.keys() and len(first) == 9  # every stage but 4
    compared, timed = 0, 0
    for stage, entry in first.items():
        for out in entry["outs"]:
            if out["path"].startswith(TIMED):
                timed += 1
                continue
            other = next(o for o in second[stage]["outs"] if o["path"] == out["path"])
            if out != other:
                a, b = files_of(one, out["path"]), files_of(two, out["path"])
                differ = sorted(f for f in a.keys() | b.keys() if a.get(f) != b.get(f))
                raise AssertionError(f"{stage}: {out['path']} differs: {differ}")
            compared += 1
    # the train timings, and the stage timings of all but configure, are timed; 19 outputs
    # compared, the per-seed clamp table of diagnose and the recalibration's among them
    assert (timed, compared) == (1 + 8, 19)
    model = str(paths.model_file(BACKBONE_CELL, SEED))  # what used to embed timings
    assert files_of(one, model) == files_of(two, model)
    assert "train_seconds" not in (one / paths.metrics_file("train", BACKBONE_CELL)).read_text()
    assert "train_seconds" in (one / paths.metrics_file(paths.TRAIN_TIMINGS, BACKBONE_CELL)
                               ).read_text()


@pytest.mark.slow  # the real dvc repro
def test_nan_loss_stops_training_and_saves_nothing(tmp_path):
    repo = micro_repo(tmp_path, lr=1.0e6, grad_clip=1.0e6, warmup_steps=0)
    result = sh(["dvc", "repro", f"train@{CELL}"], repo, check=False)
    assert result.returncode != 0
    assert re.search(rf"error: cell '{CELL}': loss is (nan|inf) at step \d+ \(lr [0-9.e+]+\); "
                     "lower train.lr", result.stdout + result.stderr)
    assert not (repo / paths.model_file(CELL, SEED)).exists()
    assert not (repo / paths.metrics_file("train", CELL)).exists()
