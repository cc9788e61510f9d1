"""Corpus reading, tokenization, token files and their corruption checks."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import run_stage

from loopscope.base.errors import DataError
from loopscope.weights import tokenizer
from loopscope.weights.data import (
    Batches,
    Corpus,
    corpus_paths,
    load_tokenizer,
    load_tokens,
    paragraphs,
    window_sets,
    windows_at,
    write_prepared,
)
from loopscope.weights.tokenizer import EOS, document_pieces, encode, pieces, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TEXT = "".join(f"Line {i}: to be, or not to be, that is the question.\n" for i in range(200))
# Whitespace runs around newlines, where a careless cut would change the pre-tokens.
TRICKY = "".join(f"Line {i}: to be,\nor not  \n  to be\r\n\nthat is\tthe question.\n"
                 for i in range(60))


@pytest.fixture()
def prepared(tmp_path):
    tok = train_tokenizer([TEXT], 300)
    splits = {"train": encode(tok, [TEXT]), "val": encode(tok, [TEXT[:2000]])}
    write_prepared(tmp_path, tok, splits, {})
    return tmp_path, tok, splits


def legacy_split(texts: list[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """The whole-text reference: the last val_fraction of each text, cut at a line."""
    cuts = [t.rfind("\n", 0, int(len(t) * (1 - val_fraction))) + 1 for t in texts]
    return ([t[:c] for t, c in zip(texts, cuts, strict=True)],
            [t[c:] for t, c in zip(texts, cuts, strict=True)])


def test_split_cuts_every_document_at_a_line(tmp_path):
    docs = ["a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n", "x\n" * 20]
    for i, doc in enumerate(docs):
        (tmp_path / f"{i}.txt").write_text(doc)
    corpus = Corpus(tmp_path, 0.1)
    train, val = list(corpus.documents("train")), list(corpus.documents("val"))
    assert [t + v for t, v in zip(train, val, strict=True)] == docs
    assert all(t.endswith("\n") and v for t, v in zip(train, val, strict=True))
    assert (train, val) == legacy_split(docs, 0.1)


def test_tokenizer_round_trips_and_is_deterministic():
    tok = train_tokenizer([TEXT], 300)
    ids = tok.encode("to be, or not to be").ids
    assert tok.decode(ids) == "to be, or not to be"
    assert tok.get_vocab_size() <= 300 and tok.token_to_id(EOS) is not None
    assert train_tokenizer([TEXT], 300).to_str() == tok.to_str()


def test_encode_appends_eos_per_document():
    tok = train_tokenizer([TEXT], 300)
    ids = encode(tok, ["abc", "def"])
    assert ids.dtype == np.uint16
    assert (ids == tok.token_to_id(EOS)).sum() == 2 and ids[-1] == tok.token_to_id(EOS)


def test_prepared_round_trip(prepared):
    path, tok, splits = prepared
    np.testing.assert_array_equal(load_tokens(path, "train"), splits["train"].astype(np.int64))
    assert load_tokenizer(path).to_str() == tok.to_str()


def test_truncated_token_file_is_detected(prepared):
    path, _, _ = prepared
    raw = (path / "train.bin").read_bytes()
    (path / "train.bin").write_bytes(raw[:-2])
    with pytest.raises(DataError, match="train.bin: size or sha256 differs"):
        load_tokens(path, "train")


def test_altered_token_file_is_detected(prepared):
    path, _, _ = prepared
    raw = bytearray((path / "val.bin").read_bytes())
    raw[10] ^= 0xFF
    (path / "val.bin").write_bytes(bytes(raw))
    with pytest.raises(DataError, match="val.bin: size or sha256 differs"):
        load_tokens(path, "val")


def test_altered_tokenizer_is_detected(prepared):
    path, _, _ = prepared
    with open(path / "tokenizer.json", "a") as f:
        f.write(" ")
    with pytest.raises(DataError, match="tokenizer.json: missing or altered"):
        load_tokenizer(path)


def test_missing_corpus_says_what_to_do(tmp_path):
    with pytest.raises(DataError, match="corpus directory not found.*make repro"):
        corpus_paths(tmp_path / "data")
    (tmp_path / "data").mkdir()
    with pytest.raises(DataError, match="no .txt files"):
        corpus_paths(tmp_path / "data")


def test_batches_are_reproducible_and_shifted():
    tokens = torch.arange(1000)
    a, b = Batches(tokens, 8, 4, seed=3), Batches(tokens, 8, 4, seed=3)
    xa, ya = a.next()
    xb, _ = b.next()
    assert torch.equal(xa, xb) and xa.shape == (4, 8)
    assert torch.equal(ya, xa + 1)


def test_too_short_splits_are_named():
    with pytest.raises(DataError, match="model.context"):
        Batches(torch.arange(5), 8, 2, seed=0)
    with pytest.raises(DataError, match="lower diagnose.val_sequences"):
        window_sets(100, 8, 50, 1, "diagnose.val_sequences")
    (starts,) = window_sets(100, 8, 12, 1, "diagnose.val_sequences")
    x, y = windows_at(torch.arange(100), 8, starts)
    assert x.shape == (12, 8) and torch.equal(y, x + 1)


def legacy_encode(tok, texts: list[str]) -> np.ndarray:
    """What encode did before it streamed: whole documents, one list of ids."""
    ids = []
    for enc in tok.encode_batch(texts):
        ids += enc.ids + [tok.token_to_id(EOS)]
    return np.asarray(ids, dtype=np.uint16)


def test_pieces_cut_only_where_no_tokenizer_can_tell():
    parts = list(pieces(TRICKY, 50))
    assert "".join(parts) == TRICKY and len(parts) > 20
    for part in parts[:-1]:  # every cut: a lone newline between two non-spaces
        assert part.endswith("\n") and not part[-2].isspace()
    assert all(not p[0].isspace() for p in parts[1:])
    assert list(pieces("", 50)) == [""] and list(pieces(" \n \n", 1)) == [" \n \n"]


@pytest.mark.parametrize("kind", ["bpe", "word"])
def test_pieces_give_what_whole_documents_give(monkeypatch, kind):
    docs = [TRICKY, TEXT, "", "a"]
    whole = train_tokenizer(docs, 300, kind, 2)
    assert train_tokenizer(document_pieces(docs, 40), 300, kind, 2).to_str() == whole.to_str()
    monkeypatch.setattr(tokenizer, "PIECE_CHARS", 40)
    monkeypatch.setattr(tokenizer, "BATCH_CHARS", 500)
    np.testing.assert_array_equal(encode(whole, iter(docs)), legacy_encode(whole, docs))


def test_paragraphs_are_blank_line_separated_documents(tmp_path):
    path = tmp_path / "train.txt"
    path.write_bytes("one\ntwo\n\n \t\n\nthree é\n\nfour\nfive".encode())
    assert list(paragraphs(path)) == ["one\ntwo", "three é", "four\nfive"]
    # a byte range cut at a line: "one\n" ends at byte 4, "two\n" at 8
    assert list(paragraphs(path, 0, 4)) == ["one"]
    assert list(paragraphs(path, 4)) == ["two", "three é", "four\nfive"]
    path.write_bytes(b"fine\n\nnot \xff utf-8\n")
    with pytest.raises(DataError, match=r"train.txt: not UTF-8 text at byte 10"):
        list(paragraphs(path))


def prepare(tmp_path: Path, monkeypatch, files: dict[str, str], **sections) -> dict:
    """Run the prepare stage on data/ holding files, with micro params updated by sections."""
    raw = yaml.safe_load((ROOT / "tests" / "micro_params.yaml").read_text())
    for section, values in sections.items():
        raw[section] = {**raw[section], **values}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "data").mkdir()
    for name, text in files.items():
        (tmp_path / "data" / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    run_stage("prepare")
    return json.loads((tmp_path / "prepared" / "meta.json").read_text())


def test_prepare_uses_the_hub_splits(tmp_path, monkeypatch, capsys):
    files = {"train.txt": "the cat sat\n\nthe dog ran\n\n", "validation.txt": "dog cat\n\ncat\n\n",
             "test.txt": "zebra zebra zebra\n\n"}
    meta = prepare(tmp_path, monkeypatch, files, data={"hub": "org/tiny"},
                   tokenizer={"kind": "word", "vocab_size": 50, "min_frequency": 0})
    out = capsys.readouterr().out
    assert "train.txt is train, validation.txt is val; not used: test.txt" in out
    prepared = tmp_path / "prepared"
    tok = load_tokenizer(prepared)
    assert json.loads(tok.to_str())["model"]["type"] == "WordLevel"
    assert tok.token_to_id("zebra") is None  # test.txt trains nothing
    np.testing.assert_array_equal(load_tokens(prepared, "val"),
                                  legacy_encode(tok, ["dog cat", "cat"]))
    np.testing.assert_array_equal(load_tokens(prepared, "train"),
                                  legacy_encode(tok, ["the cat sat", "the dog ran"]))
    assert meta["documents"] == 4 and meta["tokenizer_kind"] == "word"
    assert meta["source"] == "hub" and meta["hub"]["name"] == "org/tiny"


def test_prepare_holds_out_the_tail_of_a_hub_train_split(tmp_path, monkeypatch, capsys):
    # 10 documents of 9 bytes ("line 00\n" and the blank line); 0.8 * 90 = 72: the line
    # ending at byte 72 is the blank after document 7
    files = {"train.txt": "".join(f"line {i:02d}\n\n" for i in range(10))}
    meta = prepare(tmp_path, monkeypatch, files, data={"hub": "org/tiny", "val_fraction": 0.2})
    assert "no validation.txt: the last 0.2 of train.txt is val" in capsys.readouterr().out
    tok = load_tokenizer(tmp_path / "prepared")
    np.testing.assert_array_equal(load_tokens(tmp_path / "prepared", "val"),
                                  legacy_encode(tok, ["line 08", "line 09"]))
    np.testing.assert_array_equal(load_tokens(tmp_path / "prepared", "train"),
                                  legacy_encode(tok, [f"line {i:02d}" for i in range(8)]))
    assert meta["documents"] == 10 and meta["tokenizer_kind"] == "bpe"


def test_prepare_of_own_files_with_bpe_is_unchanged(tmp_path, monkeypatch):
    """The default path gives what it gave before streaming, in small pieces too, and
    meta.json keeps its keys: the committed prepared/ of the default run stays valid."""
    monkeypatch.setattr(tokenizer, "PIECE_CHARS", 64)
    monkeypatch.setattr(tokenizer, "BATCH_CHARS", 1000)
    files = {"a.txt": TRICKY, "b.txt": TEXT}
    meta = prepare(tmp_path, monkeypatch, files)
    docs = [p.read_text() for p in corpus_paths(tmp_path / "data")]
    train, val = legacy_split(docs, 0.1)
    tok = train_tokenizer(train, 300)
    assert (tmp_path / "prepared" / "tokenizer.json").read_text() == tok.to_str()
    for split, texts in (("train", train), ("val", val)):
        np.testing.assert_array_equal(load_tokens(tmp_path / "prepared", split),
                                      legacy_encode(tok, texts))
    assert sorted(meta) == ["documents", "dtype", "splits", "tokenizer_sha256", "vocab_size"]
    assert meta["documents"] == 2


def test_prepare_refuses_a_corpus_of_another_source(tmp_path, monkeypatch):
    with pytest.raises(SystemExit) as exit_:
        prepare(tmp_path, monkeypatch, {"notes.txt": TEXT}, data={"hub": "org/big"})
    assert str(exit_.value.code).startswith("error: data/ holds your own .txt files")
    assert not (tmp_path / "prepared").exists()
