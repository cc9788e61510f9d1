"""Corpus -> tokenizer -> token memmaps, and the batches training and diagnostics read.

The prepare stage writes into one directory:
    tokenizer.json   HF `tokenizers` byte-level BPE
    train.bin        token ids, little-endian uint16 (uint32 if the vocabulary needs it)
    val.bin          same, the held-out split
    meta.json        dtype, token counts and sha256 of each .bin, checked on every load
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

EOS = "<|endoftext|>"
UNK = "<unk>"
# Paper A's word-level tokenizer: whitespace runs, ASCII word runs and single symbols are
# the pieces; whitespace is kept, so decoding is plain concatenation.
WORD_PATTERN = r"\s+|[A-Za-z0-9_]+|[^\w\s]"


class DataError(RuntimeError):
    """Missing, empty or corrupt data files; the message names the file."""


def read_documents(data_dir: Path) -> list[tuple[str, str]]:
    """All .txt files under data_dir as (relative name, text), in sorted order."""
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}/: corpus directory not found. Run `make repro` to fetch "
                        "the embedded corpus, or put .txt files there and `dvc add data`.")
    paths = sorted(p for p in data_dir.rglob("*.txt") if p.is_file())
    if not paths:
        raise DataError(f"{data_dir}/: no .txt files. Put your corpus there as UTF-8 text "
                        "files and run `dvc add data`.")
    docs = []
    for path in paths:
        try:
            docs.append((str(path.relative_to(data_dir)), path.read_text(encoding="utf-8")))
        except UnicodeDecodeError as err:
            raise DataError(f"{path}: not UTF-8 text ({err}).") from None
    return docs


def split_documents(texts: list[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """Hold out the last val_fraction of every document, cut at a line boundary.

    Splitting every document (rather than whole documents) keeps each play in both
    splits, so validation measures the same distribution on a small corpus.
    """
    train, val = [], []
    for text in texts:
        cut = text.rfind("\n", 0, int(len(text) * (1 - val_fraction))) + 1
        train.append(text[:cut])
        val.append(text[cut:])
    return train, val


def train_tokenizer(texts: list[str], vocab_size: int, kind: str = "bpe",
                    min_frequency: int = 0) -> Tokenizer:
    """Train the tokenizer of `tokenizer.kind` on texts.

    bpe: byte-level BPE, every byte representable, so no unknown tokens.
    word: paper A's word-level regex tokenizer; the vocab_size - 2 most frequent pieces
    seen at least min_frequency times, the rest map to <unk>.
    """
    if kind == "word":
        tok = Tokenizer(models.WordLevel(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(WORD_PATTERN), behavior="isolated")
        tok.decoder = decoders.Fuse()
        trainer = trainers.WordLevelTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=[EOS, UNK], show_progress=False)
        tok.train_from_iterator(texts, trainer=trainer)
        return tok
    if kind != "bpe":
        raise ValueError(f"unknown tokenizer kind {kind!r}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=min_frequency,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode(tok: Tokenizer, texts: list[str]) -> np.ndarray:
    """Concatenate the documents' ids, each followed by the end-of-text token."""
    eos = tok.token_to_id(EOS)
    dtype = np.uint16 if tok.get_vocab_size() <= 1 << 16 else np.uint32
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=dtype)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def temp_path(path: Path) -> Path:
    """The hidden sibling that atomic_write_bytes writes before renaming it to path."""
    return path.with_name(f".{path.name}.tmp")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary name and rename, so a killed stage leaves no partial file.

    A failed write (a full disk) removes the partial temporary file and re-raises the
    OSError with the destination's name: the OS error of a write() names no file.
    """
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, str(path)) from err


def write_prepared(out: Path, tok: Tokenizer, splits: dict[str, np.ndarray],
                   extra: dict) -> dict:
    """Write tokenizer, token files and meta.json (last, as the completion mark)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "tokenizer.json", tok.to_str().encode())
    meta = {"dtype": None, "vocab_size": tok.get_vocab_size(), "splits": {}, **extra}
    for name, arr in splits.items():
        raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        atomic_write_bytes(out / f"{name}.bin", raw)
        meta["dtype"] = str(arr.dtype)
        meta["splits"][name] = {"tokens": int(arr.size), "sha256": _sha256(raw)}
    meta["tokenizer_sha256"] = _sha256((out / "tokenizer.json").read_bytes())
    atomic_write_bytes(out / "meta.json", (json.dumps(meta, indent=2) + "\n").encode())
    return meta


