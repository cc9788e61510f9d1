"""Preflight: the one memory estimate (plan and the stages), its limit, its calibration,
and the disk checks; every refusal comes before any step, naming the keys."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch
import yaml
from conftest import BACKBONE
from conftest import tiny_cell as cell
from micro import ROOT

from loopscope import stage
from loopscope.base import timings
from loopscope.base.errors import ResourceError
from loopscope.measure.per_loop.extract import write_extract
from loopscope.params import load_params
from loopscope.preflight import disk, memory
from loopscope.tools.plan import plan_cell
from loopscope.weights import compute
from loopscope.weights.config import CellConfig
from loopscope.weights.model import LoopedLM
from loopscope.weights.resolve import resolve_cell

GIB = 1024**3
DEFAULT = load_params(ROOT / "params.yaml")
CPU = torch.device("cpu")
Usage = namedtuple("Usage", "total used free")


def default_cell(name: str, **model) -> CellConfig:
    """A cell of the shipped params.yaml, with model overrides."""
    c = resolve_cell(DEFAULT, name)
    return dataclasses.replace(c, model=dataclasses.replace(c.model, **model))


def limit_to(monkeypatch, gib: float) -> None:
    """Pretend this process can use `gib` GiB, wherever it runs."""
    monkeypatch.setattr(memory, "available",
                        lambda device: memory.Limit(int(gib * GIB), "a test's limit"))


# --- one estimate ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["perloop_normed", "backbone"])
def test_plan_prints_the_estimate_the_preflight_checks(name):
    c = default_cell(name)
    for device in ("cpu", "cuda"):
        planned = plan_cell(c, None, device)["memory_bytes"]
        est = memory.training(c, device == "cuda")
        assert planned == {**est.parts, "total": est.total}


def test_sandwich_swiglu_and_the_adapter_cost_more_than_a_plain_block():
    plain = memory.training(cell(), False).parts["activations"]
    for variant in ({"block": "sandwich"}, {"ffn": "swiglu"}, {"inject": "concat_adapter"}):
        model = dataclasses.replace(cell().model, **variant)
        assert memory.training(cell(model), False).parts["activations"] > plain, variant


# --- the refusal ----------------------------------------------------------------------

def test_a_context_typo_is_refused_naming_memory_and_the_keys(monkeypatch):
    limit_to(monkeypatch, 20)
    typo = default_cell("terminal_normed", context=100_000)
    with pytest.raises(ResourceError) as err:
        memory.check_training(typo, CPU)
    message = str(err.value)
    assert message.startswith("cell 'terminal_normed': training needs at least about ")
    floor = float(message.split("needs at least about ")[1].split(" GiB")[0])
    assert 100 < floor < 200  # without the attention matrices: fused kernels keep none
    with_math = re.search(r"; ([0-9,.]+) GiB with the attention matrices math attention "
                          "stores; an estimate, `python -m loopscope.tools.plan` prints it",
                          message)
    assert float(with_math.group(1).replace(",", "")) > 40_000  # what plan prints
    assert "can use 18.0 GiB (90% of 20.0 GiB, a test's limit)" in message
    for key in ("model.context (100000)", "train.batch_size (16)", "model.d_model (128)",
                "model.loops (4)", "tokenizer.vocab_size (2048)", "train.processes (1)"):
        assert key in message
    assert "lower model.context or train.batch_size" in message


def test_the_largest_part_says_what_to_lower(monkeypatch):
    limit_to(monkeypatch, 0.01)
    big_vocab = default_cell("perloop_normed", vocab_size=500_000)
    with pytest.raises(ResourceError, match=r"lower train.batch_size, model.context or "
                       r"tokenizer.vocab_size \(the logits are the largest part\)"):
        memory.check_training(big_vocab, CPU)


def test_attention_matrices_alone_over_the_limit_is_a_note(monkeypatch, capsys):
    """Fused attention kernels (flash, on CUDA and the CPU) keep no attention matrix, so
    a run that fits without them is not refused; it is told."""
    long = default_cell("perloop_normed", context=4096)
    est = memory.training(long, False)
    assert est.parts["attention"] > est.floor
    limit_to(monkeypatch, (est.floor + est.total) / 2 / memory.USABLE / GIB)
    memory.check_training(long, CPU)
    assert capsys.readouterr().out.startswith(
        "note: cell 'perloop_normed': training may not fit: about ")


def test_cpu_processes_share_the_machine_and_cuda_processes_do_not(monkeypatch):
    c = default_cell("perloop_normed")
    two = dataclasses.replace(c, train=dataclasses.replace(c.train, processes=2))
    one_gib = memory.training(c, False).floor / GIB
    per_process = memory.training(two, False).floor / GIB
    limit_to(monkeypatch, (per_process * 1.5) / memory.USABLE)  # one fits, two do not
    with pytest.raises(ResourceError, match=r"training needs at least about [0-9.]+ \w+ of "
                       r"memory \(2 processes x [0-9.]+ \w+ each: weights"):
        memory.check_training(two, CPU)
    memory.check_training(two, torch.device("cuda"))  # one device per process
    assert per_process < one_gib  # the global batch is shared out


def test_extract_and_diagnose_are_checked_at_their_batch_size(monkeypatch):
    c = default_cell("perloop_normed")
    run_on = compute.Compute(CPU, False)
    per_window = sum(memory.forward(c.model, 1, c.model.loops, True, False).values())
    limit_to(monkeypatch, per_window * 30 / GIB)
    memory.check_forward(c, run_on, 16, "extract.batch_size", "extract")
    with pytest.raises(ResourceError, match=r"^cell 'perloop_normed': extract at "
                       r"extract.batch_size 4096 needs at least about .* lower "
                       r"extract.batch_size, or run where"):
        memory.check_forward(c, run_on, 4096, "extract.batch_size", "extract")


def configure(tmp_path: Path, params: dict) -> str:
    """Run the configure stage in tmp_path on these params, through the stage runner;
    its one-line error."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(SystemExit) as exit_:
        stage.main(["--untimed", "configure", str(ROOT / "stages" / "configure.py"), "configs"])
    return str(exit_.value.code)


