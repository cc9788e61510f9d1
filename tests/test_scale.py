"""Scaling knobs: randomized depth, truncated backprop, epochs and stride, devices, and
data-parallel training under torchrun (gloo on CPU)."""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import BACKBONE, run_stage
from conftest import TINY as MODEL
from conftest import tiny_corpus as corpus

from loopscope.base import paths
from loopscope.base.errors import ParamsError
from loopscope.measure.runs import trained_runs
from loopscope.preflight import memory
from loopscope.weights import compute
from loopscope.weights.checkpoint import save_model
from loopscope.weights.config import CellConfig, TrainConfig
from loopscope.weights.data import Batches, steps_for_epochs, train_windows, write_prepared
from loopscope.weights.depth import SAMPLERS, sampler
from loopscope.weights.model import LoopedLM
from loopscope.weights.tokenizer import train_tokenizer
from loopscope.weights.train import train_cell

ROOT = Path(__file__).resolve().parents[1]


class Rows:
    """A stand-in for DVCLive that keeps the logged rows as [step, name, value]."""

    def __init__(self) -> None:
        self.rows: list[list] = []
        self.step = 0

    def log_metric(self, name: str, value: float) -> None:
        self.rows.append([self.step, name, value])

    def next_step(self) -> None:
        pass


def test_lognormal_depth_has_the_configured_mean_and_is_reproducible():
    cfg = TrainConfig(depth="lognormal", depth_sigma=0.5, seed=3)
    depths = sampler(cfg, 8)
    draws = [depths.sample() for _ in range(4000)]
    assert min(draws) >= 1
    assert statistics.mean(draws) == pytest.approx(8, rel=0.05)
    assert statistics.pstdev(draws) > 2  # really random, not a constant
    again = sampler(cfg, 8)
    assert [again.sample() for _ in range(50)] == draws[:50]
    assert depths.varies and depths.mean() == pytest.approx(8, rel=0.02)
    assert depths.quantile(0.99) > 2 * 8
    fixed = sampler(TrainConfig(depth="fixed"), 8)
    assert (fixed.sample(), fixed.mean(), fixed.quantile(0.99), fixed.varies) == (8, 8, 8, False)
    for name, sampler_class in SAMPLERS.items():  # the config says what the sampler does
        assert TrainConfig(depth=name).samples_depth == sampler_class.varies


def test_truncated_backprop_builds_a_graph_for_the_last_loops_only():
    torch.manual_seed(0)
    model = LoopedLM(BACKBONE)
    x = torch.randint(0, 64, (2, 16))
    out = model(x, loops=6, read="all", grad_loops=2)
    assert [h.requires_grad for h in out.states] == [False] * 4 + [True] * 2
    assert [lg is not None for lg in out.logits] == [False] * 4 + [True] * 2
    out.logits[-1].sum().backward()
    assert model.prelude[0].mlp.up.weight.grad is not None  # through the re-injection
    full = model(x, loops=6, read="all")
    assert all(h.requires_grad for h in full.states)
    # the forward values do not depend on where gradients stop (same noise state)
    torch.manual_seed(1)
    a = model(x, loops=6, read="last", grad_loops=2).logits[-1]
    torch.manual_seed(1)
    b = model(x, loops=6, read="last").logits[-1]
    assert torch.equal(a, b)


def test_randomized_depth_training_logs_the_sampled_depth():
    live = Rows()
    cfg = TrainConfig(loss="final", depth="lognormal", backprop_loops=2, steps=12,
                      batch_size=4, warmup_steps=2, threads=1, log_every=1)
    model, summary = train_cell(CellConfig("backbone", BACKBONE, cfg), corpus(), live)
    depths = [v for _, name, v in live.rows if name == "train/depth"]
    assert len(depths) == 12 and len(set(depths)) > 1
    assert all(name != "train/norm_loop1" for _, name, _ in live.rows)
    assert summary["final_loss"] < 4.2  # learned something: log(64) = 4.16 at the start


