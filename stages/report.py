"""Stage report@<name>: execute reports/<name>.ipynb over this run's metrics -> HTML."""

import sys

from loopscope import paths
from loopscope.errors import run
from loopscope.params import load_params
from loopscope.report import render


def main() -> None:
    name = sys.argv[1]
    params = load_params()
    render(paths.report_template(name), paths.report_html(name),
           {"cells": list(params.cells)}, params.report.timeout_s)
    print(f"report: {paths.report_html(name)}")


if __name__ == "__main__":
    run(main)