def test_configure_refuses_a_context_typo_before_anything_trains(tmp_path, monkeypatch):
    """The acceptance case in-process: model.context 100000 in one cell, and configure
    (which runs first on every `dvc repro`) stops in about a second, before any stage
    trains: training itself holds no memory estimate."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["cells"]["terminal_normed"]["model"]["context"] = 100_000
    monkeypatch.chdir(tmp_path)
    message = configure(tmp_path, params)
    assert message.startswith("error: cell 'terminal_normed': training needs at least about ")
    assert "of memory" in message and "model.context (100000)" in message
    assert not (tmp_path / "configs").exists() or not any((tmp_path / "configs").iterdir())


# --- the limit ------------------------------------------------------------------------

def fake_available(monkeypatch, available: int | None) -> None:
    """Pretend psutil reports `available` bytes (None: it cannot tell)."""
    def virtual_memory():
        if available is None:
            raise OSError("no /proc/meminfo")
        return SimpleNamespace(total=99 * GIB, available=available)
    monkeypatch.setattr(memory.psutil, "virtual_memory", virtual_memory)
    monkeypatch.setattr(memory.sys, "platform", "linux")


def fake_proc(monkeypatch, tmp_path, meminfo_kib: int, cgroup: str) -> Path:
    fake_available(monkeypatch, meminfo_kib * 1024)
    (tmp_path / "cgroup").write_text(cgroup)
    root = tmp_path / "sys"
    monkeypatch.setattr(memory, "PROC_CGROUP", tmp_path / "cgroup")
    monkeypatch.setattr(memory, "CGROUP_ROOT", root)
    return root


def test_the_limit_is_the_cgroup_where_one_is_set(monkeypatch, tmp_path):
    root = fake_proc(monkeypatch, tmp_path, 8 * 1024**2, "0::/job/step\n")  # 8 GiB free
    step = root / "job" / "step"
    step.mkdir(parents=True)
    (step / "memory.max").write_text("max\n")  # no limit of its own: its parent's counts
    (root / "job" / "memory.max").write_text(f"{2 * GIB}\n")
    (root / "job" / "memory.current").write_text(f"{GIB + GIB // 2}\n")
    (root / "job" / "memory.stat").write_text(f"anon 1\ninactive_file {GIB // 2}\n")
    limit = memory.available(CPU)
    assert limit.bytes == GIB  # 2 GiB - (1.5 GiB used - 0.5 GiB reclaimable cache)
    assert str(root / "job") in limit.source
    (root / "job" / "memory.max").write_text("max\n")
    limit = memory.available(CPU)
    assert (limit.bytes, limit.source) == (8 * GIB, "MemAvailable in /proc/meminfo")


def test_the_limit_of_a_cgroup_v1(monkeypatch, tmp_path):
    root = fake_proc(monkeypatch, tmp_path, 8 * 1024**2, "4:memory:/box\n0::/\n")
    box = root / "memory" / "box"
    box.mkdir(parents=True)
    (box / "memory.limit_in_bytes").write_text(f"{3 * GIB}\n")
    (box / "memory.usage_in_bytes").write_text(f"{GIB}\n")
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (root / "memory" / "memory.usage_in_bytes").write_text(f"{GIB}\n")
    assert memory.available(CPU).bytes == 2 * GIB
    fake_available(monkeypatch, None)
    monkeypatch.setattr(memory, "PROC_CGROUP", tmp_path / "none")
    assert memory.available(CPU) is None  # neither can be read: nothing to check against
    memory.check_training(default_cell("terminal_normed", context=100_000), CPU)


def test_off_linux_the_limit_is_what_psutil_reports(monkeypatch, tmp_path):
    """macOS has no /proc: psutil's available memory is still a limit (it was none
    before psutil), named for what it is."""
    fake_available(monkeypatch, 3 * GIB)
    monkeypatch.setattr(memory.sys, "platform", "darwin")
    monkeypatch.setattr(memory, "PROC_CGROUP", tmp_path / "none")
    limit = memory.available(CPU)
    assert (limit.bytes, limit.source) == (3 * GIB, "the available memory psutil reports")


def test_the_real_limit_is_psutils_available_memory_or_less():
    """On this machine, unfaked: never more than psutil's available memory (a cgroup
    can only lower it), and a limit is found wherever psutil works."""
    limit = memory.available(CPU)
    assert limit is not None and 0 < limit.bytes <= psutil.virtual_memory().available * 1.1


def test_the_default_cells_fit_this_machine():
    for name in DEFAULT.cells:
        memory.check_training(resolve_cell(DEFAULT, name), CPU)


# --- calibration ----------------------------------------------------------------------

CALIBRATE = textwrap.dedent("""
    import dataclasses, json, resource, sys
    import torch
    from loopscope.preflight import disk, memory
    from loopscope.params import load_params
    from loopscope.weights.resolve import resolve_cell
    from loopscope.weights.train import train_cell
    cell = resolve_cell(load_params(sys.argv[1]), sys.argv[2])
    cell = dataclasses.replace(cell, train=dataclasses.replace(
        cell.train, steps=int(sys.argv[3]), warmup_steps=1, log_every=1))
    tokens = torch.randint(0, cell.model.vocab_size, (100_000,),
                           generator=torch.Generator().manual_seed(0))
    # torch loads parts of itself (autograd, the optimizer's machinery) on first use:
    # two steps of a toy model load them, so the baseline is torch with all it needs
    toy = dataclasses.replace(cell.model, d_model=8, n_heads=2, context=8, vocab_size=260)
    train_cell(dataclasses.replace(cell, model=toy), tokens % 260)
    baseline = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
    train_cell(cell, tokens)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print(json.dumps({"growth": peak - baseline,
                      "estimate": memory.training(cell, False).total}))
