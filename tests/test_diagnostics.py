"""Paper A's diagnostics: Lemma 1's radial fraction, Lemma 2's decomposition, the
scale clamp and the extract format."""


import numpy as np
import pandas as pd
import pytest
import torch
from conftest import TINY
from conftest import tiny_model as model

from loopscope.base.errors import DataError
from loopscope.measure.per_loop.clamp import (
    CLAMP_MODES,
    Clamped,
    clamp_headline,
    clamp_hook,
    clamp_metrics,
    clamp_run,
    clamped_ce,
    unclamped_ce,
)
from loopscope.measure.per_loop.extract import load_extract, write_extract
from loopscope.measure.per_loop.sweep import (
    angular_step,
    diagnose_headline,
    float64_reader,
    lemma2_slope,
    measure,
    norm_stats,
    pool_runs,
    radial_cosines,
    summarize,
    summarize_runs,
    sweep_means,
)
from loopscope.measure.per_loop.throughput import Timed, throughput
from loopscope.stats.units import Units
from loopscope.weights.model import LoopedLM, loop_ce


def data(n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(0, 64, (n, 17), generator=g)
    return rows[:, :-1], rows[:, 1:]


def states(scale: float = 5.0) -> torch.Tensor:
    return torch.randn(6, 16, 32, generator=torch.Generator().manual_seed(3)) * scale


@pytest.mark.parametrize("readout, low, high", [("normed", 0, 1e-5), ("raw", 1e-3, 1)])
def test_radial_fraction_on_a_random_model(readout, low, high):
    m = float64_reader(model(readout=readout))
    _, y = data()
    per_token, batch = radial_cosines(m, states(), y, last=False)
    assert per_token.shape == (6 * 16,)
    assert low <= batch < high
    assert low <= per_token.mean().item() < high


def test_normed_radial_fraction_is_the_eps_floor():
    # RMSNorm's eps leaves eps / (||H||^2/d + eps) of radial gradient; with eps = 0 only
    # float64 round-off is left, so the normed value measures eps, not the lemma
    m = float64_reader(model())
    _, y = data()
    h = states(0.05)  # small states: the floor is large enough to see
    cos, _ = radial_cosines(m, h, y, last=False)
    floor = m.norm_out.eps / (h.double().pow(2).sum(-1) / 32 + m.norm_out.eps)
    assert (cos <= 2 * floor.flatten()).all() and cos.mean() > 1e-4 * floor.mean()
    m.norm_out.eps = 0.0
    assert radial_cosines(m, h, y, last=False)[0].max() < 1e-12


def test_angular_step_shrinks_with_scale():
    # the same residual branch added at a larger scale turns the direction less (Lemma 2)
    g = torch.Generator().manual_seed(0)
    u = torch.randn(100, 16, generator=g)
    u /= u.norm(dim=-1, keepdim=True)
    b = torch.randn(100, 16, generator=g)
    steps = [angular_step(s * u, s * u + b).mean().item() for s in (10.0, 100.0, 1000.0)]
    assert steps[0] > steps[1] > steps[2]
    assert steps[1] / steps[2] == pytest.approx(10, rel=0.05)


def test_freeze_clamp_keeps_direction_and_sets_norm():
    hook = clamp_hook("freeze_loop1")
    g = torch.Generator().manual_seed(0)
    h1 = torch.randn(2, 5, 8, generator=g)
    h2 = torch.randn(2, 5, 8, generator=g) * 40
    assert torch.equal(hook(1, h1), h1)
    clamped = hook(2, h2)
    torch.testing.assert_close(clamped.norm(dim=-1), h1.norm(dim=-1))
    cos = torch.nn.functional.cosine_similarity(clamped, h2, dim=-1)
    torch.testing.assert_close(cos, torch.ones_like(cos))


def test_remove_radial_clamp_leaves_only_the_turn():
    hook = clamp_hook("remove_radial")
    g = torch.Generator().manual_seed(0)
    h1, h2, h3 = (torch.randn(2, 5, 8, generator=g) * s for s in (1, 3, 9))
    hook(1, h1)
    a = hook(2, h2)
    torch.testing.assert_close(((a - h1) * h1).sum(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
    b = hook(3, h3)  # the next update is taken from the clamped state
    torch.testing.assert_close(((b - a) * a).sum(-1), torch.zeros(2, 5), atol=1e-4, rtol=0)


@pytest.mark.parametrize("mode", ["freeze_loop1", "remove_radial"])
def test_clamp_changes_ce_only_where_the_readout_sees_scale(mode):
    # a normed readout with inter-loop norm sees neither the stored scale nor (through
    # the norm) does the next loop: freeze_loop1 changes nothing; a raw readout changes
    x, y = data()
    m = model(inter_loop_norm=True)
    out = m(x, read="none")
    plain = np.stack([loop_ce(m.read(h, last=k == 3), y).item() for k, h in
                      enumerate(out.states, 1)])
    raw = clamped_ce(model(readout="raw"), x, y, 4, mode)
    base_raw = clamped_ce(model(readout="raw"), x, y, 4, mode)
    assert raw.shape == (3, 6 * 16)
    np.testing.assert_array_equal(raw, base_raw)  # deterministic
    ce = clamped_ce(m, x, y, 4, mode)
    np.testing.assert_allclose(ce[0].mean(), plain[0], rtol=1e-5)  # loop 1 never clamped
    if mode == "freeze_loop1":
        np.testing.assert_allclose(ce.mean(axis=1), plain, rtol=1e-4)
    unclamped_raw = model(readout="raw")(x, read="none")
    raw_ce = loop_ce(model(readout="raw").read(unclamped_raw.states[2], last=True), y).item()
    assert abs(raw[2].mean() - raw_ce) > 1e-6


def test_measure_tables_agree_with_the_forward_pass():
    x, y = data()
    m = model(readout="final_norm")
    docs = np.array([0, 0, 1, 1, 2, 2])
    got = measure(m, x, y, docs, 4, sweep_depth=7)
    out = m(x, read="none")
    t = got.tokens
    assert len(t) == 6 * 16 and (t["doc"].to_numpy() == np.repeat(docs, 16)).all()
    assert {f"{n}_{k}" for n in ("ce", "norm", "cos", "floor", "step") for k in (1, 2, 3)} \
        <= set(t.columns) and "norm_0" in t.columns and "ce_4" not in t.columns
    # each loop through its own readout: raw before the last loop of a final_norm cell
    assert t["ce_1"].mean() == pytest.approx(loop_ce(m.read(out.states[0], last=False), y)
                                             .item(), rel=1e-5)
    assert t["ce_3"].mean() == pytest.approx(loop_ce(m.read(out.states[2], last=True), y)
                                             .item(), rel=1e-5)
    np.testing.assert_allclose(t["norm_2"], out.states[1].norm(dim=-1).flatten().detach(),
                               rtol=1e-5)
    sweep = got.sweep
    assert list(sweep["doc"]) == [0, 1, 2] and (sweep["tokens"] == 32).all()
    assert "scale_7" in sweep.columns and "scale_8" not in sweep.columns
    means = sweep_means(sweep)
    assert means.index.tolist() == list(range(1, 8))
    assert means.loc[3, "ce"] == pytest.approx(t["ce_3"].mean(), rel=1e-6)
    metrics = summarize(got)
    assert set(metrics["ppl_at_depth"]) == {"k1", "k2", "k3"}
    assert metrics["lemma2"]["sweep_depth"] == 7
    assert len(got.radial_batch) == 3


def test_lemma2_slope_finds_one_over_scale():
    scale = np.geomspace(1, 1000, 30)
    step = np.r_[5.0, 2.0 / scale[:-1]]  # step_k = 2 / s_k-1; loop 1 from H_0 ignored
    means = pd.DataFrame({"scale": scale, "step": step}, index=pd.RangeIndex(1, 31))
    assert lemma2_slope(means) == pytest.approx(-1.0)
    flat = means.assign(step=0.1)
    assert lemma2_slope(flat) == pytest.approx(0.0, abs=1e-9)


def test_extract_round_trips(tmp_path):
    x, y = data()
    m = model()
    ext = write_extract(m, x, y, 4, tmp_path / "cell", "cell")
    again = load_extract(tmp_path / "cell")
    assert again.states.shape == (4, 6 * 16, 32) and again.states.dtype == np.float32
    out = m(x)
    np.testing.assert_allclose(again.states[0], out.initial.flatten(0, 1).detach().numpy())
    np.testing.assert_allclose(again.states[3], out.states[2].flatten(0, 1).detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    table = again.table
    assert list(table.columns) == ["seq", "position", "token_id", "target_id", "loop", "norm"]
    row = table[(table.loop == 2) & (table.seq == 1) & (table.position == 3)].iloc[0]
    assert row.token_id == x[1, 3] and row.target_id == y[1, 3]
    assert row.norm == pytest.approx(out.states[1][1, 3].norm().item(), rel=1e-5)
    assert ext.meta == again.meta
    assert not list((tmp_path / "cell").glob(".*tmp"))


def test_truncated_extract_is_detected(tmp_path):
    x, y = data()
    write_extract(model(), x, y, 4, tmp_path / "cell", "cell")
    np.save(tmp_path / "cell" / "states.npy", np.zeros((2, 3, 4), dtype=np.float32))
    with pytest.raises(Exception, match="do not match meta.json"):
        load_extract(tmp_path / "cell")


def test_norm_stats_tail():
    norms = np.ones(1000)
    norms[:5] = 100.0
    stats = norm_stats(norms)
    assert stats["median"] == 1.0 and stats["max"] == 100.0
    assert stats["share_above_10x_median"] == pytest.approx(0.005)


def test_throughput_times_every_cell_at_every_depth():
    x, _ = data()
    jobs = {"a": Timed(model(), x, 3), "b": Timed(model(readout="raw"), x[:2], 2)}
    speeds = throughput(jobs, batch_size=4, rounds=3)
    assert set(speeds) == {"a", "b"}
    assert set(speeds["a"]) == {"k1", "k2", "k3"} and set(speeds["b"]) == {"k1", "k2"}
    assert all(len(v) == 3 and min(v) > 0 for cell in speeds.values() for v in cell.values())


def test_throughput_interleaves_cells_within_each_round():
    # every (cell, depth) pass once per round, all cells in a round before the next
    # round starts: cells are timed under the same load, close together in time
    calls = []

    class Recorder(torch.nn.Module):
        """The model through the looped-model interface, noting the loops of each pass."""

        def __init__(self, name: str, inner: torch.nn.Module) -> None:
            super().__init__()
            self.name, self.inner, self.steps = name, inner, 0

        def inputs(self, x):
            self.steps = 0
            return self.inner.inputs(x)

        def initial_state(self, e, generator=None):
            return self.inner.initial_state(e, generator)

        def carry(self, h, first=False):
            return self.inner.carry(h, first)

        def step(self, h, e, kvs=None, k=None, positions=None):
            self.steps += 1
            return self.inner.step(h, e, kvs, k, positions)

        def read(self, h, last, positions=None):
            calls.append((self.name, self.steps))
            return self.inner.read(h, last)

    x, _ = data(4)
    jobs = {n: Timed(Recorder(n, model()), x, 2) for n in ("a", "b")}
    throughput(jobs, batch_size=4, rounds=2)
    timed = calls[2:]  # after one warm-up call per cell
    assert timed == [("a", 1), ("a", 2), ("b", 1), ("b", 2)] * 2


def two_seeds() -> list:
    """The depth sweep of two differently initialized models on the same windows, each
    named as a seed of one cell (Measured.of_run)."""
    x, y = data()
    docs = np.array([0, 0, 1, 1, 2, 2])
    units = Units(docs, "document")
    first = measure(model(), x, y, docs, 4, sweep_depth=5).of_run(42, units)
    torch.manual_seed(1)
    other = LoopedLM(TINY).eval()
    return [first, measure(other, x, y, docs, 4, sweep_depth=5).of_run(43, units)]


def test_of_run_puts_the_seed_first_without_touching_the_measurements():
    x, y = data()
    docs = np.array([0, 0, 1, 1, 2, 2])
    m = measure(model(), x, y, docs, 4, sweep_depth=5)
    seeded = m.of_run(7, Units(docs, "document"))
    assert "seed" not in m.tokens.columns and m.units is None
    for table in (seeded.tokens, seeded.sweep):
        assert table.columns[0] == "seed" and (table["seed"] == 7).all()
    pd.testing.assert_frame_equal(seeded.tokens.drop(columns="seed"), m.tokens)
    assert seeded.units.describe() == {"unit": "document", "units": 3}


def test_pooled_runs_keep_every_row_and_average_the_batch_radial_fraction():
    runs = two_seeds()
    pooled = pool_runs(runs)
    assert pooled.tokens["seed"].tolist() == [42] * 96 + [43] * 96
    assert pooled.sweep["seed"].tolist() == [42] * 3 + [43] * 3
    assert pooled.radial_batch == pytest.approx(
        [(a + b) / 2 for a, b in zip(*(m.radial_batch for m in runs), strict=True)])


def test_summarize_runs_pools_the_seeds_and_gives_their_spread():
    runs = two_seeds()
    metrics, pooled = summarize_runs(runs)
    assert metrics["ppl_at_depth"] == summarize(pooled)["ppl_at_depth"]
    each = [summarize(m)["ppl_at_depth"]["k3"] for m in runs]
    assert each[0] != each[1]
    assert metrics["ppl_at_depth_sd"]["k3"] == pytest.approx(abs(each[0] - each[1]) / 2)
    assert metrics["seeds"] == 2 and metrics["val_tokens"] == 96  # one run's windows
    assert (metrics["unit"], metrics["units"]) == ("document", 3)
    same, _ = summarize_runs([runs[0], runs[0]])
    assert same["norm_mean_sd"] == {k: 0.0 for k in same["norm_mean"]}
    plain = measure(model(), *data(), np.zeros(6, np.int64), 4, sweep_depth=5)
    with pytest.raises(ValueError, match="of_run"):
        summarize_runs([plain])


def test_diagnose_headline_reads_the_training_depth():
    metrics, _ = summarize_runs(two_seeds())
    line = diagnose_headline(metrics)
    assert line.startswith(f"ppl at K=3 {metrics['ppl_at_depth']['k3']:.1f}, ")
    assert "over 5 loops" in line and line.endswith("(2 seeds, 3 units: document)")


def test_unclamped_ce_is_the_seeds_rows_of_the_diagnose_table():
    docs = np.repeat([0, 1], 3)
    tokens = pd.DataFrame({"seed": [42] * 6 + [43] * 6, "doc": np.tile(docs, 2),
                           "ce_1": np.arange(12.0), "ce_2": np.arange(12.0) + 100})
    got = unclamped_ce(tokens, 43, docs, 2, "cell")
    np.testing.assert_array_equal(got, [np.arange(6.0, 12), np.arange(106.0, 112)])
    with pytest.raises(DataError, match=r"tables/diagnose/cell.parquet: its seed 42 .*"
                                        r"diagnose@cell"):
        unclamped_ce(tokens, 42, docs[::-1], 2, "cell")
    with pytest.raises(DataError):
        unclamped_ce(tokens, 44, docs, 2, "cell")


def test_clamp_run_is_the_change_from_the_unclamped_ce():
    x, y = data()
    m = model(readout="raw")
    docs = np.repeat(np.arange(6), 16)
    base = clamped_ce(m, x, y, 4, "freeze_loop1")
    run = clamp_run(m, x, y, None, 4, base, 42, docs)
    assert set(run.delta) == set(CLAMP_MODES) and run.seed == 42
    np.testing.assert_array_equal(run.delta["freeze_loop1"], np.zeros_like(base))
    np.testing.assert_array_equal(run.delta["remove_radial"],
                                  clamped_ce(m, x, y, 4, "remove_radial") - base)


def test_clamp_metrics_pool_the_seeds_per_loop_and_bound_the_last_loop():
    rng = np.random.default_rng(0)
    docs = np.repeat(np.arange(20), 10)
    runs = [Clamped(seed, docs, {mode: rng.normal(shift, 0.1, (3, 200)) + [[0], [0], [1]]
                                 for mode in CLAMP_MODES})
            for seed, shift in ((42, 0.0), (43, 0.5))]
    m = clamp_metrics(runs, 200)
    for mode in CLAMP_MODES:
        pooled = np.concatenate([r.delta[mode] for r in runs], axis=1)
        assert list(m[mode]["delta_ce"]) == ["k1", "k2", "k3"]
        assert m[mode]["delta_ce"]["k3"] == pytest.approx(pooled[2].mean())
        assert m[mode]["delta_ce"]["k3"] == pytest.approx(1.25, abs=0.05)  # both seeds
        last = m[mode]["delta_ce_last"]
        assert last["lo"] < last["value"] < last["hi"]
        assert last["value"] == pytest.approx(pooled[2].mean())
    assert clamp_headline(m) == "final-loop delta CE " + ", ".join(
        f"{mode} {m[mode]['delta_ce']['k3']:+.4f}" for mode in CLAMP_MODES)
