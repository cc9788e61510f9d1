"""Token types for paper B's per-token analysis: which kind of word each token of a
window belongs to (whitespace, punctuation, number, function word, content word), so the
convergence loop can be read by type ("whitespace shallowest, content words deepest").

A token is typed by the whole word it is part of in the window's text, not by its own
piece: a subword of "inside" is a content word although "in" alone is a function word.
That needs each token's exact bytes, recovered from the tokenizer (byte-level BPE or
word-level), and the window's text decoded from them (window_types).
"""

from __future__ import annotations

import codecs
import functools
import re

import numpy as np
from tokenizers import Tokenizer, decoders, pre_tokenizers

# Token types rarer than this share of the typed tokens are not judged: the convergence
# stage sets them apart as rare, and paper B's token-order claim states the floor.
SMALLEST_TYPE = 0.02

# The token types, in the order they are tested (the first that matches wins).
# Each name is a metrics key too (metrics/convergence/*.json), so it is one word: no
# space, which `dvc exp show --keep` patterns and dotted paths cannot name
TOKEN_TYPES = ("whitespace", "punctuation", "number", "function_word", "content_word")
NUMBER = re.compile(r"[\d.,:/-]*\d[\d.,:/-]*")
# A closed list of English function words: articles and determiners, pronouns (with
# Early Modern English forms, for the embedded Shakespeare), prepositions,
# conjunctions, auxiliary and modal verbs, and a few particles.
FUNCTION_WORDS = frozenset("""
a an the this that these those each every either neither some any no none all both
few many much more most several such what which whose whatever whichever
i me my mine myself we us our ours ourselves you your yours yourself yourselves
he him his himself she her hers herself it its itself they them their theirs
themselves thou thee thy thine thyself ye who whom whoever one ones
of in on at by for with about against between into through during before after
above below to from up down out off over under again upon unto till until within
without toward towards among amongst across along beside besides beyond near since
o'er than like ere
and but or nor so yet if then else because although though while whereas whether
unless lest as whence whither wherefore when where why how
be am is are was were been being have has had having do does did done doing
shall should will would may might must can could hath doth dost art wast wert shalt
wilt canst couldst wouldst shouldst hast didst
not no nay yea yes aye o oh ah ay there here now too very just only also even
""".split())


def token_type(text: str) -> str:
    """The type of a piece of text (stripped of surrounding whitespace) taken on its
    own. window_types types tokens by the word around them instead; this one names the
    type of a whole word there (a word has a letter or digit, so it is a number, a
    function word or a content word)."""
    s = text.strip()
    if not s:
        return "whitespace"
    if not any(c.isalnum() for c in s):
        return "punctuation"
    if NUMBER.fullmatch(s):
        return "number"
    return "function_word" if s.lower() in FUNCTION_WORDS else "content_word"


SPECIAL = -1  # window_types' value for a special token (end of text, unknown): left out
# A word of running text: a maximal run of letters and digits that keeps an apostrophe
# between two of them (o'er, don't; ASCII or typographic) and a number separator
# between two digits (3.14, 1,000, 10:30), so a contraction or a number is one word
# however the tokenizer cut it. Underscore is a symbol here, as in token_type.
WORD = re.compile(r"[^\W_]+(?:(?:['\u2019]|(?<=\d)[.,:/-](?=\d))[^\W_]+)*")


@functools.cache
def _byte_level_bytes() -> dict[str, int]:
    """The byte behind each character of the byte-level alphabet (GPT-2's table: the
    printable Latin-1 bytes stand for themselves, the other 68 bytes in order for
    U+0100 onwards), checked against the tokenizers library's own pre-tokenizer so a
    change there fails loudly instead of typing garbage."""
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    moved = [b for b in range(256) if b not in set(kept)]
    table = {chr(b): b for b in kept} | {chr(0x100 + i): b for i, b in enumerate(moved)}
    # Characters whose UTF-8 holds every byte a valid text can (all but C0, C1, F5..FF).
    probe = "".join(chr(c) for c in [*range(0x800), *range(0x800, 0x10000, 0x100),
                                     *range(0x10000, 0x110000, 0x10000)]
                    if not 0xD800 <= c < 0xE000)
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    mapped = "".join(s for s, _ in pre.pre_tokenize_str(probe))
    if (set(table) != set(pre_tokenizers.ByteLevel.alphabet())
            or bytes(table[c] for c in mapped) != probe.encode("utf-8")):
        raise RuntimeError("the tokenizers library's byte-level alphabet is not GPT-2's; "
                           "loopscope.measure.trajectory.token_types cannot recover token bytes")
    return table


def special_ids(tok: Tokenizer) -> np.ndarray:
    """The ids of the tokenizer's added tokens (EOS, and <unk> for the word-level
    kind): they stand for no text, so they have no type."""
    return np.array(sorted(tok.get_added_tokens_decoder()), dtype=np.int64)


