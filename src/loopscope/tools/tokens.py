"""How many training tokens a params file's corpus holds, for `plan`: from
prepared/meta.json where it matches the params, else estimated on the raw files by a
tokenizer trained on a sample, else unknown with the command that fetches the corpus."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopscope.base import paths
from loopscope.params import Params
from loopscope.weights.corpus import held_source
from loopscope.weights.data import Corpus
from loopscope.weights.tokenizer import train_tokenizer

SAMPLE_BYTES = 2_000_000  # text the estimate's tokenizer sees: seconds, even at 32k BPE


HELD_OUT = 0.1  # tail of the sample the tokens-per-byte ratio is measured on


@dataclass
class CorpusTokens:
    """Training tokens of the corpus (None: unknown) and where the number comes from."""

    tokens: int | None
    source: str


def fetch_command(params_file: str | Path) -> str:
    """The command that fetches a params file's corpus (data.hub or the embedded one)."""
    extra = "" if Path(params_file) == paths.PARAMS else f" --params {params_file}"
    return f"python -m loopscope.weights.corpus{extra}"


def meta_mismatch(meta: dict[str, Any], params: Params) -> str | None:
    """Why prepared/meta.json was not made for these params (None: it may have been).

    The prepare stage records the vocabulary size always, and the tokenizer kind and
    the hub dataset for anything but its default (own files, bpe); which files were
    read it cannot record, so a match is likely, not certain.
    """
    hub = params.data
    want = {"vocab_size": params.tokenizer.vocab_size,
            "tokenizer_kind": params.tokenizer.kind,
            "source": "hub" if hub.hub else None,
            "hub": ({"name": hub.hub, "config": hub.hub_config, "documents": hub.hub_documents}
                    if hub.hub else None)}
    got = {"vocab_size": meta.get("vocab_size"),
           "tokenizer_kind": meta.get("tokenizer_kind", "bpe"),
           "source": "hub" if meta.get("source") == "hub" else None,
           "hub": meta.get("hub")}
    for key, value in want.items():
        if got[key] != value:
            return f"its {key} is {got[key]!r}, not {value!r}"
    return None


def _sample_text(paths: list[Path], limit: int) -> tuple[str, int]:
    """The first `limit` bytes of the files, in order, as one text (a cut character is
    dropped) and its byte count."""
    texts, n = [], 0
    for path in paths:
        with open(path, "rb") as f:
            raw = f.read(limit - n)
        texts.append(raw.decode("utf-8", errors="ignore"))
        n += len(texts[-1].encode())
        if n >= limit:
            break
    return "".join(texts), n


def estimate_tokens(params: Params, data_dir: Path) -> CorpusTokens:
    """Estimate the training tokens from the raw text files in data_dir.

    Follows the prepare stage's layouts (loopscope.weights.data): a top-level train.txt (a hub
    corpus) is the train split, less its val_fraction tail if there is no
    validation.txt, with one end-of-text token per paragraph; otherwise every .txt
    file, less its val_fraction tail, one end-of-text token per file.

    The configured tokenizer is trained on the first 90% of a ~2 MB sample and the
    tokens per byte are measured on the rest: measured on its own training text a BPE
    tokenizer compresses too well (on Shakespeare at vocab 2048: -1.7% in-sample,
    +0.4% held out, against the prepared count).
    """
    tk = params.tokenizer
    corpus = Corpus(data_dir, params.data.val_fraction)  # the prepare stage's layouts
    hub = corpus.layout == "splits"
    files = [corpus.train_file] if hub else corpus.paths
    if not hub:
        what = f"{len(files)} .txt files x (1 - val_fraction)"
    else:
        what = "train.txt" if corpus.val_file else "train.txt x (1 - val_fraction)"
    text, n = _sample_text(files, SAMPLE_BYTES)
    cut = int(len(text) * (1 - HELD_OUT))
    tok = train_tokenizer([text[:cut]], tk.vocab_size, tk.kind, tk.min_frequency)
    held = text[cut:]
    tokens = len(tok.encode(held).ids)
    if hub:  # documents are paragraphs, each ends with end-of-text
        tokens += sum(1 for doc in re.split(r"\n\s*\n", held) if doc.strip())
    per_byte = tokens / max(1, len(held.encode()))
    total_bytes = corpus.size("train")
    eos = 0 if hub else len(files)
    return CorpusTokens(int(per_byte * total_bytes) + eos,
                        f"estimate: {per_byte:.3f} tokens/byte on a {n / 1e6:.1f} MB sample "
                        f"x {total_bytes / 1e6:,.1f} MB ({what})")


def corpus_tokens(params: Params, prepared: Path = paths.PREPARED,
                  params_file: str | Path = paths.PARAMS) -> CorpusTokens:
    """Training tokens: prepared/meta.json, else an estimate from data.dir, else unknown."""
    meta_path = prepared / "meta.json"
    why_not = ""
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
            why_not = meta_mismatch(meta, params) or ""
            if not why_not:
                return CorpusTokens(int(meta["splits"]["train"]["tokens"]),
                                    f"from {meta_path}: its tokenizer and source match")
            why_not = f"{meta_path} not used: {why_not}; "
        except (ValueError, KeyError, TypeError, AttributeError):
            why_not = f"{meta_path} not used: unreadable; "
    data_dir = Path(params.data.dir)
    held = held_source(data_dir)
    if held == "hub" if params.data.hub else (
            held in ("embedded", "files") and any(p.is_file() for p in data_dir.rglob("*.txt"))):
        found = estimate_tokens(params, data_dir)
        return CorpusTokens(found.tokens, why_not + found.source)
    what = f"hub dataset {params.data.hub}" if params.data.hub else "corpus"
    extra = ""
    if data_dir.is_dir() and any(data_dir.iterdir()):  # the fetch refuses another source
        extra = f"; {data_dir}/ holds another corpus: move it away first"
    return CorpusTokens(None, f"{why_not}the {what} is not fetched yet into {data_dir}/: "
                              f"run `{fetch_command(params_file)}`{extra}")
