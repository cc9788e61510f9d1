"""The depth-use search (loopscope.tools.levers): experiments that are valid and distinct,
results read from `dvc exp show --json` alone, the rerun check, the generated page."""

import json
from pathlib import Path

import pytest
import yaml

from loopscope.base.errors import DataError, ParamsError
from loopscope.params import parse_params
from loopscope.tools import levers
from loopscope.weights.resolve import resolve_cell

ROOT = Path(__file__).resolve().parents[1]
RAW = yaml.safe_load((ROOT / "params.yaml").read_text())
BASE_RAW = levers.with_overrides(RAW, levers.BASELINE)  # a commit that trains the base recipe


def test_every_experiment_is_a_valid_backbone_that_differs_from_the_base_recipe():
    levers.validate(RAW)
    default = resolve_cell(parse_params(levers.with_overrides(RAW, levers.BASELINE)),
                           levers.CELL)
    for e in levers.EXPERIMENTS:
        cell = resolve_cell(parse_params(levers.with_overrides(RAW, e)), levers.CELL)
        assert cell != default, e.name
    assert len({e.name for e in levers.EXPERIMENTS}) == len(levers.EXPERIMENTS)


def test_a_bad_override_is_refused_naming_the_experiment():
    bad = levers.Experiment("bad", "x", ("model.n_kore=1",))
    with pytest.raises(ParamsError, match="n_kore"):
        resolve_cell(parse_params(levers.with_overrides(RAW, bad)), levers.CELL)


def test_the_trend_spans_8x_of_training_tokens_around_the_default():
    steps = [levers.tokens(levers.with_overrides(RAW, e)) for e in levers.EXPERIMENTS
             if e.axis == levers.TREND and e.lever == levers.TREND]
    default = levers.tokens(RAW)
    assert min(steps) < default < max(steps) and max(steps) / min(steps) >= 8


def test_the_command_retrains_the_backbone_alone():
    e = levers.experiment("lever-prelude-coda")
    assert e.command() == ["dvc", "exp", "run", "--queue", "-n", "lever-prelude-coda",
                           "convergence@backbone",
                           "-S", "++cells.backbone.train.depth_sigma=0.5",
                           "-S", "++cells.backbone.seeds=[42]",
                           "-S", "++cells.backbone.train.steps=720",
                           "-S", "++cells.backbone.model.n_prelude=1",
                           "-S", "++cells.backbone.model.n_coda=1"]
    assert "--queue" not in e.command(queue=False)
    # a lever on the base's own key replaces it rather than setting it twice
    assert levers.experiment("lever-sigma01").sets == ("seeds=[42]", "train.steps=720",
                                                      "train.depth_sigma=0.1")
    with pytest.raises(Exception, match="unknown experiment"):
        levers.experiment("nope")


def conv(useful=3.0, gain=0.2, share=0.01, r=8):
    iv = {"value": useful, "lo": useful, "hi": useful + 1}
    return {"r": r,
            "ce_at_depth": {f"k{k}": 4.0 + 1 / k for k in range(1, 4 * r + 1)},
            "saturation": {"useful_depth": int(useful), "useful_depth_iv": iv,
                           "tolerance": 0.01},
            "elasticity": {"gain": {"value": gain, "lo": gain - 0.01, "hi": gain + 0.01}},
            "convergence": {"share_after_r": {"value": share, "lo": 0.0,
                                                       "hi": 2 * share}}}


def rev(raw, c, seconds=100.0, timestamp="2026-12-02T01:00:00"):
    return {"timestamp": timestamp, "params": {"params.yaml": {"data": raw}},
            "metrics": {"metrics/convergence/backbone.json": {"data": c},
                        "metrics/train_timings/backbone.json":
                            {"data": {"train_seconds": seconds}}}}


def exp_show(commit_raw=BASE_RAW, extra=()):
    """`dvc exp show --json`'s shape: the commit, one finished and one running run."""
    e = levers.experiment("trend-steps-180")
    done = {"name": e.name, "executor": {"state": "success"},
            "revs": [{"rev": "abc", "data": rev(levers.with_overrides(RAW, e), conv(5.0))}]}
    running = {"name": "lever-core1", "executor": {"state": "running"},
               "revs": [{"rev": "def", "data": rev(commit_raw, conv(7.0))}]}  # baseline's files
    failed = {"name": "lever-width64", "executor": {"state": "failed"},
              "revs": [{"rev": "ghi", "data": rev(commit_raw, conv(7.0)), "error": None}]}
    timed = rev(commit_raw, conv())
    timed["metrics"]["metrics/bench/exits.json"] = {"data": BENCH}
    runtime = {"name": levers.RUNTIME.name, "executor": None,
               "revs": [{"rev": "jkl", "data": timed}]}
    return [{"rev": "workspace", "data": rev(commit_raw, conv())},
            {"rev": "1234567890", "name": "main", "data": rev(commit_raw, conv()),
             "experiments": [done, running, failed, runtime, *extra]}]


BENCH = {"r": 8, "matched_depth": 5, "baseline_depth": 5,
         "scoring": {"mean_loops": {"kl": 4.1}, "realized": {"kl": 1.25},
                     "flop_speedup": {"kl": 1.1}, "realized_vs_r": {"kl": 1.9},
                     "flop_speedup_vs_r": {"kl": 1.7}}}


def test_results_come_from_finished_experiments_only():
    results = levers.from_exp_show(exp_show())
    names = [r["name"] for r in results["rows"]]
    assert names == ["default", "trend-steps-180"]
    assert "lever-core1" in results["missing"] and "lever-core1" not in results["failed"]
    assert results["failed"] == ["lever-width64"]
    default, short = results["rows"]
    assert short["tokens"] * 4 == default["tokens"] == 720 * 16 * 128
    assert short["useful_depth"]["value"] == 5.0 and short["rev"] == "abc"
    assert results["defaults"]["model.n_core"] == 2.0


