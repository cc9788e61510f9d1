"""Resampling units exist for any corpus: a corpus of two long files gives blocks of
windows, at least 30 of them, and no verdict is ever decided on its 2 documents."""

import numpy as np
import torch
from test_data import prepare

from loopscope.data import document_ids, load_tokenizer, load_tokens, window_sets
from loopscope.runs import document_window_sets
from loopscope.stats import Documents, effect, negligible
from loopscope.tokenizer import EOS
from loopscope.units import FEWEST_UNITS, MIN_UNITS, blocks, resampling_units


def novel(seed: int) -> str:
    """A long file without natural breaks between articles."""
    rng = np.random.default_rng(seed)
    words = ["the", "king", "said", "and", "to", "of", "a", "night", "sea", "came"]
    return " ".join(rng.choice(words, 60_000)) + "\n"


def test_a_two_file_corpus_resamples_blocks_not_its_two_documents(tmp_path, monkeypatch):
    prepare(tmp_path, monkeypatch, {"one.txt": novel(0), "two.txt": novel(1)},
            data={"val_fraction": 0.2})
    prepared = tmp_path / "prepared"
    tokens = torch.from_numpy(load_tokens(prepared, "val"))
    eos = load_tokenizer(prepared).token_to_id(EOS)
    context = 32
    (starts,) = window_sets(len(tokens), context, 128, 1, "diagnose.val_sequences")
    docs = document_ids(tokens, eos, starts)
    assert len(np.unique(docs)) == 2  # a file is a document
    units = resampling_units(docs, starts)
    assert units.describe() == {"unit": "block of 4 windows", "units": 32}
    assert units.describe()["units"] >= MIN_UNITS
    for u in np.unique(units.ids):  # a block never spans the two files
        assert len(np.unique(docs[units.ids == u])) == 1
    # the same per-token values: resampled by file, nothing decides; by block, it does
    rng = np.random.default_rng(0)
    values = 0.05 + rng.normal(0, 0.01, len(starts))
    by_file, by_block = Documents(docs, 300), Documents(units.ids, 300)
    iv_file = by_file.interval(by_file.mean(docs, values))
    iv_block = by_block.interval(by_block.mean(units.ids, values))
    assert iv_file.units == 2 and iv_block.units == 32
    assert effect(iv_file, +1) == "inconclusive" and negligible(iv_file, 1.0) == "inconclusive"
    assert effect(iv_block, +1) == "holds"
    # paper B's three disjoint sets: dealt out in blocks, each with its own units
    sets = document_window_sets(tokens, eos, context, 40, 3, "convergence.windows")
    assert not set(sets[0]) & set(sets[1]) and not set(sets[1]) & set(sets[2])
    for at in sets:
        assert resampling_units(document_ids(tokens, eos, at), at).describe()["units"] >= 10


def test_natural_documents_are_the_unit_where_there_are_enough():
    docs = np.repeat(np.arange(FEWEST_UNITS), 3)
    units = resampling_units(docs, np.arange(len(docs)))
    assert units.name == "document" and np.array_equal(units.ids, docs)
    few = resampling_units(np.repeat(np.arange(FEWEST_UNITS - 1), 8), np.arange(72))
    assert few.name == "block of 2 windows" and few.describe()["units"] == 36


def test_blocks_follow_the_start_order_whatever_the_input_order():
    starts = np.array([50, 10, 40, 0, 30, 20])
    ids = blocks(np.zeros(6, np.int64), starts, 2)
    assert [ids[list(starts).index(s)] for s in (0, 10, 20, 30, 40, 50)] == [0, 0, 1, 1, 2, 2]
