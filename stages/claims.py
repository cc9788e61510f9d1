"""Stage claims: every verdict of both papers, judged once, as data.

Writes tables/claims.json (loopscope.judge.claims.judge): a document that names its
schema (tables/claims.schema.json), the papers and what it was computed from (its
provenance, recorded before judging: loopscope.base.provenance), then paper A's claims
in each recipe group and paper B's, each row a record with its id, criterion, estimate
and interval, verdicts and the specification curve over the criteria's free
parameters, and the outside models' rows apart (extensions, loopscope.judge.outside); and
metrics/claims.json, the verdict counts of each paper's findings and
each claim's verdict as a number, so that `dvc exp show` and `dvc metrics diff` compare
verdicts across experiments claim by claim.
"""

from dataclasses import fields

from loopscope.base import paths
from loopscope.base.files import write_json
from loopscope.base.provenance import record
from loopscope.judge.claims import judge, metrics
from loopscope.judge.params import ClaimsConfig, load

STAGE = "claims"  # its name in dvc.yaml, whose deps the provenance names
READS = ("cells", "policies.cells", "diagnose.bootstrap",
         "claims.margin_nats", "claims.gain_share", "claims.leading_share",
         "claims.tail_factor", "claims.tail_share", "claims.slope_band",
         "claims.flat_nats", "claims.regime", "claims.tail_floor", "claims.tail_band",
         "claims.kl_factor", "claims.median_band", "claims.a2_share",
         "claims.noninferiority_nats", "claims.a1_band", "claims.low_depth",
         "claims.mean_range", "claims.floor_decades",
         "claims.contrast_decades", "claims.late_window", "claims.floor_share",
         "claims.settling_share", "claims.alternating_share", "claims.period2_ratio",
         "claims.period2_tokens", "claims.precision_floor", "outside")


def main() -> None:
    params = load(READS)
    provenance = record(STAGE, READS)
    values = {f.name: getattr(params.claims, f.name) for f in fields(ClaimsConfig)}
    found = judge(list(params.cells), list(params.policies.cells), values,
                  params.diagnose.bootstrap, provenance, tuple(params.outside))
    write_json(paths.CLAIMS, found)
    write_json(paths.CLAIM_COUNTS, metrics(found))
    print("claims: " + "; ".join(
        f"{paper} " + ", ".join(f"{n} {v}" for v, n in counts.items() if n)
        for paper, counts in found["counts"].items()))


if __name__ == "__main__":
    main()
