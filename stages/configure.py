"""Stage configure: validate params.yaml, resolve every cell to configs/<cell>.json and
check, before anything trains, that training fits this machine.

Each train@<cell> stage depends on its own file, so a param change reruns exactly the
cells whose resolved config changed. train.precision auto is written as what it
resolves to on this machine (loopscope.weights.compute.precision_of). `make repro` runs
this stage first on every call (`dvc repro --force configure`), so on a machine that
resolves auto differently the file changes and the cell retrains instead of reusing
results made at another precision; where nothing changed the files are byte-identical
and nothing reruns. A plain `dvc repro` runs it only when its code or params change
(it is no `always_changed` stage: a no-op `dvc repro` then takes a few seconds), so
after moving a run to another kind of machine, force it once: `dvc repro -f configure`.

An outside model (params.yaml's `outside:`, a released checkpoint measured beside the
cells) trains nothing: its entry is checked (its directory and config.json, through its
adapter) and written, device and precision resolved, to configs/<name>.json.

The checks before training's compute is spent run here, not in the train stage, so that
they are no dependency of training (an edit to a memory estimate retrains nothing): every
cell's training must fit the memory there is (loopscope.preflight.memory), and the disk
must have room for the model files not yet written and one resume checkpoint.
"""

import dataclasses
import sys
from collections import Counter

from loopscope.base import paths
from loopscope.base.errors import ParamsError
from loopscope.base.files import atomic_write_bytes
from loopscope.measure.exit_rules.rules import RULES
from loopscope.params import load_params
from loopscope.preflight import memory
from loopscope.preflight.disk import model_file_bytes, require_disk, resume_file_bytes
from loopscope.released import outside
from loopscope.weights import compute
from loopscope.weights.config import CellConfig
from loopscope.weights.outside_config import OutsideConfig
from loopscope.weights.resolve import resolve_cell


def check_disk(cells: list[CellConfig]) -> None:
    """Room for what training writes: each model file not yet on disk, and the resume
    checkpoint of the largest cell, twice (the previous one stays until the next is in
    place; cells train one after another and delete theirs when done)."""
    sizes = {c.cell: memory.num_params(c.model) for c in cells}
    missing = sum(model_file_bytes(sizes[c.cell]) for c in cells for s in c.seeds
                  if not paths.model_file(c.cell, s).is_file())
    resume = max(2 * resume_file_bytes(sizes[c.cell], c.train.processes) for c in cells)
    require_disk({paths.MODELS: missing, paths.CHECKPOINTS: resume},
                 "Free disk space (or train a smaller model: model.d_model, model.n_core), "
                 "then rerun `dvc repro`. Nothing was trained.")


def check_count_grids(grids: dict[str, list[float]], spec: OutsideConfig) -> None:
    """Every count rule's grid reaches an outside model's R too (as
    loopscope.params.check_policy_cells asks of the policies cells), so its policies
    always have a setting that matches depth R."""
    r = outside.depth(spec)
    for rule in (name for name, rule in RULES.items() if rule.counts and name in grids):
        if grids[rule][-1] < r:
            raise ParamsError(f"'policies.grids.{rule}' ends at {grids[rule][-1]:g} checks; "
                              f"it must reach R = {r} of outside model '{spec.cell}' "
                              f"(outside.{spec.cell}.loops, or its checkpoint's own depth).")


def main(out: str) -> None:
    params = load_params()
    paths.CONFIGS.mkdir(parents=True, exist_ok=True)
    resolved: Counter[str] = Counter()
    cells = []
    for name in params.cells:
        cell = resolve_cell(params, name)
        cell.train = dataclasses.replace(cell.train, precision=compute.precision_of(cell.train))
        memory.check_training(cell, compute.resolve(cell.train).device)
        resolved[cell.train.precision] += 1
        cells.append(cell)
    check_disk(cells)
    for cell in cells:
        atomic_write_bytes(paths.config_file(cell.cell), cell.to_json().encode())
    where = ", ".join(f"{n} {p}" for p, n in resolved.items())
    released = [outside.resolve(spec) for spec in params.outside.values()]
    for spec in released:
        check_count_grids(params.policies.grids, spec)
    for spec in released:
        atomic_write_bytes(paths.config_file(spec.cell), spec.to_json().encode())
    also = "".join(f", outside model {s.cell} ({s.adapter}, {s.device} {s.precision})"
                   for s in released)
    print(f"configure: {len(params.cells)} cells ({where}){also} -> {out}/")


if __name__ == "__main__":
    main(sys.argv[1])