def token_bytes(tok: Tokenizer) -> list[bytes]:
    """The exact bytes of every vocabulary id (b"" for special tokens). Decoding one id
    is lossy for a byte-level BPE (a piece of a multi-byte character decodes to
    U+FFFD), so the token string is mapped back through the byte-level alphabet; for a
    tokenizer that decodes by concatenation (the word-level kind's Fuse, or none) the
    token string is the text itself."""
    decoder = tok.decoder
    if isinstance(decoder, decoders.ByteLevel):
        table = _byte_level_bytes()

        def to_bytes(s: str) -> bytes:
            return bytes(table[c] for c in s)
    elif decoder is None or isinstance(decoder, decoders.Fuse):
        def to_bytes(s: str) -> bytes:
            return s.encode("utf-8")
    else:
        raise ValueError(f"cannot recover token bytes through a {type(decoder).__name__} "
                         "decoder: loopscope trains byte-level BPE (ByteLevel) and "
                         "word-level (Fuse) tokenizers")
    out = [b""] * tok.get_vocab_size(with_added_tokens=True)
    special = set(special_ids(tok).tolist())
    for s, i in tok.get_vocab(with_added_tokens=True).items():
        if i not in special:
            out[i] = to_bytes(s)
    return out


def _char_spans(pieces: list[bytes]) -> tuple[str, np.ndarray, np.ndarray]:
    """The text of consecutive token byte strings and, per token, the first and last
    character it has a byte of. An incremental decoder carries a character cut between
    tokens over to the next one, so every token holding a byte of it gets it; a cut
    at either end decodes to U+FFFD (errors="replace" can only fire there: inside, the
    bytes are a slice of valid UTF-8 text)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    first = np.empty(len(pieces), dtype=np.int64)
    last = np.empty(len(pieces), dtype=np.int64)
    parts: list[str] = []
    n = 0
    for j, piece in enumerate(pieces):
        first[j] = n  # the character pending from earlier tokens comes out first
        text = decoder.decode(piece)
        parts.append(text)
        n += len(text)
        last[j] = n - (0 if decoder.getstate()[0] else 1)  # still pending: the next one
    parts.append(decoder.decode(b"", final=True))
    text = "".join(parts)
    return text, first, np.clip(last, first, len(text) - 1)


def _run_types(pieces: list[bytes]) -> np.ndarray:
    """TOKEN_TYPES indices of a run of tokens decoded together (no special token
    among them): by the first word a token overlaps, else whitespace or punctuation."""
    text, first, last = _char_spans(pieces)
    n = len(text)
    word_of = np.full(n + 1, -1, dtype=np.int64)  # the extra slot: past the end
    kinds = []
    for w, m in enumerate(WORD.finditer(text)):
        word_of[m.start():m.end()] = w
        kinds.append(TOKEN_TYPES.index(token_type(m.group().replace("\u2019", "'"))))
    at = np.arange(n + 1)
    next_word = np.minimum.accumulate(np.where(word_of >= 0, at, n)[::-1])[::-1]
    solid = np.concatenate([[0], np.cumsum([not c.isspace() for c in text])])
    hit = next_word[first]
    in_word = hit <= last
    out = np.where(solid[last + 1] > solid[first], TOKEN_TYPES.index("punctuation"),
                   TOKEN_TYPES.index("whitespace"))
    if kinds:
        out[in_word] = np.asarray(kinds)[word_of[hit[in_word]]]
    return out.astype(np.int8)


def window_types(tok: Tokenizer, ids: np.ndarray) -> np.ndarray:
    """The TOKEN_TYPES index of every token of windows of token ids (n_windows, T), by
    the whole word it belongs to in its window's text; SPECIAL (-1) for special
    tokens, which are left out of the statistics by type.

    Typing an id on its own gets a subword wrong: "in" of "inside" would be a function
    word, a byte of "é" garbage, EOS (decoding to "") whitespace. Here each token's
    exact bytes (token_bytes) are joined into the window's text, which is split into
    words (WORD); a token takes the type of the first word it overlaps, so every piece
    of "inside", "café" or "3.14" gets its word's type and " the" or "the," is a
    function word; a token with no letter or digit in any word is whitespace if it is
    all whitespace, else punctuation. A special token ends the text before it and
    starts a new one, as a window edge does.

    A word cut by a window edge is typed by the part inside the window ("side" of
    "inside" at the start is a content word, "in" at the end a function word), and the
    bytes of a character cut by an edge are a symbol (U+FFFD): a window does not see
    past its edges. Which window the caller types decides whose type a position gets
    (loopscope.measure.trajectory.convergence.measure_run types the targets, the tokens
    each position predicts).
    """
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"window_types wants (n_windows, T) token ids, got shape {ids.shape}")
    pieces = token_bytes(tok)
    special = np.zeros(len(pieces), dtype=bool)
    special[special_ids(tok)] = True
    out = np.full(ids.shape, SPECIAL, dtype=np.int8)
    for window, row in zip(ids, out, strict=True):
        cuts = np.flatnonzero(special[window])
        for start, stop in zip(np.r_[0, cuts + 1], np.r_[cuts, len(window)], strict=True):
            if stop > start:
                row[start:stop] = _run_types([pieces[i] for i in window[start:stop]])
    return out


def type_names(types: np.ndarray) -> np.ndarray:
    """The name of each type index of window_types: its TOKEN_TYPES name, or "special"."""
    names = np.array([*TOKEN_TYPES, "special"], dtype=object)
    return names[np.where(types >= 0, types, len(TOKEN_TYPES))]
