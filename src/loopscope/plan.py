"""Check a params file and print what training its cells would cost, without training.

    python -m loopscope.plan [PARAMS_FILE] [--json] [--device cuda|cpu] [--tflops X]

A paper-scale run takes GPU-hours; a wrong context, a too-large batch or an epoch count
that means ten times more steps than intended should show up in a second. For every
cell this prints the parameter count, the training depth, tokens and steps per epoch
and a memory estimate, and a total over all training runs (cells x seeds).

The params file is validated first (load_params): a bad key prints one `error: ...`
line and exits 1 before anything else happens, like every stage.

Tokens come, in order of preference, from prepared/meta.json (if its vocabulary size,
tokenizer kind and hub dataset match the params; which files it read is not recorded, so
a match is likely, not certain), from
an estimate on the raw .txt files in data.dir (a tokenizer trained on a ~2 MB sample),
or not at all (the corpus is not fetched yet; the command that fetches it is printed).

The memory column is loopscope.memory's training estimate per process (its docstring
has the formula), the same numbers the train stage checks against the memory there is
before its first step. Not counted: the CUDA context (~0.5 GiB).

The time column is training FLOPs over an assumed sustained rate (--tflops, default
TFLOPS on cuda; none on a CPU unless given): per token, the forward pass at the
sampler's mean depth with its readouts (loopscope.model.cost) plus twice the part the
gradients run through (the kept loops). An order of magnitude to budget by, not a
measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopscope import compute, memory, paths
from loopscope.config import CellConfig
from loopscope.corpus import held_source
from loopscope.data import Corpus, steps_for_epochs, train_windows
from loopscope.depth import sampler
from loopscope.memory import GIB, num_params
from loopscope.model import cost
from loopscope.params import Params, load_params, resolve_cell
from loopscope.tokenizer import train_tokenizer

TFLOPS = 50.0  # assumed sustained bf16 TFLOP/s of one current GPU (H100 / 4090 class)
SAMPLE_BYTES = 2_000_000  # text the estimate's tokenizer sees: seconds, even at 32k BPE
HELD_OUT = 0.1  # tail of the sample the tokens-per-byte ratio is measured on


@dataclass
class CorpusTokens:
    """Training tokens of the corpus (None: unknown) and where the number comes from."""

    tokens: int | None
    source: str


def assumed_device(cell: CellConfig, device: str | None = None) -> str:
    """The device training would use (loopscope.compute's rule), assuming the given
    device is what this machine has, where train.device is auto."""
    cuda = compute.uses_cuda(cell.train.device, device == "cuda" if device else None)
    return "cuda" if cuda else "cpu"


def train_flops_per_token(cell: CellConfig) -> float:
    """Training FLOPs per token at the sampler's mean depth: the forward pass with its
    readouts, plus the backward pass (2x forward) through the loops gradients reach."""
    m, t = cell.model, cell.train
    c, mean = cost(m), sampler(t, m.loops).mean()
    kept = min(mean, t.backprop_loops) if t.backprop_loops > 0 else mean
    per_loop = t.loss == "per_loop"
    forward = c.prelude + c.loop * mean + c.readout * (mean if per_loop else 1)
    backward = 2 * (c.prelude + c.loop * kept + c.readout * (kept if per_loop else 1))
    return forward + backward


def plan_cell(cell: CellConfig, tokens: int | None, device: str | None = None,
              n_params: int | None = None, tflops: float | None = None) -> dict[str, Any]:
    """Size, depth, steps, memory (loopscope.memory.training) and time estimate of one
    cell.

    tokens: training tokens of the corpus (None: unknown, so no epoch numbers).
    device: assumed device where train.device is auto. n_params: a cached count.
    tflops: the assumed sustained rate (None: TFLOPS on cuda, no time on a CPU).
    """
    m, t = cell.model, cell.train
    dev = assumed_device(cell, device)
    est = memory.training(cell, dev == "cuda", n_params)
    needs = {**est.parts, "total": est.total}

    windows = train_windows(tokens, m.context, t.stride) if tokens is not None else None
    if t.epochs > 0:
        steps = (steps_for_epochs(t.epochs, tokens, m.context, t.stride, t.batch_size)
                 if tokens is not None else None)
    else:
        steps = t.steps
    epochs = (steps * t.batch_size / windows if steps is not None and windows else None)
    trained = steps * t.batch_size * m.context if steps is not None else None
    flops = train_flops_per_token(cell) * trained if trained is not None else None
    rate = tflops if tflops is not None else (TFLOPS if dev == "cuda" else None)
    return {
        "params": est.params,
        "loops": m.loops,
        "depth": t.depth,
        "depth_mean": sampler(t, m.loops).mean(),
        "depth_p99": est.depth_p99,
        "loops_kept": est.loops_kept,
        "readouts": est.readouts,
        "block_applications": est.blocks,
        "windows_per_epoch": windows,
        "tokens_per_epoch": windows * m.context if windows is not None else None,
        "steps": steps,
        "epochs": epochs,
        "tokens_trained": trained,
        "train_flops": flops,
        "tflops_assumed": rate,
        "hours": flops / (rate * 1e12) / 3600 if flops is not None and rate else None,
        "runs": len(cell.seeds),
        "device": dev,
        "device_auto": t.device == "auto",
        "activation_bytes": est.act_bytes,
        "batch_per_process": est.batch,
        "memory_bytes": needs,
        "memory_gib": {k: v / GIB for k, v in needs.items()},
    }


def fetch_command(params_file: str | Path) -> str:
    """The command that fetches a params file's corpus (data.hub or the embedded one)."""
    extra = "" if Path(params_file) == paths.PARAMS else f" --params {params_file}"
    return f"python -m loopscope.corpus{extra}"


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

    Follows the prepare stage's layouts (loopscope.data): a top-level train.txt (a hub
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


def _n(x: float | None, fmt: str = ",.0f") -> str:
    return "?" if x is None else format(x, fmt)


def _si(x: float | None) -> str:
    """1234567 -> 1.2M: counts that span six orders of magnitude, readable at a glance."""
    if x is None:
        return "?"
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.1f}{unit}"
    return f"{x:.0f}"


