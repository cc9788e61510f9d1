"""Stage prepare: train the tokenizer on the corpus and encode train/val token files."""

from pathlib import Path

from loopscope.config import load_params
from loopscope.data import encode, read_documents, split_documents, train_tokenizer, write_prepared
from loopscope.stage import run


def main() -> None:
    params = load_params()
    docs = read_documents(Path(params.data.dir))
    train_texts, val_texts = split_documents([text for _, text in docs],
                                             params.data.val_fraction)
    tok = train_tokenizer(train_texts, params.tokenizer.vocab_size)
    splits = {"train": encode(tok, train_texts), "val": encode(tok, val_texts)}
    meta = write_prepared(Path("prepared"), tok, splits, {"documents": len(docs)})
    print(f"prepare: {len(docs)} documents, vocab {meta['vocab_size']}, "
          + ", ".join(f"{k} {v['tokens']:,} tokens" for k, v in meta["splits"].items()))


if __name__ == "__main__":
    run(main)
