"""Corpus reading, tokenization, token files and their corruption checks."""

import numpy as np
import pytest
import torch

from loopscope.data import (
    EOS,
    Batches,
    DataError,
    encode,
    load_tokenizer,
    load_tokens,
    read_documents,
    split_documents,
    train_tokenizer,
    val_windows,
    write_prepared,
)

TEXT = "".join(f"Line {i}: to be, or not to be, that is the question.\n" for i in range(200))


@pytest.fixture()
def prepared(tmp_path):
    tok = train_tokenizer([TEXT], 300)
    splits = {"train": encode(tok, [TEXT]), "val": encode(tok, [TEXT[:2000]])}
    write_prepared(tmp_path, tok, splits, {})
    return tmp_path, tok, splits


def test_split_cuts_every_document_at_a_line():
    docs = ["a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n", "x\n" * 20]
    train, val = split_documents(docs, 0.1)
    assert [t + v for t, v in zip(train, val, strict=True)] == docs
    assert all(t.endswith("\n") and v for t, v in zip(train, val, strict=True))


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
        read_documents(tmp_path / "data")
    (tmp_path / "data").mkdir()
    with pytest.raises(DataError, match="no .txt files"):
        read_documents(tmp_path / "data")


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
    with pytest.raises(DataError, match="data.val_fraction"):
        val_windows(torch.arange(5), 8, 4)
    x, y = val_windows(torch.arange(100), 8, 50)
    assert x.shape == (12, 8) and torch.equal(y, x + 1)
