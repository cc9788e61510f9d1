"""Stage plots: the long tables across cells that dvc.yaml's top-level plots draw
(loopscope.render.plot_tables) -> tables/plots/<name>.csv."""

from loopscope.base import paths
from loopscope.base.files import atomic_output
from loopscope.render.params import load
from loopscope.render.plot_tables import tables

READS = ("cells", "policies.cells")


def main() -> None:
    params = load(READS)
    found = tables(list(params.cells), params.policies.cells)
    for name, table in found.items():
        with atomic_output(paths.plot_table(name)) as tmp:
            table.to_csv(tmp, index=False, float_format="%.6g")
    print("plots: " + ", ".join(f"{paths.plot_table(n)} ({len(t)} row{'s' * (len(t) != 1)})"
                                for n, t in found.items()))


if __name__ == "__main__":
    main()
