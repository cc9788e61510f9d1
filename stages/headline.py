"""Stage headline: one small metrics file with each cell's headline numbers.

`dvc exp show` lists every metric of every cell (hundreds of columns); this file gives
the few an experiment is judged by, one row per cell in metrics/headline.json:
final-loop mean hidden-state norm and perplexity at the training depth.
"""

import json

from loopscope import paths
from loopscope.errors import DataError, run, write_json
from loopscope.params import load_params, resolve_cell


def main() -> None:
    params = load_params()
    rows = {}
    for name in params.cells:
        path = paths.metrics_file("diagnose", name)
        if not path.is_file():
            raise DataError(f"{path}: not found; run `dvc repro diagnose@{name}`.")
        diag = json.loads(path.read_text())
        last = f"k{resolve_cell(params, name).model.loops}"
        rows[name] = {"norm_final": diag["norm_mean"][last],
                      "ppl_final": diag["ppl_at_depth"][last]}
    write_json(paths.HEADLINE, rows)
    print("headline: " + ", ".join(f"{n} ppl {r['ppl_final']:.1f} norm {r['norm_final']:.1f}"
                                   for n, r in rows.items()))


if __name__ == "__main__":
    run(main)
