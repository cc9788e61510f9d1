"""What `plan` asks of this machine: the fp32 matmul roof, the FLOP rate of a forward
pass of each model shape, and a training step's share of the roof (from a committed
`bench train` result); a probe of a few seconds (loopscope.tools.plan)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from loopscope.base import paths
from loopscope.base.machine import cpu_model
from loopscope.weights.config import CellConfig
from loopscope.weights.model import LoopedLM, ModelConfig, cost

# A training step's share of the fp32 matmul roof where no `bench train` result is at
# hand: `bench train` measured 0.44-0.57 on 2-core AMD EPYC and Intel Xeon machines
# (issue #32), 0.47-0.50 in the committed metrics/bench/train.json; the middle of that.
STEP_EFFICIENCY = 0.5


ROOF_SIZE = 2048  # the roof's square matmul: `bench train --matmul`'s default


PROBE_SECONDS = 0.3  # each probe times at least 3 calls, more while under this


PROBE_FLOPS = 2e10  # a forward probe's batch is cut to about this many FLOPs per call


def _median_seconds(fn: Callable[[], Any]) -> float:
    """Median seconds of fn over at least 3 calls after an untimed one, stopping once
    PROBE_SECONDS have passed (at most 7 calls)."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (len(times) < 7 and time.perf_counter() - start < PROBE_SECONDS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    """Run torch on n threads inside, and restore the count after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def roof_gflops(threads: int, size: int = ROOF_SIZE) -> float:
    """This machine's fp32 matmul roof in GFLOP/s: a size x size product on `threads`
    threads, median time, as `bench train` measures its roof."""
    with _threads(threads):
        g = torch.Generator().manual_seed(0)
        a, b = (torch.randn(size, size, generator=g) for _ in range(2))
        return 2 * size ** 3 / _median_seconds(lambda: a @ b) / 1e9


def forward_flops(cfg: ModelConfig) -> float:
    """FLOPs per token of a forward pass at depth 1 with the final readout."""
    c = cost(cfg)
    return c.prelude + c.loop + c.readout


def forward_gflops(cfg: ModelConfig, threads: int, windows: int) -> float:
    """GFLOP/s of a forward pass of a model of cfg's shapes on this machine: `windows`
    random windows (fewer where that passes PROBE_FLOPS), depth 1 with the final
    readout, no gradients, fp32, as the measuring stages run it. Random weights: the
    time does not depend on them."""
    one = dataclasses.replace(cfg, loops=1, dropout=0.0)
    n = max(1, min(windows, int(PROBE_FLOPS // (forward_flops(one) * one.context))))
    with _threads(threads), torch.no_grad():
        torch.manual_seed(0)
        model = LoopedLM(one).eval()
        x = torch.randint(0, one.vocab_size, (n, one.context),
                          generator=torch.Generator().manual_seed(0))
        seconds = _median_seconds(lambda: model(x, loops=1, read="last"))
    return forward_flops(one) * n * one.context / seconds / 1e9


def step_efficiency(path: Path | None = None) -> tuple[float, str, int]:
    """A training step's share of the fp32 matmul roof, where it comes from, and the
    roof's matmul size: the median fp32 ratio_to_matmul over the cells of a `bench
    train` result (metrics/bench/train.json), else STEP_EFFICIENCY."""
    path = paths.bench_file("train") if path is None else path
    try:
        result = json.loads(Path(path).read_text())
        ratios = [float(c["fp32"]["ratio_to_matmul"]) for c in result["cells"].values()
                  if "fp32" in c]
        size = int(result.get("matmul_size", ROOF_SIZE))
        if ratios and all(0 < r < 1.5 for r in ratios):
            return (statistics.median(ratios),
                    f"{path}: median fp32 ratio_to_matmul of its {len(ratios)} cells "
                    f"({min(ratios):.2f}-{max(ratios):.2f})", size)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return (STEP_EFFICIENCY, f"STEP_EFFICIENCY (no `bench train` result at {path}: "
            "issue #32 measured 0.44-0.57 on 2-core EPYC and Xeon)", ROOF_SIZE)


def shape_key(cfg: ModelConfig) -> str:
    """The sizes that set a forward pass's matrix shapes, so its FLOP rate: cells that
    differ only in depth, readout, FFN kind, block form or init share one probe."""
    return f"d_model {cfg.d_model}, context {cfg.context}, vocab {cfg.vocab_size}"


@dataclass
class Calibration:
    """This machine's rates for the plan's CPU cells, from a probe of a few seconds."""

    cpu: str
    threads: int
    roof_gflops: float  # fp32 square matmul (matmul_size), median
    matmul_size: int
    efficiency: float  # a training step's share of that roof
    efficiency_source: str
    forward_gflops: dict[str, float]  # shape_key -> GFLOP/s of a forward pass
    seconds: float  # the probe's own wall time
    # the roof on fewer threads, where runs train side by side (train.seed_processes)
    roofs: dict[int, float] = field(default_factory=dict)

    @property
    def train_gflops(self) -> float:
        return self.efficiency * self.roof_gflops

    def side_by_side_gflops(self, cell: CellConfig) -> float:
        """A cell's training rate on this CPU with its runs side by side: each run's
        share of the threads at that thread count's roof, times the runs at once."""
        per = cell.for_seed(cell.seeds[0]).train.threads
        return self.efficiency * self.roofs.get(per, self.roof_gflops) * cell.runs_at_once


# Rates already probed in this process, by the probe and its arguments: a process that
# plans several times (a params file and a preset, the tests) probes each rate once
_PROBED: dict[tuple, float] = {}


def _once(key: tuple, probe: Callable[[], float]) -> float:
    """probe(), or the rate it gave for this key earlier in this process."""
    if key not in _PROBED:
        _PROBED[key] = probe()
    return _PROBED[key]


def calibrate(cells: Iterable[CellConfig], windows: int,
              bench_file: Path | None = None) -> Calibration:
    """Probe this machine for the CPU cells given (on the first one's train.threads):
    the roof, and a forward pass of each distinct model shape (`windows` windows)."""
    start = time.perf_counter()
    cells = list(cells)
    threads = cells[0].train.threads
    efficiency, source, size = step_efficiency(bench_file)
    roof = _once((roof_gflops, threads, size), lambda: roof_gflops(threads, size))
    forward: dict[str, float] = {}
    for cell in cells:
        key = shape_key(cell.model)
        if key not in forward:
            forward[key] = _once((forward_gflops, key, threads, windows),
                                 lambda m=cell.model: forward_gflops(m, threads, windows))
    shares = {c.for_seed(c.seeds[0]).train.threads for c in cells if c.runs_at_once > 1}
    roofs = {n: _once((roof_gflops, n, size), lambda n=n: roof_gflops(n, size))
             for n in sorted(shares - {threads})}
    return Calibration(cpu_model(), threads, roof, size, efficiency, source, forward,
                       time.perf_counter() - start, roofs)
