"""Stage configure: validate params.yaml and resolve every cell to configs/<cell>.json.

Each train@<cell> stage depends on its own file, so a param change reruns exactly
the cells whose resolved config changed.
"""

from loopscope import paths
from loopscope.errors import atomic_write_bytes, run
from loopscope.params import load_params, resolve_cell


def main() -> None:
    params = load_params()
    paths.CONFIGS.mkdir(parents=True, exist_ok=True)
    for name in params.cells:
        atomic_write_bytes(paths.config_file(name), resolve_cell(params, name).to_json().encode())
    print(f"configure: {len(params.cells)} cells -> {paths.CONFIGS}/")


if __name__ == "__main__":
    run(main)