def plan(path: str | Path, device: str | None = None,
         prepared: Path = paths.PREPARED, tflops: float | None = None) -> dict[str, Any]:
    """The whole plan of a params file: corpus tokens, every cell, and a total."""
    params = load_params(path)  # first: a bad key fails before any work
    corpus = corpus_tokens(params, prepared, path)
    counts: dict[str, int] = {}
    cells = {}
    for name in params.cells:
        cell = resolve_cell(params, name)
        key = json.dumps(cell.model.__dict__, sort_keys=True)
        counts.setdefault(key, num_params(cell.model))
        cells[name] = plan_cell(cell, corpus.tokens, device, counts[key], tflops)
    runs = sum(c["runs"] for c in cells.values())

    def total(key: str) -> float | None:
        values = [c[key] for c in cells.values()]
        if None in values:
            return None
        return sum(v * c["runs"] for v, c in zip(values, cells.values(), strict=True))

    return {
        "params_file": str(path),
        "device_given": device,
        "corpus": {"train_tokens": corpus.tokens, "source": corpus.source},
        "cells": cells,
        "total": {"cells": len(cells), "runs": runs, "steps": total("steps"),
                  "tokens_trained": total("tokens_trained"),
                  "train_flops": total("train_flops"), "hours": total("hours"),
                  "peak_memory_gib": max(c["memory_gib"]["total"] for c in cells.values())},
    }


def format_plan(result: dict[str, Any]) -> str:
    """A readable text table of plan()'s result."""
    rows = []
    for name, c in result["cells"].items():
        depth = (f"{c['loops']}" if c["depth"] == "fixed"
                 else f"~{c['depth_mean']:.1f} (p99 {c['depth_p99']})")
        gib = c["memory_gib"]
        rows.append([name, _si(c["params"]), depth, str(c["loops_kept"]),
                     _si(c["windows_per_epoch"]), _si(c["tokens_per_epoch"]), _n(c["steps"]),
                     _n(c["hours"], ",.1f"),
                     _n(c["epochs"], ".2f"),
                     str(c["runs"]), f"{gib['weights_optimizer']:.1f}",
                     f"{gib['activations']:.1f}", f"{gib['attention']:.1f}",
                     f"{gib['logits']:.1f}", f"{gib['total']:.1f}"])
    t = result["total"]
    rows.append(["total", "", "", "", "", "", _n(t["steps"]), _n(t["hours"], ",.1f"), "",
                 str(t["runs"]), "", "", "",
                 "", f"{t['peak_memory_gib']:.1f} max"])
    header = ["cell", "params", "depth", "bp loops", "windows/epoch", "tokens/epoch", "steps",
              "hours", "epochs", "runs", "W+G+Adam", "activ.", "attn.", "logits", "GiB (est.)"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                         for i, (v, w) in enumerate(zip(r, widths, strict=True)))

    first = next(iter(result["cells"].values()))
    precision = "16-bit" if first["activation_bytes"] == 2 else "fp32"
    tokens = result["corpus"]["train_tokens"]
    where = ""
    if first["device_auto"]:
        where = (" (train.device auto, from --device)" if result["device_given"] else
                 " (train.device auto, as on this machine; --device cuda plans for a GPU)")
    out = [f"plan: {result['params_file']} (nothing is trained; memory is an estimate; "
           "attn.: the attention matrices, which fused attention kernels do not store)",
           f"train tokens: {_n(tokens)} ({result['corpus']['source']})",
           f"device: {first['device']}{where}, {precision} activations, batch per process "
           f"{first['batch_per_process']} (first cell; memory is per process)",
           "", line(header), line(["-" * w for w in widths]), *map(line, rows[:-1]),
           line(["-" * w for w in widths]), line(rows[-1])]
    if t["tokens_trained"] is not None:
        out.append(f"all runs together train on {_si(t['tokens_trained'])} tokens "
                   f"(steps x batch x context), {t['train_flops']:.2e} FLOPs")
    if t["hours"] is not None:
        out.append(f"time: {t['hours']:,.1f} device-hours at an assumed "
                   f"{first['tflops_assumed']:g} TFLOP/s sustained (--tflops; an estimate "
                   "from FLOPs, not a measurement)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("params_file", nargs="?", default=str(paths.PARAMS))
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--device", choices=("cuda", "cpu"),
                        help="assume this device where train.device is auto "
                             "(default: cuda if this machine has it)")
    parser.add_argument("--prepared", default=str(paths.PREPARED),
                        help="the prepare stage's output")
    parser.add_argument("--tflops", type=float,
                        help=f"assumed sustained TFLOP/s for the time column (default "
                             f"{TFLOPS:g} on cuda, no time on a CPU)")
    args = parser.parse_args(argv)
    if args.tflops is not None and args.tflops <= 0:
        parser.error(f"--tflops is {args.tflops:g}; it must be > 0")
    result = plan(args.params_file, args.device, Path(args.prepared), args.tflops)
    try:
        print(json.dumps(result, indent=2) if args.json else format_plan(result), flush=True)
    except BrokenPipeError:  # `plan | head`: the reader is gone, not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    from loopscope.errors import run

    run(main)
