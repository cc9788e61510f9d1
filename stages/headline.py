"""Stage headline: one small metrics file with each cell's headline numbers.

`dvc exp show` lists every metric of every cell (hundreds of columns); this file gives
the few an experiment is judged by, one row per cell in metrics/headline.json:
final-loop mean hidden-state norm and perplexity at the training depth (paper A); and
for paper B (the cells of policies.cells), the KL exit (A1) at matched quality: its
mean loops (`a1_mean_loops`), its FLOPs over uniform depth R's (`a1_flops_ratio`) and
over the honest baseline's (`a1_flops_ratio_baseline`: uniform depth min(R, M), M the
smallest uniform depth that matches depth R), the one a per-token exit has to beat.
Null where no threshold matched or the policies were not swept.
"""

from loopscope.base import paths
from loopscope.base.files import write_json
from loopscope.base.outputs import read_metrics
from loopscope.render.params import load

READS = ("cells", "policies.cells")


def main() -> None:
    params = load(READS)
    rows = {}
    for name in params.cells:
        diag = read_metrics("diagnose", name)
        pol = read_metrics("policies", name) if name in params.policies.cells else {}
        last = f"k{len(diag['ppl_at_depth'])}"  # the cell's K: the sweep reads loops 1..K
        a1 = pol["kl"] if pol.get("kl", {}).get("matched") else {}
        rows[name] = {"norm_final": diag["norm_mean"][last],
                      "ppl_final": diag["ppl_at_depth"][last],
                      "a1_mean_loops": a1.get("mean_loops"),
                      "a1_flops_ratio": a1.get("flops_ratio"),
                      "a1_flops_ratio_baseline": a1.get("flops_ratio_baseline")}
    write_json(paths.HEADLINE, rows)
    print("headline: " + ", ".join(f"{n} ppl {r['ppl_final']:.1f} norm {r['norm_final']:.1f}"
                                   for n, r in rows.items()))


if __name__ == "__main__":
    main()
