"""Stage summary: the front page's numbers, from the run's own outputs.

Writes docs/results.md and docs/results/norm.png (loopscope.render.summary) and refreshes the
generated blocks of README.md (the verdicts at a glance, the training cost), so no
result in README or docs is typed by hand.
"""

from loopscope.render.params import load
from loopscope.render.summary import NORM_FIGURE, RESULTS_PAGE, write

READS = ("cells",)


def main() -> None:
    write(list(load(READS).cells))
    print(f"summary: wrote {RESULTS_PAGE}, {NORM_FIGURE} and README.md's generated blocks")


if __name__ == "__main__":
    main()
