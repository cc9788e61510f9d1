"""Training objective, schedule, optimizer, divergence handling and checkpoints."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY
from conftest import tiny_cell as cell
from conftest import tiny_corpus as corpus

from loopscope.base import paths
from loopscope.base.errors import CheckpointError, DivergenceError
from loopscope.measure.per_loop.extract import write_extract
from loopscope.measure.per_loop.sweep import measure, summarize
from loopscope.measure.runs import map_runs, trained_runs
from loopscope.weights.checkpoint import load_model, save_model
from loopscope.weights.config import TrainConfig
from loopscope.weights.data import write_prepared
from loopscope.weights.model import LoopedLM
from loopscope.weights.side_by_side import train_side_by_side
from loopscope.weights.tokenizer import train_tokenizer
from loopscope.weights.train import lr_at, objective, optimizer, train_cell


def test_lr_schedule():
    cfg = TrainConfig(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(99, cfg) == pytest.approx(0.1, abs=1e-3)


def test_constant_schedule_holds_lr_after_the_warm_up():
    cfg = TrainConfig(steps=100, lr=1.0, warmup_steps=10, schedule="constant")
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert all(lr_at(step, cfg) == 1.0 for step in range(10, 100))
    # paper A's reference: no warm-up, the full lr from the first step
    cfg = TrainConfig(steps=100, lr=3e-4, warmup_steps=0, schedule="constant")
    assert {lr_at(step, cfg) for step in range(100)} == {3e-4}


def test_cosine_is_the_default_schedule():
    cfg = TrainConfig(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert cfg.schedule == "cosine"
    explicit = TrainConfig(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1,
                           schedule="cosine")
    assert [lr_at(s, cfg) for s in range(100)] == [lr_at(s, explicit) for s in range(100)]
    assert lr_at(50, cfg) < 1.0  # it decays


def groups(opt):
    """(weight decay, betas, ids of the parameters) of each group of an optimizer."""
    return [(g["weight_decay"], g["betas"], {id(p) for p in g["params"]})
            for g in opt.param_groups]


def test_betas_reach_the_optimizer():
    model = LoopedLM(TINY)
    assert [b for _, b, _ in groups(optimizer(model, TrainConfig()))] == [(0.9, 0.95)] * 2
    opt = optimizer(model, TrainConfig(betas=[0.9, 0.999]))
    assert [b for _, b, _ in groups(opt)] == [(0.9, 0.999)] * 2


def test_weight_decay_on_matrices_or_on_every_parameter():
    model = LoopedLM(TINY)
    every = {id(p) for p in model.parameters()}
    gains = {id(p) for p in model.parameters() if p.dim() < 2}
    embed = {id(model.embed.weight), id(model.pos.weight)}
    assert gains and embed <= every
    # matrices (the default): gains without decay, the embeddings (matrices) with it
    (wd, _, decayed), (wd0, _, kept) = groups(optimizer(model, TrainConfig(weight_decay=0.1)))
    assert (wd, wd0) == (0.1, 0.0) and kept == gains and decayed == every - gains
    # all (paper A's reference): norm gains and embeddings decay too, nothing is exempt
    (wd, _, decayed), (_, _, kept) = groups(
        optimizer(model, TrainConfig(weight_decay=0.1, decay_on="all")))
    assert wd == 0.1 and decayed == every and not kept
    assert gains | embed <= decayed


def test_decay_on_all_decays_the_norm_gains():
    model = LoopedLM(TINY)
    opt = optimizer(model, TrainConfig(lr=0.1, weight_decay=0.5, decay_on="all"))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # a zero gradient: only the decay moves the weights
    torch.testing.assert_close(model.norm_out.weight, torch.full((32,), 1 - 0.1 * 0.5))


def test_paper_a_recipe_trains_and_its_checkpoint_keeps_it(tmp_path):
    model = dataclasses.replace(TINY, init="paper_a")
    recipe = dict(schedule="constant", warmup_steps=0, betas=[0.9, 0.999], decay_on="all")
    trained, summary = train_cell(cell(model, **recipe), corpus())
    assert summary["final_loss"] < 3.5  # from ~ln(64) = 4.16 and above: N(0, 1) logits
    assert {k: summary["config"][k] for k in recipe} == recipe
    save_model(tmp_path / "m.pt", trained, cell(model, **recipe), {})
    assert load_model(tmp_path / "m.pt")[1] == cell(model, **recipe)


def test_objective_placement_and_penalty():
    torch.manual_seed(0)
    model = LoopedLM(TINY)
    x = torch.randint(0, 64, (2, 16))
    out = model(x)
    per_loop, ces = objective(out, x, TrainConfig(loss="per_loop"))
    final, _ = objective(out, x, TrainConfig(loss="final"))
    assert per_loop.item() == pytest.approx(sum(ces) / 3, rel=1e-5)
    assert final.item() == pytest.approx(ces[-1], rel=1e-5)
    penalized, _ = objective(out, x, TrainConfig(loss="final", norm_penalty=2.0))
    sq = torch.stack([h.pow(2).mean() for h in out.states]).mean().item()
    assert penalized.item() == pytest.approx(ces[-1] + 2.0 * sq, rel=1e-5)


def test_training_lowers_the_loss_and_is_deterministic():
    model_a, summary_a = train_cell(cell(), corpus())
    _, summary_b = train_cell(cell(), corpus())
    assert summary_a["final_loss"] < 3.0  # from ln(64) = 4.16
    assert summary_a["final_loss"] == summary_b["final_loss"]


def test_divergence_names_cell_step_and_lr():
    with pytest.raises(DivergenceError, match=r"cell 'tiny': loss is (nan|inf) at step \d+ \(lr "):
        train_cell(cell(lr=1e6, warmup_steps=0, grad_clip=1e6), corpus())


def test_checkpoint_round_trip_and_corruption(tmp_path):
    model, _ = train_cell(cell(steps=3), corpus())
    path = tmp_path / "m.pt"
    save_model(path, model, cell(steps=3), {})
    loaded, loaded_cell = load_model(path)
    assert loaded_cell == cell(steps=3)
    loaded_state = loaded.state_dict()
    for name, p in model.state_dict().items():
        assert torch.equal(p, loaded_state[name]), name
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="m.pt: unreadable checkpoint"):
        load_model(path)
    with pytest.raises(CheckpointError, match="not found"):
        load_model(tmp_path / "none.pt")


def test_diagnose_metrics_shape(tmp_path):
    model, _ = train_cell(cell(steps=3), corpus())
    x = corpus()[:16 * 8].view(8, 16)
    y = corpus()[1:16 * 8 + 1].view(8, 16)
    ext = write_extract(model, x, y, 4, tmp_path / "c", "c")
    assert ext.states.shape == (4, 8 * 16, TINY.d_model)
    metrics = summarize(measure(model, x, y, np.arange(8), 4, sweep_depth=3))
    assert set(metrics["ppl_at_depth"]) == {"k1", "k2", "k3"}
    assert all(v > 1 for v in metrics["ppl_at_depth"].values())
    assert metrics["norm_mean"]["k1"] > 0


# A backbone trained in a child process: every source of randomness paper B's recipe
# has (sampled depth, noise initial state, truncated backprop, the concat adapter,
# sandwich norms, Huginn's init) on two threads; prints the weights' digest.
CHILD = """
import dataclasses, hashlib, sys, torch
sys.path.insert(0, {tests!r})
from conftest import BACKBONE, tiny_cell, tiny_corpus
from loopscope.weights.train import train_cell
model = dataclasses.replace(BACKBONE, init="huginn")
cell = tiny_cell(model, steps=40, depth="lognormal", depth_sigma=0.5, backprop_loops=2,
                 threads=2)
