"""Readout recalibration: a known temperature and a known affine distortion of the
readout are recovered exactly; folds keep a unit's windows together; the share of the
gap is read only where there is a gap; a run on a model of the interface scores every
token out of fold, and past the logits it can hold fits the temperature on a sample."""


import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model, tiny_tokens
from torch import nn

from loopscope.base.errors import DataError, ParamsError
from loopscope.looped.interface import run_loops
from loopscope.looped.types import Cost
from loopscope.measure.per_loop import recalibrate
from loopscope.measure.per_loop.recalibrate import (
    Affine,
    RunRecalibration,
    cell_metrics,
    fit_affine,
    fit_temperature,
    folds_of,
    recalibrate_run,
)
from loopscope.measure.recalibrate_params import RecalibrateConfig
from loopscope.params import parse_params
from loopscope.tools import flops
from loopscope.weights.params import read_file


def test_a_known_temperature_is_recovered_exactly():
    torch.manual_seed(0)
    logits = torch.randn(4, 64, 50) * 3
    for t0 in (0.5, 1.0, 2.7):
        target = F.softmax(logits / t0, dim=-1)  # the CE's minimum sits at T = t0
        assert fit_temperature([logits[:2], logits[2:]], [target[:2], target[2:]]) == \
            pytest.approx(t0, rel=1e-4)


def test_a_known_affine_distortion_of_the_readout_is_recovered_exactly():
    """States z read through a raw head give the targets; the states handed to the fit
    are z distorted by a known invertible affine map, which the fit must undo. In
    float64, which the fit keeps (float32's CE cannot see the last digits)."""
    torch.manual_seed(1)
    d, vocab, f64 = 8, 40, torch.float64
    head = nn.Linear(d, vocab, bias=False).to(f64).requires_grad_(False)
    z = torch.randn(2, 128, d, dtype=f64)
    w0 = 0.3 * torch.randn(d, d, dtype=f64)
    b0 = 0.5 * torch.randn(d, dtype=f64)
    m = torch.eye(d, dtype=f64) + w0  # fit's map: h -> h + h W^T + b = h M^T + b
    h = (z - b0) @ torch.linalg.inv(m).T
    target = F.softmax(head(z), dim=-1)
    fitted = fit_affine(head, [h[:1], h[1:]], [target[:1], target[1:]], ridge=0.0,
                        iterations=500, temperature=1.0)
    # a raw head reads (h M^T + b) / T, so the map is recovered up to the temperature
    t = fitted.temperature
    assert torch.allclose((torch.eye(d, dtype=f64) + fitted.w) / t, m, atol=1e-4)
    assert torch.allclose(fitted.b / t, b0, atol=1e-4)
    assert torch.allclose(fitted.logits(head, h), head(z), atol=1e-4)
    # the ridge holds the map to the identity: a huge one leaves the readout as it was
    held = fit_affine(head, [h], [target], ridge=1e6, iterations=50)
    assert held.w.abs().max() < 1e-4 and held.b.abs().max() < 1e-4


def test_folds_keep_a_units_windows_together_and_need_enough_units():
    units = np.array([7, 7, 3, 3, 9, 1, 1])
    fold = folds_of(units, 2)
    for u in np.unique(units):
        assert len(set(fold[units == u])) == 1
    assert set(fold) == {0, 1}
    with pytest.raises(DataError, match="recalibrate.folds"):
        folds_of(np.array([4, 4, 4]), 2)


def _run(seed: int, gap: float, recovered: float, n_units: int = 40, per: int = 50
         ) -> RunRecalibration:
    """Two loops (R = 2): loop 1 reads `gap` nats worse than loop 2 on average (noisy
    per unit); the temperature recovers `recovered` of each token's gap."""
    rng = np.random.default_rng(seed)
    units = np.repeat(np.arange(n_units), per)
    final = 4 + rng.normal(0, 0.3, len(units))
    first = final + gap + np.repeat(rng.normal(0, 0.05, n_units), per)
    return RunRecalibration(seed, units, {1: first, 2: final},
                            {1: first - recovered * (first - final), 2: final},
                            {1: np.full(len(units), np.nan), 2: np.full(len(units), np.nan)},
                            {1: [1.0, 1.0], 2: [1.0, 1.0]}, fit_tokens=1000)


def test_the_share_of_the_gap_is_read_only_where_there_is_a_gap():
    cfg = RecalibrateConfig(bootstrap=200)
    clear = cell_metrics([_run(0, 0.2, 0.5), _run(1, 0.2, 0.5)], cfg, "c")
    first = clear["loops"]["1"]
    assert first["gap"]["lo"] > 0
    assert first["temperature"]["share"]["value"] == pytest.approx(0.5, rel=1e-6)
    assert "affine" not in first  # no affine fit at that loop: nothing reported
    assert set(clear["per_seed"]) == {"seed0", "seed1"}
    # no gap to speak of: the share is no measurement, and says so by its absence
    none = cell_metrics([_run(0, 0.0, 0.5)], cfg, "c")
    assert none["loops"]["1"]["gap"]["lo"] <= 0 <= none["loops"]["1"]["gap"]["hi"]
    assert none["loops"]["1"]["temperature"]["share"] is None
    assert none["loops"]["2"]["temperature"]["share"] is None  # loop R has no gap


