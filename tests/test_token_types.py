"""Token types by the whole word a token is part of
(loopscope.measure.trajectory.token_types.window_types), on real byte-level BPE and word-level
tokenizers trained here on a tiny text."""

import time

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models

from loopscope.measure.trajectory.token_types import (
    SPECIAL,
    TOKEN_TYPES,
    token_bytes,
    token_type,
    type_names,
    window_types,
)
from loopscope.weights.tokenizer import EOS, UNK, train_tokenizer

# "café", the emoji and "東京" are left out on purpose: their bytes stay single-byte
# pieces, so a character is split across tokens.
TRAIN = "".join(
    f"She sat in the garden, inside the wall; the rain fell in {i},000 drops.\n"
    "He paid 3.14 coins for a cup and said: don't wait o'er the hill!\n\n"
    for i in range(1, 60))
UNSEEN = "Le café \U0001F600 東京 ok"


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    return train_tokenizer([TRAIN], 300)


@pytest.fixture(scope="module")
def word() -> Tokenizer:
    return train_tokenizer([TRAIN + UNSEEN], 300, "word")


def typed(tok: Tokenizer, ids: list[int]) -> list[tuple[bytes, str]]:
    """Each token's bytes beside its type name, for one window."""
    pieces = token_bytes(tok)
    names = type_names(window_types(tok, np.array([ids])))[0]
    return [(pieces[i], str(n)) for i, n in zip(ids, names, strict=True)]


def types_of(tok: Tokenizer, text: str) -> list[tuple[bytes, str]]:
    return typed(tok, tok.encode(text).ids)


@pytest.mark.parametrize("text, kind", [
    ("  \n", "whitespace"), (" ,", "punctuation"), ("--", "punctuation"), (" 1599", "number"),
    ("3.14", "number"), (" the", "function_word"), ("Thou", "function_word"),
    (" king", "content_word"), ("ing", "content_word"),
])
def test_token_type_names_a_piece_of_text_taken_alone(text, kind):
    assert token_type(text) == kind


def test_the_same_in_piece_is_a_function_word_alone_and_content_inside_a_word(bpe):
    ids = bpe.encode(" in the garden, inside the wall").ids
    inside = ids.index(bpe.token_to_id("side")) - 1
    assert ids[0] == ids[inside] == bpe.token_to_id("Ġin")  # one id, two roles
    assert token_type(bpe.decode([ids[inside]])) == "function_word"  # typed alone
    types = typed(bpe, ids)
    assert types[0] == (b" in", "function_word")
    assert types[inside:inside + 2] == [(b" in", "content_word"), (b"side", "content_word")]
    assert types[1] == (b" the", "function_word")


def test_eos_is_special_and_ends_the_word_before_it(bpe):
    eos = bpe.token_to_id(EOS)
    assert token_type(bpe.decode([eos])) == "whitespace"  # typed alone
    ids = bpe.encode("the rain fell in").ids + [eos] + bpe.encode("side the wall").ids
    types = typed(bpe, ids)
    at = ids.index(eos)
    assert types[at] == (b"", "special")
    assert types[at - 1] == (b" in", "function_word")  # not joined with "side"
    assert types[at + 1] == (b"side", "content_word")
    assert window_types(bpe, np.array([ids]))[0, at] == SPECIAL


@pytest.mark.parametrize("text, kind", [
    (" café", "content_word"), (" 東京", "content_word"), (" \U0001F600", "punctuation")])
def test_every_byte_piece_of_a_split_character_gets_its_words_type(bpe, text, kind):
    middle = bpe.encode(text).ids
    pieces = token_bytes(bpe)
    assert any(not _decodes(pieces[i]) for i in middle)  # a character is cut in two
    ids = bpe.encode("Le").ids + middle + bpe.encode(" ok").ids
    types = typed(bpe, ids)[len(ids) - len(middle) - 2:-2]
    assert [p for p, _ in types] == [pieces[i] for i in middle]
    assert [t for _, t in types] == ["whitespace" if p == b" " else kind for p, _ in types]
    assert typed(bpe, ids)[-1] == (b"k", "content_word")


