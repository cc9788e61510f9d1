"""Resampling units exist for any corpus: a corpus of two long files gives blocks of
windows, as long as it takes for adjacent blocks to be nearly uncorrelated, and every
report says its units are blocks within those 2 documents; no verdict is ever decided
on the 2 documents themselves."""

import numpy as np
import pytest
import torch
from test_data import prepare

from loopscope.base import paths
from loopscope.base.files import write_json
from loopscope.judge.verdicts import effect, negligible
from loopscope.measure.runs import document_window_sets
from loopscope.render.report_tables import units_statement
from loopscope.stats.intervals import Documents, design_effect
from loopscope.stats.units import (
    FEWEST_UNITS,
    LAG1_MAX,
    MIN_UNITS,
    Units,
    block_length,
    blocks,
    lag1,
    resampling_units,
    window_surprisal,
)
from loopscope.weights.data import document_ids, load_tokenizer, load_tokens, window_sets
from loopscope.weights.tokenizer import EOS


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
    units = resampling_units(docs, starts, window_surprisal(tokens.numpy(), starts, context))
    # words drawn independently: adjacent windows are uncorrelated, a window is a unit
    assert units.name.startswith("window within 2 documents")
    assert units.describe()["units"] == 128
    for u in np.unique(units.ids):  # a unit never spans the two files
        assert len(np.unique(docs[units.ids == u])) == 1
    # every report says so (report_tables.units_statement reads what the stage wrote)
    write_json(paths.metrics_file("diagnose", "two_files"), units.describe())
    line = units_statement("diagnose", ["two_files"])
    assert line.startswith("Intervals resample 128 units (window within 2 documents, lag-1 ")
    assert f"span fewer than {FEWEST_UNITS} documents, so the units are blocks" in line

    # resampled by file, nothing decides
    rng = np.random.default_rng(0)
    values = 0.05 + rng.normal(0, 0.01, len(starts))
    by_file = Documents(docs, 300)
    iv_file = by_file.interval(by_file.mean(docs, values))
    assert iv_file.units == 2
    assert effect(iv_file, +1) == "inconclusive" and negligible(iv_file, 1.0) == "inconclusive"
    # paper B's three disjoint sets: dealt out in blocks, each with its own units
    sets = document_window_sets(tokens, eos, context, 40, 3, "convergence.windows")
    assert not set(sets[0]) & set(sets[1]) and not set(sets[1]) & set(sets[2])
    for at in sets:
        units = resampling_units(document_ids(tokens, eos, at), at,
                                 window_surprisal(tokens.numpy(), at, context))
        assert units.describe()["units"] >= 10


def test_natural_documents_are_the_unit_where_there_are_enough():
    docs = np.repeat(np.arange(FEWEST_UNITS), 3)
    units = resampling_units(docs, np.arange(len(docs)), np.zeros(len(docs)))
    assert units.name == "document" and np.array_equal(units.ids, docs)
    few = resampling_units(np.repeat(np.arange(FEWEST_UNITS - 1), 8), np.arange(72),
                           np.random.default_rng(0).normal(size=72))
    assert few.name.startswith("window within 9 documents") and few.describe()["units"] == 72


def test_paper_b_sets_ask_for_more_units_than_documents_give():
    # 12 documents pass the floor of 10 but not paper B's 30: independent windows
    # (no drift) become one unit each, 48 in all
    docs = np.repeat(np.arange(12), 4)
    values = np.random.default_rng(1).normal(size=48)
    assert resampling_units(docs, np.arange(48), values).name == "document"
    units = resampling_units(docs, np.arange(48), values, MIN_UNITS)
    assert units.name.startswith("window within 12 documents")
    assert units.describe()["units"] == 48 >= MIN_UNITS


def test_blocks_follow_the_start_order_whatever_the_input_order():
    starts = np.array([50, 10, 40, 0, 30, 20])
    ids = blocks(np.zeros(6, np.int64), starts, 2)
    assert [ids[list(starts).index(s)] for s in (0, 10, 20, 30, 40, 50)] == [0, 0, 1, 1, 2, 2]


