"""The number of loops of each optimizer step (train.depth), as a small sampler class.

Training draws one depth per step from `sampler(cfg, loops)`; `plan` asks the same
sampler for its mean and tail, so the two cannot disagree about what a setting means.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from loopscope.weights.config import TrainConfig

STAT_SAMPLES = 20_000  # draws behind mean() and quantile(): ~0.3 s
STAT_SEED = 0  # fixed, so printed statistics are the same on every run


class Fixed:
    """model.loops at every step."""

    varies = False

    def __init__(self, cfg: TrainConfig, loops: int) -> None:
        self.loops = loops

    @staticmethod
    def check(loops: int) -> str | None:
        return None

    def sample(self) -> int:
        return self.loops

    def mean(self) -> float:
        return float(self.loops)

    def quantile(self, q: float) -> int:
        return self.loops

    def state(self) -> torch.Tensor | None:
        return None

    def set_state(self, state: torch.Tensor | None) -> None:
        pass


class LogNormal:
    """Paper B's randomized depth, after Huginn: r = 1 + Poisson(lam) with
    lam ~ LogNormal(ln(m) - sigma^2 / 2, sigma), so E[r] = m + 1.

    train.depth_mean says what model.loops (R, the reference depth of every
    evaluation) means: `loops` sets m = R - 1, so E[r] = R; `loops_plus_one` is
    Huginn's code, m = R, so E[r] = R + 1 while evaluation runs R loops.
    One r per step, the same on every process: the sampler has its own generator,
    seeded from train.seed and saved in resume checkpoints.
    """

    varies = True

    def __init__(self, cfg: TrainConfig, loops: int) -> None:
        self.loops, self.sigma, self.convention = loops, cfg.depth_sigma, cfg.depth_mean
        self.m = loops - 1 if cfg.depth_mean == "loops" else loops
        self.gen = torch.Generator().manual_seed(cfg.seed + 1)

    @staticmethod
    def check(loops: int) -> str | None:
        """Why model.loops cannot be this sampler's mean (None: it can)."""
        return None if loops >= 2 else "it is the mean sampled depth and must be >= 2"

    def sample(self) -> int:
        mu = math.log(self.m) - self.sigma ** 2 / 2
        lam = torch.exp(mu + self.sigma * torch.randn(1, generator=self.gen, dtype=torch.float64))
        return 1 + int(torch.poisson(lam, generator=self.gen).item())

    @functools.cached_property
    def _draws(self) -> np.ndarray:
        """STAT_SAMPLES draws of a fresh sampler with a fixed seed (this one's own
        generator is left alone: training draws from it)."""
        cfg = TrainConfig(depth_sigma=self.sigma, depth_mean=self.convention, seed=STAT_SEED)
        fresh = LogNormal(cfg, self.loops)
        return np.array([fresh.sample() for _ in range(STAT_SAMPLES)])

    def mean(self) -> float:
        """E[r] (m + 1), estimated from STAT_SAMPLES draws with a fixed seed."""
        return float(self._draws.mean())

    def quantile(self, q: float) -> int:
        """The q-quantile of r (the deepest steps set the memory), rounded up."""
        return int(np.ceil(np.quantile(self._draws, q)))

    def state(self) -> torch.Tensor:
        return self.gen.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.gen.set_state(state)


SAMPLERS: dict[str, type[Fixed] | type[LogNormal]] = {"fixed": Fixed, "lognormal": LogNormal}


def sampler(cfg: TrainConfig, loops: int) -> Fixed | LogNormal:
    """The depth sampler train.depth names, for a model of `loops` (mean) loops."""
    return SAMPLERS[cfg.depth](cfg, loops)


def means(cfg: TrainConfig, loops: int) -> tuple[float, float]:
    """(m, E[r]) of the training depth of a model of `loops` (R) loops, exactly: the
    lognormal sampler's nominal mean m (Huginn's `mean`, the depth its evaluation runs;
    paper B's "mean 8") and its E[r] = m + 1; R and R for a fixed depth. A trained
    LoopedLM carries them (its nominal_mean and sampler_mean) for the measuring stages."""
    s = sampler(cfg, loops)
    return (float(s.m), float(s.m + 1)) if isinstance(s, LogNormal) else (float(loops),
                                                                          float(loops))