def test_the_default_row_is_the_base_recipe_not_whatever_the_commit_trains():
    moved = levers.with_overrides(RAW, levers.experiment("lever-sigma01"))  # sigma 0.1
    assert not levers.is_base(moved)
    assert levers.is_base(levers.with_overrides(moved, levers.BASELINE))
    with pytest.raises(DataError, match="no finished `default` experiment"):
        levers.from_exp_show(exp_show(moved))
    base = {"name": "default", "executor": {"state": "success"},
            "revs": [{"rev": "mno", "data": rev(levers.with_overrides(moved, levers.BASELINE),
                                                 conv(4.0))}]}
    results = levers.from_exp_show(exp_show(moved, [base]))
    default = results["rows"][0]
    assert default["name"] == "default" and default["rev"] == "mno"
    assert default["useful_depth"]["value"] == 4.0
    assert results["defaults"]["train.depth_sigma"] == 0.5  # the base's, not the commit's


def test_the_page_and_figure_are_generated_from_the_results(tmp_path):
    results = levers.from_exp_show(exp_show())
    results["machine"] = "test machine"
    text = levers.page(results)
    assert "| trend-steps-180 | training tokens | 0.37 | 5 [5, 6] / 8 |" in text
    assert "`trend-steps-180`, 5 of R = 8" in text  # the deepest, named
    assert "Failed (`dvc queue logs NAME` says why" in text and "lever-width64" in text
    assert "| scoring | kl | 4.10 | 1.25x | 1.10x | 1.90x |" in text  # the runtime
    assert "baseline a per-token policy\nhas to beat is depth 5" in text
    levers.figure(results, tmp_path / "depth.png")
    assert (tmp_path / "depth.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.committed
def test_the_committed_page_is_the_committed_results_rendered():
    results = json.loads((ROOT / levers.RESULTS).read_text())
    assert (ROOT / levers.PAGE).read_text() == levers.page(results)


def test_a_rerun_agrees_within_a_loop_and_two_hundredths_of_a_nat():
    results = levers.from_exp_show(exp_show())
    assert levers.check("trend-steps-180", conv(6.0, gain=0.2), results) == []
    assert levers.check("trend-steps-180", conv(7.0), results)  # 2 loops off
    assert levers.check("trend-steps-180", conv(5.0, gain=0.23), results)
    with pytest.raises(DataError, match="no row"):
        levers.check("lever-core1", conv(), results)


def test_the_search_ranks_on_the_choose_windows_not_on_the_verdicts_data():
    def row(name, report, choose):
        return {"name": name, "useful_depth": {"value": report, "lo": report, "hi": report},
                "elasticity": {"value": 0.5}, "choose_useful_depth": choose}

    rows = [row("a", 6, 4), row("b", 5, 5)]
    best, on = levers.deepest(rows)
    assert best["name"] == "b" and "`choose`" in on  # report alone would pick a
    old = [dict(r, choose_useful_depth=None) for r in rows]
    best, on = levers.deepest(old)
    assert best["name"] == "a" and "predate" in on


def test_the_page_shows_the_choose_depth_it_ranks_on_and_names_a_tie():
    results = levers.from_exp_show(exp_show())
    results["machine"] = "test machine"
    for r in results["rows"]:
        r["choose_useful_depth"] = 5
    text = levers.page(results)
    assert "| useful depth / R | on choose |" in text
    assert "| trend-steps-180 | training tokens | 0.37 | 5 [5, 6] / 8 | 5 |" in text
    assert "Tied on `choose` with `trend-steps-180`" in text  # the default ranks first
    results["rows"][1]["choose_useful_depth"] = 4
    assert "Tied on" not in levers.page(results)


def test_one_new_lever_joins_the_committed_results_without_a_rerun(tmp_path, monkeypatch):
    """`levers add`: the stable-injection lever's finished run becomes a row beside the
    points measured on earlier commits, which keep theirs; a lever not run is refused."""
    e = levers.experiment("lever-stable")
    assert "++cells.backbone.model.inject=stable" in e.command(queue=False)
    finished = {"name": e.name, "executor": {"state": "success"},
                "revs": [{"rev": "mno", "data": rev(levers.with_overrides(RAW, e), conv(6.0))}]}
    results = {**levers.from_exp_show(exp_show()), "machine": "a CPU, 2 CPU cores"}
    monkeypatch.setattr(levers, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(levers, "PAGE", tmp_path / "depth.md")
    monkeypatch.setattr(levers, "FIGURE", tmp_path / "depth.png")
    levers.RESULTS.write_text(json.dumps(results))
    monkeypatch.setattr(levers, "_exp_show", lambda rev: exp_show())
    with pytest.raises(DataError, match="no finished `lever-stable`"):
        levers.add("lever-stable")
    monkeypatch.setattr(levers, "_exp_show", lambda rev: exp_show(extra=(finished,)))
    added = levers.add("lever-stable")
    assert [r["name"] for r in added["rows"]] == [r["name"] for r in results["rows"]] + [
        "lever-stable"]
    assert added["rows"][-1]["rev"] == "mno" and added["rows"][-1]["useful_depth"]["value"] == 6
    assert "stable injection (Parcae)" in levers.PAGE.read_text()
    again = levers.add("lever-stable")  # a rerun replaces its own row
    assert [r["name"] for r in again["rows"]].count("lever-stable") == 1
