"""What the benchmarks share: `python -m loopscope.tools.bench` hands each benchmark the
options after its name, unchanged, with the options and defaults docs/benchmarks.md
documents; and the interleaved rounds every timing is a median over, checked round by
round where a check applies (timings injected: nothing here is timed)."""

import io

import pytest
from tqdm import tqdm

from loopscope.base import paths
from loopscope.measure.bench.rounds import SPREAD, checked_rounds, interleaved_rounds, timed_round
from loopscope.tools import bench, bench_train


@pytest.mark.parametrize("name, module, entry", [("exits", bench, "exits"),
                                                 ("train", bench_train, "main")])
def test_each_benchmark_gets_the_options_after_its_name(name, module, entry, monkeypatch):
    got = []
    monkeypatch.setattr(module, entry, lambda argv, prog: got.append((argv, prog)))
    bench.main([name, "--repeats", "3", "--out", "x.json"])
    bench.main([name])
    assert [argv for argv, _ in got] == [["--repeats", "3", "--out", "x.json"], []]
    assert all(prog.endswith(f" {name}") for _, prog in got)


def test_a_benchmark_help_lists_its_own_options(capsys):
    with pytest.raises(SystemExit) as done:
        bench.main(["train", "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    assert "--matmul" in shown and "--cell " not in shown and " train " in shown


def test_the_options_and_their_defaults_are_the_documented_ones():
    exits = vars(bench.exits_parser().parse_args([]))
    assert exits == {"cell": None, "repeats": None, "out": str(paths.bench_file("exits"))}
    train = vars(bench_train.parser().parse_args([]))
    assert train == {"cells": None, "steps": 10, "repeats": 5, "precisions": None,
                     "compile": False, "matmul": 2048, "out": str(paths.bench_file("train"))}


def test_interleaved_rounds_warm_up_unless_the_caller_did():
    calls = {"a": 0, "b": 0}
    jobs = {n: (lambda n=n: calls.__setitem__(n, calls[n] + 1)) for n in calls}
    rounds = interleaved_rounds(jobs, 3)
    assert calls == {"a": 4, "b": 4} and all(len(v) == 3 for v in rounds.values())
    interleaved_rounds(jobs, 3, warm=False)
    assert calls == {"a": 7, "b": 7}


def test_a_round_runs_every_job_once_in_rotated_order_timed_by_the_clock():
    order = []
    jobs = {n: (lambda n=n: order.append(n)) for n in ("a", "b", "c")}
    ticks = iter([0.0, 1.0, 1.0, 3.0, 3.0, 6.0])
    got = timed_round(jobs, 4, clock=lambda: next(ticks))  # shift 4 of 3 jobs: b, c, a
    assert order == ["b", "c", "a"]
    assert got == {"a": 3.0, "b": 1.0, "c": 2.0} and list(got) == ["a", "b", "c"]


def scripted(rounds: list[dict[str, float]]):
    """time_round from a list: attempt i gets rounds[i]; the attempts are recorded."""
    asked = []

    def time_round(i: int) -> dict[str, float]:
        asked.append(i)
        return rounds[i]
    return time_round, asked


def test_a_round_that_fails_the_check_is_set_aside_and_timed_again():
    fast, slow = {"x": 1.0, "y": 1.0}, {"x": 3.0, "y": 1.0}
    time_round, asked = scripted([fast, slow, fast, fast])
    bar = tqdm(total=3, file=io.StringIO())
    got = checked_rounds(time_round, 3, lambda r: r["x"] <= 2 * r["y"], bar)
    assert asked == [0, 1, 2, 3]  # attempt 1 failed and was retimed
    assert got.rounds == {"x": [1.0, 1.0, 1.0], "y": [1.0, 1.0, 1.0]}
    assert got.retimed == {"x": [3.0], "y": [1.0]} and got.failed == 0
    assert not got.extended and bar.n == bar.total == 4


def test_once_its_retimes_are_spent_a_failing_round_is_kept_and_counted():
    slow = {"x": 3.0, "y": 1.0}
    time_round, asked = scripted([slow] * 6)
    got = checked_rounds(time_round, 3, lambda r: r["x"] <= 2 * r["y"])
    assert len(asked) == 6  # 3 retimes, then 3 rounds kept
    assert got.rounds["x"] == [3.0] * 3 and got.retimed["x"] == [3.0] * 3
    assert got.failed == 3


def test_rounds_that_spread_are_doubled_once():
    y = [1.0, 1.0 + 2 * SPREAD, 1.0, 1.1, 1.1, 1.1, 9.0]
    time_round, asked = scripted([{"y": v} for v in y])
    bar = tqdm(total=3, file=io.StringIO())
    got = checked_rounds(time_round, 3, lambda r: True, bar)
    assert got.extended and got.rounds["y"] == y[:6]  # once: 6 rounds, not 7
    assert got.spread == pytest.approx(2 * SPREAD) and bar.n == bar.total == 6
    within = [1.0, 1.0 + SPREAD / 2, 1.0]
    got = checked_rounds(scripted([{"y": v} for v in within])[0], 3, lambda r: True)
    assert not got.extended and got.rounds["y"] == within
