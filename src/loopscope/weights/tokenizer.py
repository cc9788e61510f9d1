"""The tokenizer: training it on the corpus, and encoding documents to token ids.

Documents reach the tokenizer in slices of at most PIECE_CHARS characters, cut where no
pre-tokenizer can see the cut (see `pieces`): memory stays bounded on a large corpus,
and the ids are byte for byte what whole documents give.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm

from loopscope.weights.config import TokenizerKind

EOS = "<|endoftext|>"
UNK = "<unk>"
# Paper A's word-level tokenizer: whitespace runs, ASCII word runs and single symbols are
# the pieces; whitespace is kept, so decoding is plain concatenation.
WORD_PATTERN = r"\s+|[A-Za-z0-9_]+|[^\w\s]"
PIECE_CHARS = 1 << 18  # longest slice of a document handed to the tokenizer at once
BATCH_CHARS = 1 << 21  # characters per encode_batch call (its encodings live together)
PROGRESS_BYTES = 1 << 26  # inputs this large show a progress bar while encoding


def _safe_cut(text: str, i: int) -> bool:
    """Whether text may be cut after the newline at i: it stands alone between two
    non-space characters, where both pre-tokenizers end one piece and start the next
    whatever follows or precedes (a cut inside a whitespace run would change it)."""
    return (0 < i < len(text) - 1 and not text[i - 1].isspace()
            and not text[i + 1].isspace())


def pieces(text: str, max_chars: int | None = None) -> Iterator[str]:
    """text as consecutive slices of at most about max_chars (default PIECE_CHARS), cut
    only where _safe_cut allows, so tokenizing (or counting) the slices gives exactly
    what the whole text gives. Yields at least one slice ("" for an empty text). A
    stretch without a safe cut stays whole."""
    max_chars = max_chars or PIECE_CHARS
    start = 0
    while len(text) - start > max_chars:
        hi = start + max_chars
        i = hi
        while (i := text.rfind("\n", start + 1, i)) > 0 and not _safe_cut(text, i):
            pass
        if i <= 0:  # none in this window: the first one after it
            i = hi - 1
            while (i := text.find("\n", i + 1)) >= 0 and not _safe_cut(text, i):
                pass
            if i < 0:
                break
        yield text[start:i + 1]
        start = i + 1
    yield text[start:]


def document_pieces(docs: Iterable[str], max_chars: int | None = None) -> Iterator[str]:
    """Every document's pieces in order: what the tokenizer trains on."""
    for doc in docs:
        yield from pieces(doc, max_chars)


def train_tokenizer(texts: Iterable[str], vocab_size: int, kind: TokenizerKind = "bpe",
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


def encode(tok: Tokenizer, texts: Iterable[str], total_bytes: int = 0,
           eos: int | None = None) -> np.ndarray:
    """Concatenate the documents' ids, each followed by the end-of-text token.

    Documents are encoded in pieces (see `pieces`), BATCH_CHARS characters per
    encode_batch call, into one numpy array per batch: a Python list of every id would
    take ~30 bytes a token. total_bytes (about the input's size) shows a progress bar
    when it is PROGRESS_BYTES or more. eos: the end-of-text id of another tokenizer
    (an outside model's own: its text is then encoded without the special tokens its
    post-processor may add, such as a beginning-of-text token per piece); default the
    trained tokenizer's EOS.
    """
    specials = eos is None
    eos = tok.token_to_id(EOS) if eos is None else eos
    dtype = np.uint16 if tok.get_vocab_size() <= 1 << 16 else np.uint32
    arrays = [np.zeros(0, dtype)]
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, mininterval=2, desc="encode",
               disable=total_bytes < PROGRESS_BYTES)
    for batch, ends in _batches(texts):
        ids: list[int] = []
        for enc, end in zip(tok.encode_batch(batch, add_special_tokens=specials), ends,
                            strict=True):
            ids.extend(enc.ids)
            if end:
                ids.append(eos)
        arrays.append(np.asarray(ids, dtype=dtype))
        bar.update(sum(len(piece.encode("utf-8")) for piece in batch) if not bar.disable else 0)
    bar.close()
    return np.concatenate(arrays)


def _batches(texts: Iterable[str]) -> Iterator[tuple[list[str], list[bool]]]:
    """The documents' pieces in batches of about BATCH_CHARS characters, with whether each
    piece ends its document (the end-of-text token follows it)."""
    batch: list[str] = []
    ends: list[bool] = []
    chars = 0
    for text in texts:
        parts = list(pieces(text))
        for i, piece in enumerate(parts):
            batch.append(piece)
            ends.append(i == len(parts) - 1)
            chars += len(piece)
            if chars >= BATCH_CHARS:
                yield batch, ends
                batch, ends, chars = [], [], 0
    if batch:
        yield batch, ends
