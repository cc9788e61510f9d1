"""Stage configure: validate params.yaml and resolve every cell to configs/<cell>.json.

Each train@<cell> stage depends on its own file, so a param change reruns exactly
the cells whose resolved config changed.
"""

import sys
from pathlib import Path

from loopscope.config import load_params, resolve_cell
from loopscope.data import atomic_write_bytes
from loopscope.stage import run


def main() -> None:
    params = load_params()
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "configs")
    out.mkdir(parents=True, exist_ok=True)
    for name in params.cells:
        atomic_write_bytes(out / f"{name}.json", resolve_cell(params, name).to_json().encode())
    print(f"configure: {len(params.cells)} cells -> {out}/")


if __name__ == "__main__":
    run(main)