trained, summary = train_cell(cell, tiny_corpus())
digest = hashlib.sha256()
for name, tensor in trained.state_dict().items():
    digest.update(name.encode() + tensor.contiguous().numpy().tobytes())
print(digest.hexdigest(), repr(summary["final_loss"]))
"""


def test_a_backbone_trains_to_the_same_bytes_in_two_processes_side_by_side():
    """Two processes train the same backbone at once, competing for the cores (thread
    scheduling differs between them): their weights are the same bytes. On one machine
    nothing in the backbone's recipe is left to chance."""
    code = CHILD.format(tests=str(Path(__file__).parent))
    jobs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [job.communicate(timeout=300) for job in jobs]
    assert all(job.returncode == 0 for job in jobs), [err[-2000:] for _, err in outs]
    first, second = (out.split() for out, _ in outs)
    assert first == second and len(first[0]) == 64


def test_seeds_trained_side_by_side_give_each_run_the_bytes_it_has_alone(tmp_path):
    """train.seed_processes 2 on 2 threads: the cell's two runs train at once, each in a
    process of its own on one thread (its config says so); each run's weights are those
    of the same run config trained alone, and its logged rows come back for DVCLive."""
    tokens = corpus().numpy().astype("uint16")
    tok = train_tokenizer(["a tokenizer nothing here reads"], 260, "bpe", 0)
    write_prepared(tmp_path / "prepared", tok, {"train": tokens, "val": tokens[:500]}, {})
    both = dataclasses.replace(cell(threads=2, seed_processes=2), seeds=[1, 2])
    assert both.runs_at_once == 2 and both.for_seed(2).train.threads == 1
    model, resume = str(tmp_path / "seed{seed}.pt"), str(tmp_path / "resume{seed}.pt")
    done = train_side_by_side(both, tmp_path / "prepared", model, resume)
    assert list(done) == [1, 2] and all(d["history"] for d in done.values())
    for seed in (1, 2):
        alone, _ = train_cell(both.for_seed(seed), corpus())
        saved, run_cell = load_model(Path(model.format(seed=seed)))
        assert run_cell.train.threads == 1 and run_cell.seeds == [seed]
        for name, tensor in alone.state_dict().items():
            assert torch.equal(saved.state_dict()[name], tensor), (seed, name)
    one = dataclasses.replace(both, train=dataclasses.replace(both.train, processes=2))
    assert one.runs_at_once == 1  # data parallel: one seed at a time


