"""Paper A's diagnostics: Lemma 1's radial fraction, Lemma 2's decomposition, the
scale clamp and the extract format."""

import copy

import numpy as np
import pytest
import torch
from conftest import tiny_model as model

from loopscope.diagnostics import (
    Timed,
    angular_step,
    clamp_effect,
    clamp_hook,
    decompose_update,
    depth_sweep,
    load_extract,
    norm_stats,
    radial_fraction,
    radial_fractions,
    throughput,
    update_metrics,
    write_extract,
)


def data(n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(0, 64, (n, 17), generator=g)
    return rows[:, :-1], rows[:, 1:]


@pytest.mark.parametrize("readout, low, high", [("normed", 0, 1e-5), ("raw", 1e-3, 1)])
def test_radial_fraction_on_a_random_model(readout, low, high):
    m = copy.deepcopy(model(readout=readout)).double()
    _, y = data()
    h = torch.randn(6, 16, 32, generator=torch.Generator().manual_seed(3)) * 5
    fraction = radial_fraction(m, h, y, last=False)
    assert low <= fraction < high


def test_radial_fraction_of_the_states_of_a_random_model(tmp_path):
    x, y = data()
    fractions = {}
    for readout in ("normed", "raw"):
        m = model(readout=readout)
        ext = write_extract(m, x, y, 4, tmp_path / readout, readout)
        fractions[readout] = radial_fractions(m, ext)
    # A fresh model's states are tiny (rms ~0.03), where RMSNorm's eps leaves a trace of
    # radial gradient; still well below the raw readout's. (Unit-scale states: above.)
    assert max(fractions["normed"]) < 1e-4
    assert max(fractions["normed"]) < min(fractions["raw"]) / 10


def test_update_decomposition_sums_back():
    rng = np.random.default_rng(0)
    prev, nxt = rng.normal(size=(50, 8)), rng.normal(size=(50, 8))
    radial, angular = decompose_update(prev, nxt)
    np.testing.assert_allclose(radial + angular, nxt - prev, atol=1e-12)
    np.testing.assert_allclose((angular * prev).sum(-1), 0, atol=1e-10)  # orthogonal to H
    # radial is parallel to H: no angle between them (or exactly opposite)
    norms = np.linalg.norm(radial, axis=-1) * np.linalg.norm(prev, axis=-1)
    cos = (radial * prev).sum(-1) / norms
    np.testing.assert_allclose(np.abs(cos), 1, atol=1e-10)


def test_angular_step_shrinks_with_scale():
    # the same residual branch added at a larger scale turns the direction less (Lemma 2)
    rng = np.random.default_rng(0)
    u = rng.normal(size=(100, 16))
    u /= np.linalg.norm(u, axis=-1, keepdims=True)
    b = rng.normal(size=(100, 16))
    steps = [angular_step(s * u, s * u + b).mean() for s in (10.0, 100.0, 1000.0)]
    assert steps[0] > steps[1] > steps[2]
    assert steps[1] / steps[2] == pytest.approx(10, rel=0.05)


def test_clamp_keeps_direction_and_sets_norm():
    hook = clamp_hook({})
    g = torch.Generator().manual_seed(0)
    h1 = torch.randn(2, 5, 8, generator=g)
    h2 = torch.randn(2, 5, 8, generator=g) * 40
    assert torch.equal(hook(1, h1), h1)
    clamped = hook(2, h2)
    torch.testing.assert_close(clamped.norm(dim=-1), h1.norm(dim=-1))
    cos = torch.nn.functional.cosine_similarity(clamped, h2, dim=-1)
    torch.testing.assert_close(cos, torch.ones_like(cos))


def test_clamp_effect_on_a_model_with_inter_loop_norm_is_nil():
    # with inter-loop norm every H_k already has the loop-1 scale: the clamp changes nothing
    x, y = data()
    for m, changes in ((model(inter_loop_norm=True), False), (model(readout="raw"), True)):
        unclamped = depth_sweep(m, x, y, batch_size=4)["ce_readout"]
        result = clamp_effect(m, x, y, 4, unclamped)
        assert result["ce_readout"]["k3"] == unclamped[2]
        assert (abs(result["delta_ce"]["k3"]) > 1e-6) == changes
        assert all(abs(v) < 1e-5 for v in result["delta_ce"].values()) != changes


def test_depth_sweep_reads_final_norm_both_ways():
    # a final_norm readout is raw before the last loop in training, normed as a last loop
    x, y = data()
    normed = depth_sweep(model(), x, y, batch_size=4)
    assert normed["ce_at_depth"] == normed["ce_readout"]
    both = depth_sweep(model(readout="final_norm"), x, y, batch_size=4)
    assert both["ce_at_depth"][2] == both["ce_readout"][2]  # the last loop: the same read
    assert both["ce_at_depth"][0] != both["ce_readout"][0]


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


def test_update_metrics_keys(tmp_path):
    x, y = data()
    ext = write_extract(model(), x, y, 4, tmp_path / "c", "c")
    metrics = update_metrics(ext)
    assert set(metrics["angular_step"]) == {"k1", "k2", "k3"}
    assert all(v > 0 for v in metrics["inv_scale"].values())


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
    assert all(v > 0 for cell in speeds.values() for v in cell.values())


def test_throughput_interleaves_cells_within_each_round():
    # every (cell, depth) pass once per round, all cells in a round before the next
    # round starts: cells are timed under the same load, close together in time
    calls = []

    class Recorder(torch.nn.Module):
        def __init__(self, name: str, inner: torch.nn.Module) -> None:
            super().__init__()
            self.name, self.inner, self.cfg = name, inner, inner.cfg

        def forward(self, x, loops, read, h0=None):
            calls.append((self.name, loops))
            return self.inner(x, loops=loops, read=read, h0=h0)

    x, _ = data(4)
    jobs = {n: Timed(Recorder(n, model()), x, 2) for n in ("a", "b")}
    throughput(jobs, batch_size=4, rounds=2)
    timed = calls[2:]  # after one warm-up call per cell
    assert timed == [("a", 1), ("a", 2), ("b", 1), ("b", 2)] * 2
