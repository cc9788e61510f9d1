"""Stage claims: every verdict of both papers, judged once, as data.

Writes tables/claims.json (loopscope.judge.claims.judge): paper A's claims in each recipe
group and paper B's, each row with its criterion, value, interval and verdict; the
verdict counts; and what the recipe does to paper A's drift magnitude. The reports
render it; `dvc exp run` keeps one per experiment, so a run with other seeds compares
claim by claim (`git diff` or `dvc exp diff` on this file).
"""

from loopscope.base.files import write_json
from loopscope.base.paths import CLAIMS
from loopscope.judge.claims import judge
from loopscope.judge.params import load

READS = ("cells", "policies.cells", "claims.margin_nats", "diagnose.bootstrap")


def main() -> None:
    params = load(READS)
    found = judge(list(params.cells), list(params.policies.cells),
                  params.claims.margin_nats, params.diagnose.bootstrap)
    write_json(CLAIMS, found)
    print("claims: " + "; ".join(
        f"{paper} " + ", ".join(f"{n} {v}" for v, n in counts.items() if n)
        for paper, counts in found["counts"].items()))


if __name__ == "__main__":
    main()
