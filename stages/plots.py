"""Stage plots: the long tables across cells that dvc.yaml's top-level plots draw
(loopscope.plot_tables) -> tables/plots/<name>.csv."""

from loopscope import paths
from loopscope.outputs import atomic_output
from loopscope.params import load_params
from loopscope.plot_tables import tables
from loopscope.stage import run


def main() -> None:
    params = load_params()
    found = tables(list(params.cells), params.policies.cells)
    for name, table in found.items():
        with atomic_output(paths.plot_table(name)) as tmp:
            table.to_csv(tmp, index=False, float_format="%.6g")
    print("plots: " + ", ".join(f"{paths.plot_table(n)} ({len(t)} rows)"
                                for n, t in found.items()))


if __name__ == "__main__":
    run(main, stage="plots")