def test_a_run_scores_every_token_out_of_fold_through_the_interface():
    model = tiny_model(loops=3)
    x = tiny_tokens(b=8)
    y = torch.roll(x, -1, dims=1)
    initial, hs = run_loops(model, x, 3)
    states = torch.stack([initial, *hs]).flatten(1, 2).detach().numpy()
    cfg = RecalibrateConfig(iterations=3, bootstrap=100, batch_size=3)
    units = np.array([0, 0, 1, 1, 2, 3, 3, 4])
    run = recalibrate_run(model, states, y, units, 42, cfg)
    assert sorted(run.ce) == [1, 2, 3]
    assert cfg.affine_loops(3) == [1, 2]  # shares 0 and 0.5 of R = 3
    for k in (1, 2, 3):
        with torch.no_grad():
            own = F.cross_entropy(model.read(hs[k - 1], k == 3).flatten(0, 1), y.flatten(),
                                  reduction="none").double().numpy()
        np.testing.assert_allclose(run.ce[k], own, rtol=1e-5)
        assert np.isfinite(run.temperature[k]).all()
        assert np.isfinite(run.affine[k]).all() == (k in (1, 2))
    assert run.fit_tokens == 4 * 16  # units 1, 3 (or 0, 2, 4): 4 windows of 8 each way
    table = run.table()
    assert len(table) == 3 * 8 * 16 and set(table["loop"]) == {1, 2, 3}
    with pytest.raises(DataError, match="extract stage"):
        recalibrate_run(model, states[:2], y, units, 42, cfg)


def test_logits_too_large_to_hold_fit_the_temperature_on_the_windows_that_fit(monkeypatch):
    """Past LOGITS_BYTES (an outside model's 65k ids over the extract's windows) no
    loop's logits are held: every token is still scored, the same as when held, and each
    fold's temperature is fitted on as many of its fitting windows as fit, evenly
    spaced, never on a window it scores; the metrics say on how many tokens."""
    model = tiny_model(loops=2)
    x = tiny_tokens(b=6)
    y = torch.roll(x, -1, dims=1)
    initial, hs = run_loops(model, x, 2)
    states = torch.stack([initial, *hs]).flatten(1, 2).detach().numpy()
    cfg = RecalibrateConfig(iterations=3, bootstrap=100, batch_size=4, affine_at=[0.0])
    units = np.array([0, 1, 1, 2, 3, 3])
    held = recalibrate_run(model, states, y, units, 42, cfg)
    assert "temperature_fit_tokens" not in cell_metrics([held], cfg, "c")
    monkeypatch.setattr(recalibrate, "LOGITS_BYTES", 16 * 64 * 4)  # one window's logits
    again = recalibrate_run(model, states, y, units, 42, cfg)
    fold = folds_of(units, 2)
    for k in (1, 2):
        np.testing.assert_allclose(again.ce[k], held.ce[k], rtol=1e-6)
        assert np.isfinite(again.temperature[k]).all()
        logits = recalibrate.LoopLogits(lambda z, last=k == 2: model.read(z, last),
                                        hs[k - 1].detach(), 4)
        assert logits.held is None
        for f in range(2):
            rows = logits.sample(fold != f)
            assert rows.sum() == 1 and not (rows & (fold == f)).any()
            own = fit_temperature(logits.batches(rows), list(y[torch.from_numpy(rows)].split(4)))
            assert again.temperatures[k][f] == pytest.approx(own, rel=1e-6)
    assert np.isfinite(again.affine[1]).all()
    assert cell_metrics([again], cfg, "c")["temperature_fit_tokens"] == 16


def test_plan_prices_the_reads_where_the_logits_are_not_held():
    """Past LOGITS_BYTES every loop is read again to score the folds, and each fold's
    temperature sample once: plan prices those reads."""
    params = parse_params(read_file("params.yaml"))
    c, t, k = Cost(prelude=0.0, loop=1.0, readout=1.0), 128, 4
    windows, folds = params.extract.val_sequences, params.recalibrate.folds
    held = recalibrate.LOGITS_BYTES // (4 * windows * t)  # the largest vocabulary held
    base = flops.recalibrate_flops(params, c, t, k)
    assert flops.recalibrate_flops(params, c, t, k, held) == base
    vocab = recalibrate.LOGITS_BYTES // (4 * t) // 8  # 8 windows' logits fit
    reads = k + k * folds * 8 / windows
    assert flops.recalibrate_flops(params, c, t, k, vocab) == pytest.approx(
        base + windows * t * reads)


def test_recalibrate_cells_and_values_are_checked_by_name():
    raw = read_file("params.yaml")
    raw["recalibrate"] = {**raw["recalibrate"], "cells": ["perloop_nromed"]}
    with pytest.raises(ParamsError, match="recalibrate.cells.*perloop_normed"):
        parse_params(raw)
    raw["recalibrate"] = {**raw["recalibrate"], "cells": [], "folds": 1}
    with pytest.raises(ParamsError, match="folds"):
        parse_params(raw)


def test_the_affine_readout_nests_the_temperature():
    head = nn.Linear(4, 6, bias=False)
    h = torch.randn(1, 5, 4)
    assert torch.allclose(Affine(2.0).logits(head, h), head(h) / 2.0)
