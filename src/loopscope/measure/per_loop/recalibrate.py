"""Readout recalibration (Depth Control Protocol, arXiv 2609.19934): how much of the CE
gap between loop r and depth R a recalibrated readout of loop r's state recovers.

Paper A's question from the other side. Where a model reads worse at loop r than at R,
either the state of loop r lacks what loop R's holds, or it holds it and the readout
cannot see it. A readout refitted on loop r's states, the model frozen, tells the two
apart: what it recovers was in the state all along.

Two recalibrations, both read through the model's own readout (`read`: the coda, the
readout's norm and the head), so every model of the looped-model interface gets them:
- a temperature: logits / T, one number per loop;
- an affine readout: the state mapped to h + h W^T + b before the readout, with the
  temperature refitted beside it (so it nests the temperature), W and b held to zero by
  a ridge penalty (recalibrate.ridge): d^2 + d numbers fitted on a few thousand tokens
  would otherwise learn the fitting documents' vocabulary rather than the readout.

Every fit is scored on windows it never saw: the windows' resampling units (documents)
are dealt into recalibrate.folds folds, each fold is scored by the fit on the others,
so every token has an out-of-fold CE and the intervals resample the same units (and
seeds) as every other interval. The states are the extract's (extracts/<cell>/: H_1 ..
H_R of extract.val_sequences windows), read, not recomputed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from loopscope.base.errors import DataError
from loopscope.looped.interface import LoopedModel
from loopscope.measure.recalibrate_params import RecalibrateConfig
from loopscope.stats.intervals import Documents, Interval, Sample
from loopscope.weights.model import token_ce

# One loop's float32 logits over the windows are held for the temperature's fits up to
# this size; beyond it (an outside model's vocabulary) the temperature is fitted on the
# windows whose logits fit in it (LoopLogits)
LOGITS_BYTES = 4 * 2**30
Read = Callable[[Tensor], Tensor]  # states (B, T, d) -> logits (B, T, V)


@dataclass
class Affine:
    """h -> h + h W^T + b, then the readout, then / T (w, b None: the temperature alone)."""

    temperature: float = 1.0
    w: Tensor | None = None
    b: Tensor | None = None

    def logits(self, read: Read, h: Tensor) -> Tensor:
        if self.w is not None and self.b is not None:
            hw = h.to(self.w.dtype)
            h = (hw + hw @ self.w.T + self.b).to(h.dtype)
        return read(h).to(torch.promote_types(h.dtype, torch.float32)) / self.temperature


def _ce_sum(logits: Tensor, target: Tensor) -> Tensor:
    """The summed CE of logits (..., V) against ids (...) or probabilities (..., V)."""
    if target.dtype.is_floating_point:
        return F.cross_entropy(logits.flatten(0, -2), target.flatten(0, -2), reduction="sum")
    return F.cross_entropy(logits.flatten(0, -2), target.flatten(), reduction="sum")


def _tokens(targets: list[Tensor]) -> int:
    return sum(int(t.shape[:-1].numel() if t.dtype.is_floating_point else t.numel())
               for t in targets)


def fit_temperature(logits: list[Tensor], targets: list[Tensor], iterations: int = 50
                    ) -> float:
    """The T minimizing the mean CE of logits / T over the batches (logits (B, T, V);
    targets: ids (B, T), or probabilities (B, T, V), whose CE a known temperature
    minimizes exactly). Fitted in log T, so T stays positive."""
    n = _tokens(targets)
    log_t = torch.zeros((), requires_grad=True)
    opt = torch.optim.LBFGS([log_t], max_iter=iterations, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        loss = sum(_ce_sum(lg * torch.exp(-log_t), t) for lg, t in zip(logits, targets,
                                                                        strict=True)) / n
        loss.backward()
        return loss

    opt.step(closure)
    return float(log_t.detach().exp())


def fit_affine(read: Read, states: list[Tensor], targets: list[Tensor], ridge: float,
               iterations: int, temperature: float = 1.0) -> Affine:
    """W, b and T minimizing the mean CE of the affine readout (Affine) over the batches
    (states (B, T, d); targets as fit_temperature's) plus ridge x (||W||^2 + ||b||^2),
    from the identity map at temperature `temperature`. The model is not trained: read's
    parameters take no gradient."""
    d = states[0].shape[-1]
    n = _tokens(targets)
    wide = torch.promote_types(states[0].dtype, torch.float32)  # float64 states fit so
    w = torch.zeros(d, d, dtype=wide, requires_grad=True)
    b = torch.zeros(d, dtype=wide, requires_grad=True)
    log_t = torch.tensor(float(np.log(temperature)), dtype=wide, requires_grad=True)
    opt = torch.optim.LBFGS([w, b, log_t], max_iter=iterations, history_size=20,
                            tolerance_grad=1e-9, tolerance_change=1e-12,
                            line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        total = ridge * (w.square().sum() + b.square().sum())
        total.backward()
        for h, t in zip(states, targets, strict=True):
            hw = h.to(wide)
            lg = read((hw + hw @ w.T + b).to(h.dtype)).to(wide) * torch.exp(-log_t)
            loss = _ce_sum(lg, t) / n
            loss.backward()
            total = total + loss.detach()
        return total

    opt.step(closure)
    return Affine(float(log_t.detach().exp()), w.detach(), b.detach())


def folds_of(units: np.ndarray, folds: int) -> np.ndarray:
    """Each window's fold, from its resampling unit: the units, in sorted order, dealt
    round-robin, so a unit's windows share a fold and every fold spans the split."""
    ids, inverse = np.unique(units, return_inverse=True)
    if len(ids) < folds:
        raise DataError(f"{len(ids)} resampling units cannot fill recalibrate.folds = "
                        f"{folds} folds; raise extract.val_sequences or lower the folds.")
    return inverse % folds


@dataclass
class RunRecalibration:
    """One run's out-of-fold CE per loop and token (reading order, float64), with the
    fits behind it: ce (the readout as trained), temperature and affine (NaN where no
    affine readout was fitted), and per loop the fitted temperatures (one per fold)."""

    seed: int
    units: np.ndarray  # each token's resampling unit
    ce: dict[int, np.ndarray]
    temperature: dict[int, np.ndarray]
    affine: dict[int, np.ndarray]
    temperatures: dict[int, list[float]] = field(default_factory=dict)
    fit_tokens: int = 0  # tokens the smallest fit was fitted on
    # tokens the smallest temperature fit was fitted on: fewer than fit_tokens where one
    # loop's logits over the windows do not fit in LOGITS_BYTES (LoopLogits.sample)
    temperature_tokens: int = 0

    def table(self) -> pd.DataFrame:
        """A row per loop and token: seed, unit, loop, and the three CEs."""
        return pd.concat([pd.DataFrame({
            "seed": np.int32(self.seed), "unit": self.units, "loop": np.int16(k),
            "ce": self.ce[k], "ce_temperature": self.temperature[k],
            "ce_affine": self.affine[k]}) for k in sorted(self.ce)], ignore_index=True)


def _batches(t: Tensor, rows: np.ndarray, size: int) -> list[Tensor]:
    idx = torch.from_numpy(np.flatnonzero(rows))
    return [t[idx[i:i + size]] for i in range(0, len(idx), size)]


class LoopLogits:
    """One loop's logits (float32) over the windows, by batch of windows: held, read
    once, where they fit in LOGITS_BYTES. Beyond it (an outside model's 65k ids over the
    extract's windows) none are held: scoring reads them batch by batch, and the
    temperature, one number, is fitted on the held logits of as many of the fitting
    windows as fit, evenly spaced over them (sample)."""

    def __init__(self, read: Read, h: Tensor, batch_size: int) -> None:
        self.read, self.h, self.size = read, h, batch_size
        with torch.no_grad():
            self.window_bytes = h.shape[1] * read(h[:1]).shape[-1] * 4
        self.held: Tensor | None = None
        if h.shape[0] * self.window_bytes <= LOGITS_BYTES:
            with torch.no_grad():
                self.held = torch.cat([read(b).float() for b in h.split(batch_size)])

    def sample(self, rows: np.ndarray) -> np.ndarray:
        """The windows the temperature is fitted on: rows where the logits are held, else
        as many of rows as LOGITS_BYTES holds, evenly spaced over them."""
        if self.held is not None:
            return rows
        idx = np.flatnonzero(rows)
        keep = max(1, min(len(idx), LOGITS_BYTES // self.window_bytes))
        out = np.zeros_like(rows)
        out[idx[np.linspace(0, len(idx) - 1, keep).round().astype(int)]] = True
        return out

    def batches(self, rows: np.ndarray) -> list[Tensor]:
        """The logits of the rows' windows by batch: of those held, else read now (rows:
        a sample's, whose logits fit)."""
        if self.held is not None:
            return _batches(self.held, rows, self.size)
        with torch.no_grad():
            return [self.read(b).float() for b in _batches(self.h, rows, self.size)]

    def token_ce(self, rows: np.ndarray, y: Tensor, temperature: float = 1.0
                 ) -> np.ndarray:
        """Per-token CE (reading order, float64) of the rows' windows, at temperature."""
        pick = torch.from_numpy(rows)
        if self.held is not None:
            return _token_ce(self.held[pick] / temperature, y[pick])
        with torch.no_grad():
            return np.concatenate([
                _token_ce(self.read(b).float() / temperature, t) for b, t in
                zip(_batches(self.h, rows, self.size), _batches(y, rows, self.size),
                    strict=True)])


def recalibrate_run(model: LoopedModel, states: np.ndarray, y: Tensor, units: np.ndarray,
                    seed: int, cfg: RecalibrateConfig) -> RunRecalibration:
    """Out-of-fold recalibration of one run at every loop 1 .. R (model.loops). states:
    the extract's (loops + 1, windows x T, d), H_0 first; y: the windows' targets
    (windows, T); units: each window's resampling unit."""
    r, (n, t) = model.loops, y.shape
    if states.shape[0] < r + 1 or states.shape[1] != n * t:
        raise DataError(f"the extract holds {states.shape[0] - 1} loops of "
                        f"{states.shape[1]} tokens; recalibrating needs {r} loops of "
                        f"{n} x {t}: rerun the extract stage (`dvc repro`).")
    for p in model.parameters():
        p.requires_grad_(False)
    dtype = next(model.parameters()).dtype
    device = y.device
    fold = folds_of(units, cfg.folds)
    affine_at = cfg.affine_loops(r)
    out = RunRecalibration(seed, np.repeat(units, t), {}, {}, {})
    out.fit_tokens = min(int((fold != f).sum()) * t for f in range(cfg.folds))
    out.temperature_tokens = out.fit_tokens
    for k in range(1, r + 1):
        h = torch.from_numpy(np.array(states[k], dtype=np.float32)).view(n, t, -1)
        h = h.to(device=device, dtype=dtype)

        def read(z: Tensor, last: bool = k == r) -> Tensor:
            return model.read(z, last)

        logits = LoopLogits(read, h, cfg.batch_size)
        trained = logits.token_ce(np.ones(n, dtype=bool), y)
        scaled, mapped = np.empty(n * t), np.full(n * t, np.nan)
        out.temperatures[k] = []
        for f in range(cfg.folds):
            fit, score = fold != f, fold == f
            sample = logits.sample(fit)
            temp = fit_temperature(logits.batches(sample), _batches(y, sample, cfg.batch_size))
            out.temperature_tokens = min(out.temperature_tokens, int(sample.sum()) * t)
            out.temperatures[k].append(temp)
            tokens = np.repeat(score, t)
            scaled[tokens] = logits.token_ce(score, y, temp)
            if k in affine_at:
                fitted = fit_affine(read, _batches(h, fit, cfg.batch_size),
                                    _batches(y, fit, cfg.batch_size), cfg.ridge,
                                    cfg.iterations, temp)
                with torch.no_grad():  # batch by batch: one batch's logits at a time
                    mapped[tokens] = np.concatenate([
                        _token_ce(fitted.logits(read, b), yb) for b, yb in
                        zip(_batches(h, score, cfg.batch_size),
                            _batches(y, score, cfg.batch_size), strict=True)])
        out.ce[k], out.temperature[k], out.affine[k] = trained, scaled, mapped
    return out


def _token_ce(logits: Tensor, y: Tensor) -> np.ndarray:
    """Per-token CE (reading order, float64) of logits (n, T, V) against y (n, T)."""
    return token_ce(logits.flatten(0, 1), y.flatten()).double().cpu().numpy()


def _sample(runs: list[RunRecalibration], resamples: int, key: str) -> Sample:
    docs = np.concatenate([run.units for run in runs])
    seeds = (np.concatenate([np.full(len(run.units), run.seed) for run in runs])
             if len(runs) > 1 else None)
    return Sample(Documents(docs, resamples), docs, seeds, key)


def _recovered(sample: Sample, gap: np.ndarray, gain: np.ndarray,
               gap_clear: bool) -> dict[str, Any]:
    """What a recalibration recovers: nats (mean CE gain, out of fold) and, where the
    gap to depth R is clearly above zero (its interval's lower end), its share of the
    gap; None where the gap is not: a share of nothing is no measurement."""
    out: dict[str, Any] = {"nats": sample.interval(sample.mean(gain)).to_dict(), "share": None}
    if gap_clear:
        out["share"] = sample.interval(sample.total(gain) / sample.total(gap)).to_dict()
    return out


def summarize(runs: list[RunRecalibration], cfg: RecalibrateConfig, key: str = ""
              ) -> dict[str, Any]:
    """Per loop, pooled over the runs (and seeds' intervals resampled too): the mean CE
    as trained, with the temperature and with the affine readout; the gap to depth R as
    trained; what each recalibration recovers, in nats and as a share of the gap; and
    the temperatures fitted. The fits' sizes are recorded beside them."""
    sample = _sample(runs, cfg.bootstrap, key)
    r = max(runs[0].ce)
    final = np.concatenate([run.ce[r] for run in runs])
    loops = {}
    for k in sorted(runs[0].ce):
        ce, temp, aff = (np.concatenate([getattr(run, name)[k] for run in runs])
                         for name in ("ce", "temperature", "affine"))
        gap = ce - final
        gap_iv = sample.interval(sample.mean(gap))
        clear = k < r and gap_iv.lo > 0
        row: dict[str, Any] = {
            "ce": float(ce.mean()), "ce_temperature": float(temp.mean()),
            "gap": gap_iv.to_dict(),
            "temperatures": [t for run in runs for t in run.temperatures[k]],
            "temperature": _recovered(sample, gap, ce - temp, clear)}
        if not np.isnan(aff).any():
            row["ce_affine"] = float(aff.mean())
            row["affine"] = _recovered(sample, gap, ce - aff, clear)
        loops[str(k)] = row
    out = {"r": r, "folds": cfg.folds, "ridge": cfg.ridge, "iterations": cfg.iterations,
           "scored_tokens": int(len(runs[0].units)),
           "fit_tokens": min(run.fit_tokens for run in runs),
           "units": int(sample.boot.top), "loops": loops}
    fewer = min(run.temperature_tokens for run in runs)
    if fewer < out["fit_tokens"]:  # only where the logits were not held (LoopLogits)
        out["temperature_fit_tokens"] = fewer
    return out


def cell_metrics(runs: list[RunRecalibration], cfg: RecalibrateConfig, key: str = ""
                 ) -> dict[str, Any]:
    """metrics/recalibrate/<cell>.json: summarize over every run pooled, then each
    seed's own (`per_seed`) where there are several."""
    metrics = summarize(runs, cfg, key)
    if len(runs) > 1:
        metrics["per_seed"] = {f"seed{run.seed}": summarize([run], cfg, key) for run in runs}
    return metrics


def cell_table(runs: list[RunRecalibration]) -> pd.DataFrame:
    """tables/recalibrate/<cell>.parquet: every run's rows, seed by seed."""
    return pd.concat([run.table() for run in runs], ignore_index=True)


def headline(metrics: dict[str, Any]) -> str:
    """One line: at loop 1, the gap to R and the two recoveries."""
    first = metrics["loops"]["1"]
    parts = [f"R = {metrics['r']}, loop 1: gap {_iv(first['gap'])} nats",
             f"temperature recovers {_iv(first['temperature']['nats'])}"]
    if "affine" in first:
        parts.append(f"affine {_iv(first['affine']['nats'])}")
    return "; ".join(parts)


def _iv(raw: dict[str, float]) -> str:
    return str(Interval.of(raw))