def test_epochs_and_stride():
    assert train_windows(1000, 16, 1) == 1000 - 16 - 1
    assert train_windows(1000, 16, 8) == (1000 - 18) // 8 + 1
    assert steps_for_epochs(2, 1000, 16, 8, 4) == -(-2 * ((1000 - 18) // 8 + 1) // 4)
    tokens = torch.arange(1000)
    batches = Batches(tokens, 16, 64, seed=0, stride=8)
    x, y = batches.next()
    assert (x[:, 0] % 8 == 0).all() and torch.equal(x[:, 1:], y[:, :-1])
    assert int(x[:, 0].max()) + 17 <= 1000
    cfg = TrainConfig(steps=0, epochs=0.5, stride=16, batch_size=8, warmup_steps=0,
                      threads=1, log_every=1)
    _, summary = train_cell(CellConfig("tiny", MODEL, cfg), corpus())
    assert summary["steps"] == steps_for_epochs(0.5, 4000, 16, 16, 8)
    too_long = TrainConfig(steps=0, epochs=0.01, batch_size=8, warmup_steps=50)
    with pytest.raises(ParamsError, match=r"'train.warmup_steps' is 50, but train.epochs "
                       r"0.01 gives only \d+ steps on this corpus"):
        train_cell(CellConfig("tiny", MODEL, too_long), corpus())


def test_devices():
    run_on = compute.resolve(TrainConfig(device="cpu", precision="auto"))
    assert run_on.device.type == "cpu" and not run_on.bf16
    assert compute.resolve(TrainConfig(device="cpu", precision="bf16")).bf16
    assert not compute.resolve(TrainConfig(device="cpu", precision="fp32")).bf16
    assert compute.uses_cuda("auto", cuda_available=True)
    assert not compute.uses_cuda("cpu", cuda_available=True)
    assert compute.uses_bf16("auto", cuda=True)
    assert not compute.uses_bf16("auto", cuda=False)
    if not torch.cuda.is_available():
        assert compute.resolve(TrainConfig()).device.type == "cpu"
        with pytest.raises(ParamsError, match=r"'train.device' is 'cuda' but torch sees no "
                           "CUDA device"):
            train_cell(CellConfig("tiny", MODEL, TrainConfig(device="cuda")), corpus())


@pytest.mark.parametrize("native", [True, False])
def test_auto_precision_is_fp32_on_every_cpu(monkeypatch, native):
    """auto: bf16 on CUDA, fp32 on every CPU whether or not it multiplies bf16 natively,
    so a CPU run's numbers do not depend on the CPU; an explicit precision is kept."""
    monkeypatch.setattr(compute, "native_bf16_cpu", lambda: native)
    cpu = TrainConfig(device="cpu", precision="auto")
    assert compute.precision_of(cpu) == "fp32"
    assert not compute.resolve(cpu).bf16
    assert compute.resolve(TrainConfig(device="cpu", precision="bf16")).bf16
    assert compute.precision_of(TrainConfig(device="auto"), cuda_available=True) == "bf16"
    for fixed in ("fp32", "bf16"):
        assert compute.precision_of(TrainConfig(precision=fixed), cuda_available=True) == fixed


def test_native_bf16_follows_torchs_cpu_feature_checks(monkeypatch):
    compute.native_bf16_cpu.cache_clear()
    try:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
        assert compute.native_bf16_cpu()
        compute.native_bf16_cpu.cache_clear()
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
        assert not compute.native_bf16_cpu()
    finally:
        compute.native_bf16_cpu.cache_clear()


def test_configure_writes_the_resolved_precision(tmp_path, monkeypatch):
    """A machine that resolves auto differently (CUDA against a CPU) writes a different
    config file, so DVC retrains the cell there instead of reusing results made at another
    precision; two CPUs, with native bf16 or without, write the same file."""
    params = (ROOT / "tests" / "micro_params.yaml").read_text()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(params)
    monkeypatch.setattr(memory, "available", lambda device: None)  # no device to ask
    written = {}
    for native, cuda in ((True, False), (False, False), (False, True)):
        monkeypatch.setattr(compute, "native_bf16_cpu", lambda native=native: native)
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        run_stage("configure", "configs")
        written[native, cuda] = (tmp_path / "configs" / "backbone.json").read_bytes()
        assert json.loads(written[native, cuda])["train"]["precision"] == ("bf16" if cuda
                                                                           else "fp32")
    assert written[True, False] == written[False, False] != written[False, True]


def test_bf16_autocast_trains_on_cpu_and_is_measured_in_fp32(tmp_path, monkeypatch):
    """Master weights stay fp32; the measuring stages run a bf16-trained run without
    autocast (its norms and KL divergences need fp32), the throughput stage with it."""
    cfg = TrainConfig(steps=4, batch_size=4, warmup_steps=1, threads=1, precision="bf16")
    cell = CellConfig("tiny", MODEL, cfg)
    model, summary = train_cell(cell, corpus())
    assert summary["device"] == "cpu bf16" and summary["final_loss"] < 5
    assert all(p.dtype == torch.float32 for p in model.parameters())
    monkeypatch.chdir(tmp_path)
    tokens = corpus().numpy().astype("uint16")
    tok = train_tokenizer(["a tokenizer the stage never reads"], 260, "bpe", 0)
    write_prepared(tmp_path / paths.PREPARED, tok, {"train": tokens, "val": tokens[:500]}, {})
    save_model(paths.model_file("tiny", cfg.seed), model, cell, {})
    (run,) = trained_runs("tiny", 4)
    assert run.trained.bf16 and not run.compute.bf16
    with torch.no_grad():
        states = run.model(run.x, read="none").states
    assert all(h.dtype == torch.float32 for h in states)
    with torch.no_grad(), run.trained.autocast():
        assert run.model(run.x, read="last").logits[-1].dtype == torch.bfloat16


DDP_SCRIPT = """
import json, sys, torch
sys.path.insert(0, {tests!r})
from conftest import TINY as MODEL, tiny_corpus as corpus
from test_scale import Rows, ddp_config
from loopscope.weights.train import init_distributed, train_cell, world
from loopscope.weights.config import CellConfig
cfg = ddp_config(processes=2)
init_distributed(cfg)
live = Rows()
model, summary = train_cell(CellConfig("tiny", MODEL, cfg), corpus(), live)
if world()[0] == 0:
    weights = {{k: v.tolist() for k, v in model.state_dict().items()}}
    json.dump({{"rows": live.rows, "weights": weights}}, open(sys.argv[1], "w"))
"""


def ddp_config(processes: int) -> TrainConfig:
    return TrainConfig(steps=20, batch_size=8, lr=3e-3, warmup_steps=2, threads=1,
                       log_every=1, norm_penalty=0.01, processes=processes, seed=5)


@pytest.mark.slow  # torchrun: two processes
def test_two_gloo_processes_follow_one_process(tmp_path):
    live = Rows()
    model, _ = train_cell(CellConfig("tiny", MODEL, ddp_config(1)), corpus(), live)
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT.format(tests=str(Path(__file__).parent)))
    out = tmp_path / "ddp.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", str(script), str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    ddp = json.loads(out.read_text())
    one = {(s, n): v for s, n, v in live.rows}
    two = {(s, n): v for s, n, v in ddp["rows"]}
    assert one.keys() == two.keys()
    losses = [(one[k], two[k]) for k in one if k[1] == "train/loss"]
    assert len(losses) == 20
    for a, b in losses:
        assert b == pytest.approx(a, rel=1e-4)
    assert losses[-1][0] < losses[0][0] - 0.3  # it trained
    for name, value in model.state_dict().items():
        torch.testing.assert_close(torch.tensor(ddp["weights"][name]), value,
                                   rtol=1e-3, atol=1e-4)


DDP_RESUME_SCRIPT = """
import json, sys, torch
from pathlib import Path
sys.path.insert(0, {tests!r})
from conftest import BACKBONE, tiny_corpus as corpus
from test_scale import ddp_resume_config
from loopscope.weights.config import CellConfig
from loopscope.weights.train import init_distributed, train_cell, world

class Killed(Exception):
    pass

class KillAt:  # every process stops at the same logged step, as a kill would stop them
    def __init__(self, at):
        self.step, self.at = 0, at
    def log_metric(self, name, value):
        if self.step >= self.at:
            raise Killed
    def next_step(self):
        pass

cfg = ddp_resume_config()
init_distributed(cfg)
cell = CellConfig("tiny", BACKBONE, cfg)
resume = Path(sys.argv[1]) / "last.pt"
whole, _ = train_cell(cell, corpus())
try:
    train_cell(cell, corpus(), KillAt(15), resume)  # checkpoint after step 10, then killed
except Killed:
    pass
resumed, _ = train_cell(cell, corpus(), None, resume)
a, b = whole.state_dict(), resumed.state_dict()
differ = [k for k in a if not torch.equal(a[k], b[k])]
json.dump(differ, open(sys.argv[1] + f"/rank{{world()[0]}}.json", "w"))
"""


def ddp_resume_config() -> TrainConfig:
    """Two processes drawing dropout and the noise initial state from their own RNGs."""
    return TrainConfig(steps=20, batch_size=8, lr=3e-3, warmup_steps=2, threads=1,
                       log_every=5, checkpoint_every=10, processes=2, seed=5)


@pytest.mark.slow  # torchrun: two processes
def test_two_gloo_processes_resume_to_the_uninterrupted_weights(tmp_path):
    """Each process's RNG state goes into the resume checkpoint and comes back to that
    process, so a killed 2-process run resumes to the same weights, bit for bit."""
    script = tmp_path / "ddp_resume.py"
    script.write_text(DDP_RESUME_SCRIPT.format(tests=str(Path(__file__).parent)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", str(script), str(tmp_path)], capture_output=True, text=True, env=env,
        timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from step 10" in result.stdout
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == [], rank
