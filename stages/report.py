"""Stage report_<name>: execute reports/<name>.ipynb over this run's metrics -> HTML.

Before the notebook runs, the stage records what the page is computed from
(loopscope.base.provenance: the commit checked out, every dependency dvc.yaml lists for
report_<name> by its DVC digest, the params' digest, package versions, CPU), adds the
seeds and the cells' training precision, and hands it to the notebook (`provenance`):
the page names its inputs as dvc.lock will record them, and never a state of the
working tree that the commit holding the page no longer has.
"""

import sys

from loopscope.base import paths
from loopscope.base.provenance import record
from loopscope.judge.cells import training_precision
from loopscope.render.params import load
from loopscope.render.report import render
from loopscope.weights.config import load_cell

# The keys every report reads (the criteria's values come from tables/claims.json)
READS = ("cells", "policies.cells", "report.timeout_s")


def main(name: str) -> None:
    params = load(READS)
    configs = {c: load_cell(paths.config_file(c)) for c in params.cells}
    seeds = sorted({s for c in configs.values() for s in c.seeds})  # every cell's runs
    provenance = {**record(f"report_{name}", READS), "seeds": seeds,
                  "precision": {"training": training_precision(configs),
                                "measuring": "fp32"}}
    notebook = {"cells": list(params.cells), "policy_cells": list(params.policies.cells),
                "provenance": provenance}
    render(paths.report_template(name), paths.report_html(name), notebook,
           params.report.timeout_s)
    print(f"report: {paths.report_html(name)}")


if __name__ == "__main__":
    main(sys.argv[1])
