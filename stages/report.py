"""Stage report@<name>: execute reports/<name>.ipynb over this run's metrics -> HTML."""

import sys
from pathlib import Path

from loopscope.config import load_params
from loopscope.report import render
from loopscope.stage import run


def main() -> None:
    name = sys.argv[1]
    params = load_params()
    render(Path("reports") / f"{name}.ipynb", Path("reports/html") / f"{name}.html",
           {"cells": list(params.cells)}, params.report.timeout_s)
    print(f"report: reports/html/{name}.html")


if __name__ == "__main__":
    run(main)
