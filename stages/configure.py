"""Stage configure: validate params.yaml and resolve every cell to configs/<cell>.json.

Each train@<cell> stage depends on its own file, so a param change reruns exactly
the cells whose resolved config changed. train.precision auto is written as what it
resolves to on this machine (loopscope.compute.precision_of), and the stage runs on
every `dvc repro` (always_changed: it takes a second), so on a machine that resolves auto
differently the file changes and the cell retrains instead of reusing results made at
another precision; where nothing changed the files are byte-identical and nothing reruns.
"""

import dataclasses
from collections import Counter

from loopscope import compute, paths
from loopscope.outputs import atomic_write_bytes
from loopscope.params import load_params, resolve_cell
from loopscope.stage import run


def main() -> None:
    params = load_params()
    paths.CONFIGS.mkdir(parents=True, exist_ok=True)
    resolved: Counter[str] = Counter()
    for name in params.cells:
        cell = resolve_cell(params, name)
        cell.train = dataclasses.replace(cell.train, precision=compute.precision_of(cell.train))
        resolved[cell.train.precision] += 1
        atomic_write_bytes(paths.config_file(name), cell.to_json().encode())
    where = ", ".join(f"{n} {p}" for p, n in resolved.items())
    print(f"configure: {len(params.cells)} cells ({where}) -> {paths.CONFIGS}/")


if __name__ == "__main__":
    run(main)  # no timings file: it runs on every `dvc repro` and takes a second
