"""Stage report@<name>: execute reports/<name>.ipynb over this run's metrics -> HTML."""

import sys

from loopscope import paths
from loopscope.config import load_cell
from loopscope.params import load_params
from loopscope.report import render
from loopscope.stage import run


def main() -> None:
    name = sys.argv[1]
    params = load_params()
    configs = [load_cell(paths.config_file(c)) for c in params.cells]
    notebook = {"cells": list(params.cells),  # the seeds every cell's runs used
                "seeds": sorted({s for c in configs for s in c.seeds}),
                "policy_cells": list(params.policies.cells)}
    if name != "convergence":  # paper A's verdicts: their margin and resamples
        notebook.update(margin_nats=params.diagnose.margin_nats,
                        bootstrap=params.diagnose.bootstrap)
    render(paths.report_template(name), paths.report_html(name), notebook,
           params.report.timeout_s)
    print(f"report: {paths.report_html(name)}")


if __name__ == "__main__":
    run(main, stage=f"report_{sys.argv[1]}")