def _threads_and_state(run) -> tuple[int, float]:
    """What map_runs' test measures of a run: the threads it ran on, and a number of
    its forward pass."""
    with torch.no_grad():
        state = run.model(run.x, read="none").states[-1]
    return torch.get_num_threads(), float(state.double().sum())


def test_runs_trained_side_by_side_are_measured_side_by_side(tmp_path, monkeypatch):
    """map_runs measures a cell whose runs trained side by side in a process per run on
    the same share of threads (one each of two), in seed order, with the numbers a run
    measured alone on one thread gives; a cell trained one seed at a time is measured
    in this process on every thread."""
    monkeypatch.chdir(tmp_path)
    tokens = corpus().numpy().astype("uint16")
    tok = train_tokenizer(["a tokenizer nothing here reads"], 260, "bpe", 0)
    write_prepared(paths.PREPARED, tok, {"train": tokens, "val": tokens[:600]}, {})
    both = dataclasses.replace(cell(threads=2, seed_processes=2, steps=3), seeds=[1, 2],
                               cell="tiny")
    paths.config_file("tiny").parent.mkdir(parents=True)
    paths.config_file("tiny").write_text(both.to_json())
    for seed in both.seeds:
        model, _ = train_cell(both.for_seed(seed), corpus())
        save_model(paths.model_file("tiny", seed), model, both.for_seed(seed), {})
    found = map_runs("tiny", _threads_and_state)
    alone = [_threads_and_state(r) for r in trained_runs("tiny", threads=1)]
    assert [t for t, _ in found] == [1, 1] and found == alone
    paths.config_file("tiny").write_text(
        dataclasses.replace(both, train=dataclasses.replace(both.train, seed_processes=1))
        .to_json())
    assert [t for t, _ in map_runs("tiny", _threads_and_state)] == [2, 2]