""")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
def test_the_estimate_is_calibrated_on_a_default_cell():
    """The peak resident memory a default cell's training adds to its process (a fresh
    one: ru_maxrss is a high-water mark) is within memory.MEASURED_RANGE of the
    estimate. perloop_normed, paper A's largest; three steps: the first ones set most of
    the allocator's high-water mark (loopscope.preflight.memory lists the other cells, and 30
    steps)."""
    name = "perloop_normed"
    result = subprocess.run([sys.executable, "-c", CALIBRATE, str(ROOT / "params.yaml"),
                             name, "3"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    ratio = got["growth"] / got["estimate"]
    low, high = memory.MEASURED_RANGE
    assert low <= ratio <= high, f"{name}: measured {got['growth'] / 2**20:.0f} MiB, " \
                                 f"estimate {got['estimate'] / 2**20:.0f} MiB ({ratio:.2f}x)"


# --- a stage's peak memory and time (loopscope.base.timings, written by loopscope.stage) ---

@pytest.mark.parametrize("platform, unit", [("linux", 1024), ("darwin", 1)])
def test_peak_memory_reads_ru_maxrss_in_the_platforms_unit(monkeypatch, platform, unit):
    """ru_maxrss is KiB on Linux and bytes on macOS: the same 5 MiB peak either way."""
    import resource
    peak = 5 * 2**20
    reported = {resource.RUSAGE_SELF: peak // unit, resource.RUSAGE_CHILDREN: 7 // unit}
    monkeypatch.setattr(resource, "getrusage",
                        lambda who: SimpleNamespace(ru_maxrss=reported[who]))
    monkeypatch.setattr(timings.sys, "platform", platform)
    assert timings.peak_memory() == peak


def test_process_seconds_counts_from_the_process_start(monkeypatch):
    """From psutil's start time, to well under a second (not its whole-second boot time
    on Linux), imports included; perf_counter since `since` where psutil cannot tell."""
    since = time.perf_counter()
    seconds = timings.process_seconds(since)
    wall = time.time() - psutil.Process().create_time()  # up to 1 s late on Linux
    assert time.perf_counter() - since < seconds  # this process began before `since`
    assert wall - 1.05 < seconds < wall + 0.05
    if hasattr(time, "CLOCK_BOOTTIME"):  # Linux: the exact /proc/self/stat reading
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        exact = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        assert seconds == pytest.approx(exact, abs=0.05)

    def unreadable(*args):
        raise psutil.AccessDenied()
    monkeypatch.setattr(timings.psutil, "Process", unreadable)
    before = time.perf_counter()
    assert before - since <= timings.process_seconds(since) <= time.perf_counter() - since


# --- disk -----------------------------------------------------------------------------

def full_disk(monkeypatch, free: int) -> None:
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: Usage(10**12, 0, free))


def test_extract_checks_the_disk_before_writing(tmp_path, monkeypatch):
    full_disk(monkeypatch, 10_000)
    torch.manual_seed(0)
    model = LoopedLM(BACKBONE).eval()
    x = torch.randint(0, 64, (8, 16))
    out = tmp_path / "extracts" / "tiny" / "seed42"
    with pytest.raises(ResourceError) as err:
        write_extract(model, x, x, 4, out, "tiny")
    need = (BACKBONE.loops + 1) * 8 * 16 * 32 * 4 + BACKBONE.loops * 8 * 16 * 22
    assert str(err.value) == (
        f"{out}/states.npy: needs about {disk.format_bytes(need)} of disk space, but its "
        "file system has 9.8 KiB free. Free disk space, or lower extract.val_sequences (8 "
        "windows of model.context 16 tokens, each token with model.loops + 1 = 5 states "
        "of model.d_model 32 floats), then rerun `dvc repro`.")
    assert not any(out.iterdir())  # not even the memmap's temporary file


def test_configure_checks_the_disk_before_anything_trains(tmp_path, monkeypatch):
    """Room for every model file not yet written and a resume checkpoint, checked by
    configure before any stage trains."""
    monkeypatch.chdir(tmp_path)
    full_disk(monkeypatch, 1000)
    message = configure(tmp_path, yaml.safe_load((ROOT / "tests" / "micro_params.yaml")
                                                 .read_text()))
    assert message.startswith("error: models and checkpoints: needs about ")
    assert "of disk space, but its file system has 1000 B free. Free disk space" in message
    assert not (tmp_path / "configs").exists() or not any((tmp_path / "configs").iterdir())


def test_require_disk_sums_what_shares_a_file_system(tmp_path, monkeypatch):
    full_disk(monkeypatch, 1500)
    disk.require_disk({tmp_path / "a": 700, tmp_path / "b" / "c": 700}, "")
    with pytest.raises(ResourceError, match=r"a and .*b/c: needs about 1.6 KiB"):
        disk.require_disk({tmp_path / "a": 800, tmp_path / "b" / "c": 800}, "")