def load_meta(prepared: Path) -> dict:
    path = prepared / "meta.json"
    if not path.is_file():
        raise DataError(f"{path}: not found; run the prepare stage (`dvc repro prepare`).")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: corrupt ({err}); rerun `dvc repro -f prepare`.") from None


def check_context(meta: dict, context: int) -> None:
    """Fail before the first training step if a split cannot hold one window.

    Training draws windows of context + 1 tokens at random starts (so it needs
    context + 2); the diagnostics need context + 1 validation tokens. Checking both at
    the start of train means a too-long model.context costs seconds, not a training run
    that diagnose then rejects.
    """
    hints = {"train": "lower model.context or use a larger corpus",
             "val": "raise data.val_fraction or lower model.context"}
    for split, extra in (("train", 2), ("val", 1)):
        tokens = meta["splits"][split]["tokens"]
        if tokens < context + extra:
            raise DataError(f"model.context is {context}, but the {split} split has only "
                            f"{tokens} tokens (it needs at least {context + extra}); "
                            f"{hints[split]}.")


def load_tokens(prepared: Path, split: str) -> np.ndarray:
    """The ids of one split, checked against meta.json's size and sha256."""
    meta = load_meta(prepared)
    info = meta["splits"].get(split)
    path = prepared / f"{split}.bin"
    if info is None or not path.is_file():
        raise DataError(f"{path}: not found; rerun `dvc repro -f prepare`.")
    raw = path.read_bytes()
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")
    if len(raw) != info["tokens"] * dtype.itemsize or _sha256(raw) != info["sha256"]:
        raise DataError(f"{path}: size or sha256 differs from meta.json (truncated or "
                        "altered); rerun `dvc repro -f prepare` or `dvc checkout`.")
    return np.frombuffer(raw, dtype=dtype).astype(np.int64)


def load_tokenizer(prepared: Path) -> Tokenizer:
    meta = load_meta(prepared)
    path = prepared / "tokenizer.json"
    if not path.is_file() or _sha256(path.read_bytes()) != meta["tokenizer_sha256"]:
        raise DataError(f"{path}: missing or altered; rerun `dvc repro -f prepare`.")
    return Tokenizer.from_file(str(path))


def train_windows(n_tokens: int, context: int, stride: int = 1) -> int:
    """How many training windows (context + 1 tokens, starts at multiples of stride) fit
    in n_tokens: one epoch is this many windows."""
    return max(0, (n_tokens - context - 2) // stride + 1)


def steps_for_epochs(epochs: float, n_tokens: int, context: int, stride: int,
                     batch_size: int) -> int:
    """Optimizer steps that draw `epochs` times as many windows as one epoch holds."""
    return max(1, math.ceil(epochs * train_windows(n_tokens, context, stride) / batch_size))


@dataclass
class Batches:
    """Random training windows of context+1 tokens, reproducible from a seed.

    Windows start at multiples of stride (paper A: stride 128 with context 256); with
    stride 1 any start is drawn.
    """

    tokens: torch.Tensor
    context: int
    batch_size: int
    seed: int
    stride: int = 1

    def __post_init__(self) -> None:
        if len(self.tokens) <= self.context + 1:
            raise DataError(f"the training split has {len(self.tokens)} tokens, fewer than "
                            f"model.context + 1 = {self.context + 1}; use a smaller "
                            "model.context or a larger corpus.")
        self.windows = train_windows(len(self.tokens), self.context, self.stride)
        self.gen = torch.Generator().manual_seed(self.seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, self.windows, (self.batch_size,), generator=self.gen)
        rows = torch.stack([self.tokens[s:s + self.context + 1]
                            for s in (starts * self.stride).tolist()])
        return rows[:, :-1], rows[:, 1:]


def val_windows(tokens: torch.Tensor, context: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first n non-overlapping validation windows (inputs, targets), fixed for all
    cells so their diagnostics compare the same tokens."""
    n_avail = (len(tokens) - 1) // context
    if n_avail < 1:
        raise DataError(f"the validation split has {len(tokens)} tokens, fewer than "
                        f"model.context + 1 = {context + 1}; raise data.val_fraction or "
                        "lower model.context.")
    n = min(n, n_avail)
    x = tokens[: n * context].view(n, context)
    y = tokens[1: n * context + 1].view(n, context)
    return x, y