def _decodes(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_numbers_keep_their_separators_across_pieces(bpe):
    types = types_of(bpe, "1,000 and 3.14")
    assert [p for p, _ in types] == [b"1", b",", b"00", b"0", b" a", b"nd", b" 3", b".", b"14"]
    assert [t for _, t in types] == ["number"] * 4 + ["function_word"] * 2 + ["number"] * 3


def test_punctuation_and_whitespace_alone(bpe):
    types = types_of(bpe, "the wall; the hill!\n\nHe")
    assert (b";", "punctuation") in types and (b"!", "punctuation") in types
    assert types.count((b"\n", "whitespace")) == 2
    assert types_of(bpe, "  the")[0] == (b" ", "whitespace")
    assert types[-1] == (b"He", "function_word")


def test_internal_apostrophes_stay_in_the_word(bpe):
    types = types_of(bpe, "don't  o'er the")
    assert [t for p, t in types if p.strip()] == (
        ["content_word"] * 3 + ["function_word"] * 4)  # o'er is on the list, o and er not
    assert types_of(bpe, "the 'er.")[2:4] == [(b"'", "punctuation"), (b"er", "content_word")]


def test_a_word_cut_by_the_window_edge_is_typed_by_the_part_inside(bpe):
    ids = bpe.encode("inside the wall and in").ids
    side = ids.index(bpe.token_to_id("side"))
    assert typed(bpe, ids[side:])[0] == (b"side", "content_word")
    assert typed(bpe, ids[:side])[-1][1] == "function_word"  # "in" of "inside"
    # A window that starts inside a character: its bytes are a symbol, the next
    # character is whole.
    cut = bpe.encode(" 東京").ids[2:]
    assert [t for _, t in typed(bpe, cut)] == ["punctuation"] * 2 + ["content_word"] * 3


def test_windows_are_typed_independently_and_shape_is_kept(bpe):
    a, b = bpe.encode("the rain fell in").ids, bpe.encode("side the wall").ids
    n = min(len(a), len(b))
    out = window_types(bpe, np.array([a[-n:], b[:n]]))
    assert out.shape == (2, n) and out.dtype == np.int8
    assert TOKEN_TYPES[out[0, -1]] == "function_word"  # " in" ends window 0
    with pytest.raises(ValueError, match="n_windows, T"):
        window_types(bpe, np.array(a))


def test_token_bytes_recover_the_text(bpe, word):
    text = TRAIN[:TRAIN.index("\n\n") + 2] + UNSEEN  # every word known to both
    for tok in (bpe, word):
        pieces = token_bytes(tok)
        assert b"".join(pieces[i] for i in tok.encode(text).ids) == text.encode()
    assert token_bytes(bpe)[bpe.token_to_id(EOS)] == b""


def test_the_word_level_kind(word):
    types = types_of(word, "don't wait o'er the hill in 1,000 and 3.14! " + UNSEEN)
    assert types[:3] == [(b"don", "content_word"), (b"'", "content_word"),
                         (b"t", "content_word")]
    assert types[6:9] == [(b"o", "function_word"), (b"'", "function_word"),
                          (b"er", "function_word")]
    assert (b" ", "whitespace") in types and (b"!", "punctuation") in types
    assert [t for p, t in types if p in (b"1", b",", b"000", b"3", b".", b"14")] == (
        ["number"] * 6)
    assert (b"\xc3\xa9", "content_word") in types  # the é of café
    eos, unk = word.token_to_id(EOS), word.token_to_id(UNK)
    ids = word.encode("the hill").ids + [eos, unk] + word.encode("in").ids
    assert [t for _, t in typed(word, ids)][-3:] == ["special", "special", "function_word"]


def test_an_unknown_decoder_is_refused():
    tok = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.decoder = decoders.WordPiece()
    with pytest.raises(ValueError, match="WordPiece"):
        window_types(tok, np.zeros((1, 2), dtype=np.int64))


def test_a_cells_report_windows_type_in_well_under_a_second(bpe):
    ids = np.array(bpe.encode(TRAIN).ids)
    windows = np.stack([np.roll(ids, -7 * i)[:128] for i in range(192)])
    start = time.perf_counter()
    window_types(bpe, windows)
    assert time.perf_counter() - start < 2.0  # about 0.15 s on the 2-core machine