def drifting(n: int, phi: float, seed: int = 0) -> np.ndarray:
    """An AR(1) series: each window's value phi times the last one's plus noise, as a
    text's topic drifts."""
    rng = np.random.default_rng(seed)
    out = np.zeros(n)
    for i in range(1, n):
        out[i] = phi * out[i - 1] + rng.normal()
    return out


def test_blocks_lengthen_until_adjacent_blocks_are_nearly_uncorrelated():
    docs, starts = np.repeat([0, 1], 2048), np.arange(4096)
    values = np.concatenate([drifting(2048, 0.95, 1), drifting(2048, 0.95, 2)])
    assert lag1(docs, starts, values, 1) > 0.9  # adjacent windows: nearly the same value
    per, r = block_length(docs, starts, values)
    assert per >= 16 and r <= max(LAG1_MAX, 2 / np.sqrt(4096 / per - 2))
    assert lag1(docs, starts, values, per // 2) > r  # the block before was more correlated
    units = resampling_units(docs, starts, values)
    assert units.name.startswith(f"block of {per} windows within 2 documents, lag-1 ")
    assert units.describe()["units"] == 4096 // per
    # independent windows stay single windows
    assert block_length(docs, starts, np.random.default_rng(3).normal(size=4096))[0] == 1


def test_a_drift_that_never_fades_ends_in_blocks_too_few_to_decide():
    docs, starts = np.zeros(64, np.int64), np.arange(64)
    per, _ = block_length(docs, starts, np.arange(64.0))  # a trend: every block follows the last
    assert 64 // per < FEWEST_UNITS  # so no interval over them decides (stats.decides)


def test_window_surprisal_is_the_mean_unigram_surprisal_of_each_window():
    tokens = np.array([0, 0, 0, 1, 0, 0, 0, 1])  # p(0) = 3/4, p(1) = 1/4
    s = window_surprisal(tokens, np.array([0, 4]), 4)
    expected = (3 * -np.log(0.75) - np.log(0.25)) / 4
    assert np.allclose(s, [expected, (-np.log(0.25) + 3 * -np.log(0.75)) / 4])


def test_blocks_within_few_documents_are_resampled_documents_first():
    """Six documents of eight blocks each, documents far apart: resampling the blocks as
    if independent gives too narrow an interval; resampling documents, each with its
    blocks, widens it by about the design effect."""
    rng = np.random.default_rng(0)
    parents = np.repeat(np.arange(6), 8)
    units = np.arange(48)
    values = rng.normal(0, 1, 6)[parents] + rng.normal(0, 0.1, 48)
    flat = Documents(units, 2000)
    nested = Documents(units, 2000, parents=parents)
    width = {name: (lambda iv: iv.hi - iv.lo)(d.interval(d.mean(units, values)))
             for name, d in (("flat", flat), ("nested", nested))}
    assert width["nested"] > 2 * width["flat"]
    effect = design_effect(units, values, parents, 2000)
    assert effect > 4
    assert (width["nested"] / width["flat"]) ** 2 == pytest.approx(effect, rel=0.35)
    # blocks that do not depend on their document: nothing to widen, on average
    many = np.repeat(np.arange(40), 8)
    effects = [design_effect(np.arange(320), np.random.default_rng(s).normal(0, 1, 320),
                             many, 1000) for s in range(8)]
    assert np.mean(effects) == pytest.approx(1.0, abs=0.2)
    with pytest.raises(ValueError, match="two documents"):
        Documents(np.array([0, 0]), 10, parents=np.array([0, 1]))


def test_units_describe_the_documents_their_blocks_lie_in():
    found = Units(np.array([0, 1, 2, 3]), "block of 2 windows within 2 documents",
                  np.array([0, 0, 1, 1])).describe()
    assert found == {"unit": "block of 2 windows within 2 documents", "units": 4,
                     "documents": 2}
    assert Units(np.array([0, 1]), "document").describe() == {"unit": "document", "units": 2}
