"""Stage report_<name>: execute reports/<name>.ipynb over this run's metrics -> HTML."""

import sys

from loopscope.base import paths
from loopscope.render.params import load
from loopscope.render.report import render
from loopscope.weights.config import load_cell

# The keys every report reads (the criteria's values come from tables/claims.json)
READS = ("cells", "policies.cells", "report.timeout_s")


def main(name: str) -> None:
    params = load(READS)
    configs = [load_cell(paths.config_file(c)) for c in params.cells]
    notebook = {"cells": list(params.cells),  # the seeds every cell's runs used
                "seeds": sorted({s for c in configs for s in c.seeds}),
                "policy_cells": list(params.policies.cells)}
    render(paths.report_template(name), paths.report_html(name), notebook,
           params.report.timeout_s)
    print(f"report: {paths.report_html(name)}")


if __name__ == "__main__":
    main(sys.argv[1])
