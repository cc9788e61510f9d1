"""Stage prepare: train the tokenizer on the corpus and encode train/val token files.

The corpus layout (own .txt files, or a hub corpus's <split>.txt) decides the split; see
loopscope.weights.data. meta.json gains `source` and `tokenizer_kind` for anything but the
original default (own files, bpe), whose prepared/ thus stays byte for byte as before.
"""

from pathlib import Path

from loopscope.base import paths
from loopscope.weights.corpus import check_source
from loopscope.weights.data import Corpus, write_prepared
from loopscope.weights.params import SECTIONS, load
from loopscope.weights.tokenizer import document_pieces, encode, train_tokenizer

READS = ("data.dir", "data.val_fraction", "data.hub", "data.hub_config", "data.hub_documents",
         "tokenizer.kind", "tokenizer.vocab_size", "tokenizer.min_frequency")


def main() -> None:
    params = load(READS, SECTIONS)
    data, kind = params.data, params.tokenizer.kind
    data_dir = Path(data.dir)
    check_source(data_dir, data)  # the corpus there is the one params.yaml names
    corpus = Corpus(data_dir, data.val_fraction)
    print(f"prepare: {corpus.describe()}")
    tok = train_tokenizer(document_pieces(corpus.documents("train")),
                          params.tokenizer.vocab_size, kind, params.tokenizer.min_frequency)
    splits = {split: encode(tok, corpus.documents(split), corpus.size(split))
              for split in ("train", "val")}
    extra: dict = {"documents": corpus.document_count}
    if corpus.layout == "splits":
        extra["source"] = "hub"
        extra["hub"] = {"name": data.hub, "config": data.hub_config,
                        "documents": data.hub_documents}
    elif kind != "bpe":
        extra["source"] = "files"
    if "source" in extra:
        extra["tokenizer_kind"] = kind
    meta = write_prepared(paths.PREPARED, tok, splits, extra)
    print(f"prepare: {corpus.document_count} documents, {kind} vocab {meta['vocab_size']}, "
          + ", ".join(f"{k} {v['tokens']:,} tokens" for k, v in meta["splits"].items()))


if __name__ == "__main__":
    main()
