"""Training objective, schedule, divergence handling and checkpoints."""

import pytest
import torch
from conftest import TINY
from conftest import tiny_cell as cell
from conftest import tiny_corpus as corpus

from loopscope.checkpoint import load_model, save_model
from loopscope.config import TrainConfig
from loopscope.diagnostics import diagnose, write_extract
from loopscope.errors import CheckpointError, DivergenceError
from loopscope.model import LoopedLM
from loopscope.train import lr_at, objective, train_cell


def test_lr_schedule():
    cfg = TrainConfig(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(99, cfg) == pytest.approx(0.1, abs=1e-3)


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
    metrics = diagnose(model, x, y, 4, ext)
    assert set(metrics["ppl_at_depth"]) == {"k1", "k2", "k3"}
    assert all(v > 1 for v in metrics["ppl_at_depth"].values())
    assert metrics["norm_mean"]["k1"] > 0
    assert metrics["ce_readout"] == metrics["ce_at_depth"]  # a normed readout
