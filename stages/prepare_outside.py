"""Stage outside_prepare@<name>: the validation text in an outside model's own tokens.

The trained cells read prepared/, the project's tokenizer over the corpus; a released
model has its own vocabulary (Huginn-0125's: 65,536 tokens), so its windows and token
types come from its tokenizer.json over the same validation documents (the corpus's val
split, as the prepare stage cuts it), each followed by the model's end-of-text token
(loopscope.released.outside.eos_token). Writes prepared_outside/<name>/: tokenizer.json
(the model's), val.bin and meta.json (loopscope.weights.data.write_prepared's format,
with the end-of-text token and its id). prepared/ is left as it is.

    python stages/prepare_outside.py <name>
"""

import sys
from pathlib import Path

from loopscope.base import paths
from loopscope.released import outside
from loopscope.weights.data import Corpus, write_prepared
from loopscope.weights.outside_config import load_outside
from loopscope.weights.params import SECTIONS, load
from loopscope.weights.tokenizer import encode

READS = ("data.dir", "data.val_fraction")


def main(name: str) -> None:
    params = load(READS, SECTIONS)
    cfg = load_outside(paths.config_file(name))
    corpus = Corpus(Path(params.data.dir), params.data.val_fraction)
    tok = outside.tokenizer(cfg)
    eos, eos_id = outside.eos_token(cfg, tok)
    val = encode(tok, corpus.documents("val"), corpus.size("val"), eos=eos_id)
    meta = write_prepared(paths.outside_prepared(name), tok, {"val": val},
                          {"outside": name, "eos": eos, "eos_id": eos_id,
                           "documents": corpus.counts["val"]})
    print(f"outside_prepare {name}: {meta['splits']['val']['tokens']:,} validation tokens "
          f"in its own vocabulary of {meta['vocab_size']:,} ({eos!r} between documents) -> "
          f"{paths.outside_prepared(name)}/")


if __name__ == "__main__":
    main(sys.argv[1])
