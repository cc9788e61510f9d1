"""What the benchmarks share: `python -m loopscope.tools.bench` hands each benchmark the
options after its name, unchanged, with the options and defaults docs/benchmarks.md
documents; and the interleaved rounds every timing is a median over."""

import pytest

from loopscope.base import paths
from loopscope.measure.rounds import interleaved_rounds
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
