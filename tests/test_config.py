"""params.yaml validation and cell resolution."""

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from loopscope.base.errors import ParamsError
from loopscope.params import CHOICES, load_params, parse_params
from loopscope.weights.config import CellConfig
from loopscope.weights.depth import SAMPLERS
from loopscope.weights.resolve import resolve_cell

ROOT = Path(__file__).resolve().parents[1]
BASE = yaml.safe_load((ROOT / "params.yaml").read_text())


def with_(path: str, value, base=BASE):
    raw = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = raw
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return raw


def test_shipped_params_are_valid():
    params = load_params(ROOT / "params.yaml")
    assert params.cells


@pytest.mark.parametrize("path, value, expected", [
    ("model.readout", "sideways",
     r"'model.readout' is 'sideways'; allowed values: normed, raw, final_norm"),
    ("model.loops", 0, r"'model.loops' is 0; it must be >= 1"),
    ("train.loss", "everywhere", r"'train.loss' is 'everywhere'; allowed values: final, per_loop"),
    ("model.block", "post", r"allowed values: prenorm, sandwich"),
    ("model.inject", "mul", r"allowed values: none, add, concat_adapter"),
    ("model.state_init", "zeros", r"allowed values: embed, noise"),
    ("model.d_model", 130, r"'model.d_model' is 130; it must be divisible by model.n_heads \(4\)"),
    ("train.lr", 0, r"'train.lr' is 0.0; it must be > 0"),
    ("train.norm_penalty", -1, r"'train.norm_penalty' is -1.0; it must be >= 0"),
    ("train.steps", 1.5, r"'train.steps' must be a int, got 1.5"),
    ("model.inter_loop_norm", "yes", r"'model.inter_loop_norm' must be a bool"),
    ("tokenizer.vocab_size", 10, r"'tokenizer.vocab_size' is 10"),
    ("data.val_fraction", 0.9, r"'data.val_fraction' is 0.9"),
    ("model.redout", "raw", r"unknown key 'model.redout'. Did you mean 'readout'\?"),
    ("trian", {}, r"unknown key 'trian'. Did you mean 'train'\?"),
    ("model.vocab_size", 100, r"'model.vocab_size' is set by 'tokenizer.vocab_size'"),
    ("cells.perloop_raw.model.readout", "sideways",
     r"in cell 'perloop_raw': 'model.readout' is 'sideways'; allowed values"),
    ("cells.perloop_raw.model.loop", 3, r"unknown key 'cells.perloop_raw.model.loop'"),
    ("cells.perloop_raw.diagnose", {}, r"unknown key 'cells.perloop_raw.diagnose'"),
    ("train.checkpoint_every", 0, r"'train.checkpoint_every' is 0; it must be >= 1"),
    ("train.batch_size", 0, r"'train.batch_size' is 0; it must be >= 1"),
    ("train.threads", 0, r"'train.threads' is 0; it must be >= 1"),
    ("train.grad_clip", 0, r"'train.grad_clip' is 0.0; it must be > 0"),
    ("train.min_lr_ratio", 1.5, r"'train.min_lr_ratio' is 1.5; it must be in \[0, 1\]"),
    ("train.warmup_steps", -1, r"'train.warmup_steps' is -1; it must be >= 0"),
    ("train.seed", -3, r"'train.seed' is -3; it must be >= 0"),
    ("train.lr", "3e-3", r"'train.lr' must be a float, got '3e-3'"),
    ("model.context", 0, r"'model.context' is 0; it must be >= 1"),
    ("model.n_heads", 0, r"'model.n_heads' is 0; it must be >= 1"),
    ("model.n_prelude", -1, r"'model.n_prelude' is -1; it must be >= 0"),
    ("model.dropout", 1.0, r"'model.dropout' is 1.0; it must be in \[0, 1\)"),
    ("tokenizer.kind", "wordpiece", r"'tokenizer.kind' is 'wordpiece'; allowed values: bpe, word"),
    ("tokenizer.vocab_size", 2_000_000, r"'tokenizer.vocab_size' is 2000000; it must be at "
     r"least 260 .* and at most 1000000"),
    ("data.val_fraction", 0, r"'data.val_fraction' is 0.0; it must be between 0 and 0.5"),
    ("data.dir", 5, r"'data.dir' must be a str, got 5"),
    ("diagnose.val_sequences", 0, r"'diagnose.val_sequences' is 0; it must be >= 1"),
    ("report.timeout_s", 0, r"'report.timeout_s' is 0; it must be >= 1"),
    ("train.chekpoint_every", 10,
     r"unknown key 'train.chekpoint_every'. Did you mean 'checkpoint_every'\?"),
    ("model", 3, r"'model' must be a mapping of keys to values, got 3"),
    ("train.warmup_steps", 900, r"'train.warmup_steps' is 900; it must be at most train.steps"),
    ("train.epochs", 4, r"'train.steps' is 400; it must be 0 when train.epochs is set"),
    ("train.steps", 0, r"'train.steps' is 0; it must be >= 1 \(or 0 with train.epochs > 0\)"),
    ("train.depth", "random", r"'train.depth' is 'random'; allowed values: fixed, lognormal"),
    ("train.depth_sigma", 0, r"'train.depth_sigma' is 0.0; it must be > 0"),
    ("train.backprop_loops", -1, r"'train.backprop_loops' is -1; it must be >= 0"),
    ("train.device", "tpu", r"'train.device' is 'tpu'; allowed values: auto, cpu, cuda"),
    ("train.precision", "fp16", r"'train.precision' is 'fp16'; allowed values: auto, fp32, bf16"),
    ("train.compile", "yes", r"'train.compile' must be a bool"),
    ("train.processes", 3, r"'train.batch_size' is 16; it must be divisible by "
     r"train.processes \(3\): it is the global batch"),
    ("train.stride", 0, r"'train.stride' is 0; it must be >= 1"),
    ("train.stride", 129, r"in cell '\w+': 'train.stride' is 129; it must be at most "
     r"model.context \(128\)"),
    ("data.hub_config", "x", r"'data.hub' is ''; it must be set when data.hub_config is set"),
    ("data.hub_documents", -1, r"'data.hub_documents' is -1; it must be >= 0"),
    ("tokenizer.min_frequency", -2, r"'tokenizer.min_frequency' is -2; it must be >= 0"),
    ("cells", {}, r"'cells' must map at least one cell name to its overrides"),
    ("cells.perloop_raw", 3, r"'cells.perloop_raw' must be a mapping, got 3"),
    ("cells.perloop_raw.train.lr", -1,
     r"in cell 'perloop_raw': 'train.lr' is -1.0; it must be > 0"),
    ("train.betas", [0.9], r"'train.betas' is \[0.9\]; it must be two numbers in \[0, 1\)"),
    ("train.betas", [0.9, 1], r"'train.betas' is \[0.9, 1.0\]; it must be two numbers in "
     r"\[0, 1\)"),
    ("train.betas", [-0.1, 0.9], r"'train.betas' is \[-0.1, 0.9\]; it must be two numbers"),
    ("train.betas", 0.9, r"'train.betas' must be a list of numbers, got 0.9"),
    ("train.betas", ["0.9", 0.95], r"'train.betas' must be a list of numbers"),
    ("train.schedule", "linear",
     r"'train.schedule' is 'linear'; allowed values: cosine, constant"),
    ("train.decay_on", "gains", r"'train.decay_on' is 'gains'; allowed values: matrices, all"),
    ("model.init", "xavier", r"'model.init' is 'xavier'; allowed values: gpt2, huginn, paper_a"),
    ("cells.perloop_raw.train.betas", [0.9, 0.999, 0.5],
     r"in cell 'perloop_raw': 'train.betas' is \[0.9, 0.999, 0.5\]; it must be two numbers"),
])
def test_bad_values_are_named(path, value, expected):
    with pytest.raises(ParamsError, match=expected):
        parse_params(with_(path, value))


@pytest.mark.parametrize("path", sorted(CHOICES))
def test_every_enumerated_option_lists_its_allowed_values(path):
    allowed = ", ".join(CHOICES[path])
    message = f"'{path}' is 'bogus'; allowed values: {allowed}."
    with pytest.raises(ParamsError, match=re.escape(message)):
        parse_params(with_(path, "bogus"))
    for value in CHOICES[path]:  # and every allowed value is accepted
        parse_params(with_(path, value))


def test_bad_cell_name():
    raw = copy.deepcopy(BASE)
    raw["cells"]["bad-name"] = {}
    with pytest.raises(ParamsError, match="cell name 'bad-name'"):
        parse_params(raw)


def test_load_params_names_the_file(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(with_("model.loops", 0)))
    with pytest.raises(ParamsError, match=str(path)):
        load_params(path)
    with pytest.raises(ParamsError, match="file not found"):
        load_params(tmp_path / "missing.yaml")


def test_cell_overrides_and_inheritance():
    params = parse_params(with_("cells.perloop_raw.train.steps", 70))
    raw = resolve_cell(params, "perloop_raw")
    normed = resolve_cell(params, "perloop_normed")
    assert raw.model.readout == "raw" and raw.train.steps == 70
    assert normed.train.steps == BASE["train"]["steps"]
    assert raw.model.vocab_size == BASE["tokenizer"]["vocab_size"]


def test_resolved_bytes_change_only_for_affected_cells():
    before = parse_params(BASE)
    after = parse_params(with_("model.readout", "raw"))
    # the paper A cells pin their readout; only a cell that inherits it changes
    changed = {name for name in BASE["cells"]
               if resolve_cell(before, name).to_json() != resolve_cell(after, name).to_json()}
    assert changed == {name for name, cell in BASE["cells"].items()
                       if "readout" not in cell.get("model", {})} == {"backbone", "backbone_mean4"}
    after = parse_params(with_("train.lr", 0.001))
    changed = {n for n in BASE["cells"]
               if resolve_cell(before, n).to_json() != resolve_cell(after, n).to_json()}
    assert changed == {n for n, cell in BASE["cells"].items()
                       if "lr" not in cell.get("train", {})} \
        == set(BASE["cells"]) - {"backbone", "backbone_mean4"}


def test_cell_config_round_trips():
    cell = resolve_cell(parse_params(BASE), "perloop_raw")
    assert CellConfig.from_json(cell.to_json()) == cell


def test_paper_a_recipe_resolves_and_round_trips():
    raw = copy.deepcopy(BASE)
    raw["model"]["init"] = "paper_a"
    raw["train"].update(schedule="constant", warmup_steps=0, betas=[0.9, 0.999],
                        decay_on="all")
    raw["cells"]["perloop_raw"]["train"]["betas"] = [0.8, 0.99]  # a cell may pin its own
    params = parse_params(raw)
    cell, raw_cell = resolve_cell(params, "perloop_normed"), resolve_cell(params, "perloop_raw")
    assert (cell.model.init, cell.train.schedule, cell.train.betas, cell.train.decay_on) \
        == ("paper_a", "constant", [0.9, 0.999], "all")
    assert raw_cell.train.betas == [0.8, 0.99]
    assert CellConfig.from_json(cell.to_json()) == cell
    assert '"betas": [\n      0.9,\n      0.999\n    ]' in cell.to_json()


def test_the_new_train_keys_default_to_the_previous_recipe():
    # params.yaml without the keys resolves as before: cosine, AdamW (0.9, 0.95), decay on
    # the matrices; a config written before the keys existed loads with these defaults
    cell = resolve_cell(parse_params(BASE), "perloop_raw")
    assert (cell.train.schedule, cell.train.betas, cell.train.decay_on) \
        == ("cosine", [0.9, 0.95], "matrices")
    assert cell.model.init == BASE["model"].get("init", "gpt2")
    old = json.loads(cell.to_json())
    for key in ("schedule", "betas", "decay_on"):
        del old["train"][key]
    assert CellConfig.from_json(json.dumps(old)) == cell


@pytest.mark.parametrize("seeds", [[1, 1], [-1], ["a"], 3, [True]])
def test_bad_seeds_are_named(seeds):
    raw = copy.deepcopy(BASE)
    raw["seeds"] = seeds
    with pytest.raises(ParamsError, match=r"'seeds' is .*distinct integers >= 0"):
        parse_params(raw)


def test_seeds_multiply_every_cell():
    raw = copy.deepcopy(BASE)
    raw["seeds"] = [7, 8, 9]
    cell = resolve_cell(parse_params(raw), "terminal_raw")
    assert cell.seeds == [7, 8, 9] and cell.train.seed == 7
    runs = [cell.for_seed(s) for s in cell.seeds]
    assert [r.train.seed for r in runs] == [7, 8, 9]
    assert all(r.model == cell.model and r.seeds == [r.train.seed] for r in runs)
    # a cell's own seed would be silently ignored: an error instead
    raw["cells"]["terminal_raw"]["train"]["seed"] = 5
    with pytest.raises(ParamsError, match=r"'cells.terminal_raw.train.seed' has no effect "
                                          r"while the top-level 'seeds' list is set"):
        parse_params(raw)
    # without a seeds list, a cell trains once, with train.seed
    assert resolve_cell(parse_params(BASE), "terminal_raw").seeds == [BASE["train"]["seed"]]


def test_lognormal_depth_needs_a_mean_of_two_loops():
    raw = with_("cells.perloop_raw.train.depth", "lognormal")
    raw = with_("cells.perloop_raw.model.loops", 1, raw)
    with pytest.raises(ParamsError, match=r"in cell 'perloop_raw': 'model.loops' is 1; with "
                       r"train.depth 'lognormal' it is the mean sampled depth and must be >= 2"):
        parse_params(raw)


def test_epochs_replace_steps():
    raw = with_("train.epochs", 2.5, with_("train.steps", 0))
    cell = resolve_cell(parse_params(raw), "terminal_raw")
    assert cell.train.epochs == 2.5 and cell.train.steps == 0


def test_a_cells_training_length_replaces_the_shared_one_in_either_unit():
    raw = with_("train.epochs", 2.5, with_("train.steps", 0))
    raw["cells"]["terminal_raw"]["train"]["steps"] = 300
    cell = resolve_cell(parse_params(raw), "terminal_raw")
    assert (cell.train.steps, cell.train.epochs) == (300, 0.0)
    raw = copy.deepcopy(BASE)
    raw["cells"]["terminal_raw"]["train"]["epochs"] = 1.5
    cell = resolve_cell(parse_params(raw), "terminal_raw")
    assert (cell.train.steps, cell.train.epochs) == (0, 1.5)
    raw["cells"]["terminal_raw"]["train"]["steps"] = 300  # both in one cell: refused
    with pytest.raises(ParamsError, match=r"in cell 'terminal_raw': 'train.steps' is 300"):
        resolve_cell(parse_params(raw), "terminal_raw")


def test_option_values_are_declared_once_as_literal_types():
    # the enumerations come from the dataclass field types, the depth samplers agree
    assert CHOICES["model.readout"] == ("normed", "raw", "final_norm")
    assert CHOICES["train.loss"] == ("final", "per_loop")
    assert set(CHOICES["train.depth"]) == set(SAMPLERS)
    assert {"tokenizer.kind", "train.device", "train.precision", "model.block",
            "model.inject", "model.state_init", "model.ffn"} <= set(CHOICES)


def test_policies_cells_must_be_cells():
    with pytest.raises(ParamsError, match=r"'policies.cells' names 'backbon', which is not a "
                                          r"cell. Did you mean 'backbone'\?"):
        parse_params(with_("policies.cells", ["backbon"]))
    with pytest.raises(ParamsError, match=r"'policies.cells' is empty"):
        parse_params(with_("policies.cells", []))
    with pytest.raises(ParamsError, match=r"'bench.cell' names 'perloop_raw', which is not one "
                                          r"of policies.cells"):
        parse_params(with_("bench.cell", "perloop_raw"))
    with pytest.raises(ParamsError, match=r"'policies.cells' names 'backbon'"):
        parse_params(with_("policies.cells", ["backbon"]))
    with pytest.raises(ParamsError, match=r"'policies.cells' must be a list of names"):
        parse_params(with_("policies.cells", [1]))
    with pytest.raises(ParamsError, match=r"'policies.grids.kl' must be a list of numbers, "
                                          r"got \['1e-3'\] \(YAML reads 1e-3 as text"):
        parse_params(with_("policies.grids.kl", ["1e-3"]))


@pytest.mark.parametrize("path, value, expected", [
    ("policies.grids.kl", [0, 0.002, 0.001],
     r"'policies.grids.kl' is \[0.0, 0.002, 0.001\]; it must be sorted ascending, without "
     r"repeats"),
    ("policies.grids.kl", [0, 0.001, 0.001], r"'policies.grids.kl' is .*; it must be sorted "
     r"ascending, without repeats"),
    ("policies.grids.cosine", [0, 0.001, 0.0025],
     r"'policies.grids.cosine' jumps from 0.001 to 0.0025 \(2.5x\); consecutive thresholds "
     r"must be at most 2x apart"),
    ("policies.grids.kl", [0.0005, 0.001],
     r"'policies.grids.kl' is \[0.0005, 0.001\]; it must be down to 0, the conservative end"),
    ("policies.grids.latent-diff", [0, 0.02, 0.04],
     r"'policies.grids.latent-diff' lacks the rule's default threshold 0.03"),
    ("policies.grids.kl-huginn", [0, 0.001, 0.002],
     r"'policies.grids.kl-huginn' lacks the rule's default threshold 0.0005 "
     r"\(defaults: 0.001, 0.0005\)"),
    ("policies.grids.kll", [0, 0.001],
     r"'policies.grids' names an unknown rule 'kll'. Did you mean 'kl'\? Known rules: kl, "),
    ("policies.grids.uniform", [1, 2], r"'policies.grids' names an unknown rule 'uniform'"),
    ("policies.grids.argmax-stability", [1, 2, 4, 5],
     r"'policies.grids.argmax-stability' ends at 5 checks; it must reach R = 8 \(model.loops "
     r"of cell 'backbone'\)"),
    ("policies.grids.argmax-stability", [1, 2.5, 5, 8],
     r"'policies.grids.argmax-stability' is .*; it must be whole numbers of stable checks"),
    ("policies.grids.probe", [0, 0.5, 1.0],
     r"'policies.grids.probe' is .*; it must be probabilities below 1"),
    ("policies.grids.cosine", [], r"'policies.grids.cosine' is \[\]; it must be a non-empty"),
    ("policies.grids.cosine", [-0.001, 0, 0.001],
     r"'policies.grids.cosine' is .*; it must be thresholds >= 0"),
    ("policies.grids", [0, 0.001], r"'policies.grids' must be a mapping of names to lists"),
    ("policies.grids", {}, r"'policies.grids' is \{\}; it must be a mapping of at least one rule"),
    ("bench.repeats", 2, r"'bench.repeats' is 2; it must be >= 3 \(every mode is a median"),
])
def test_bad_policy_grids_are_named(path, value, expected):
    with pytest.raises(ParamsError, match=expected):
        parse_params(with_(path, value))


def test_shipped_grids_reach_their_conservative_end_in_steps_of_at_most_2x():
    grids = load_params(ROOT / "params.yaml").policies.grids
    assert set(grids) == {"kl", "kl-huginn", "minp-kl", "entropy-diff", "latent-diff",
                          "cosine", "latent-acceleration", "latent-acceleration-2hit",
                          "argmax-stability", "probe"}
    for rule, grid in grids.items():
        if rule != "argmax-stability":
            assert grid[0] == 0 and 10 <= len(grid) <= 16, rule
            steps = zip(grid[1:], grid[2:], strict=False)
            assert all(b <= 2 * a * (1 + 1e-9) for a, b in steps), rule
    assert max(grids["argmax-stability"]) >= 8 and len(grids["argmax-stability"]) <= 8
    assert grids["probe"][1] < 0.05 / 32  # well below the old grid's 0.05
    # the smallest valid grid: the conservative end and the default
    assert parse_params(with_("policies.grids", {"kl": [0, 0.001]})).policies.grids == {
        "kl": [0.0, 0.001]}


def test_a_cell_can_set_its_own_seeds():
    raw = copy.deepcopy(BASE)
    raw["seeds"] = [7]
    raw["cells"]["perloop_raw"]["seeds"] = [42, 43]
    params = parse_params(raw)
    assert resolve_cell(params, "perloop_raw").seeds == [42, 43]
    assert resolve_cell(params, "perloop_raw").train.seed == 42
    others = [c for c, body in params.cells.items() if "seeds" not in body]
    assert all(resolve_cell(params, c).seeds == [7] for c in others)
    raw["cells"]["perloop_raw"]["seeds"] = [1, 1]
    with pytest.raises(ParamsError, match=r"'cells.perloop_raw.seeds' is \[1, 1\]; it must "
                                          r"be a list of distinct integers >= 0"):
        parse_params(raw)
    raw["cells"]["perloop_raw"]["seeds"] = [1, 2]
    raw["cells"]["perloop_raw"]["train"]["seed"] = 5
    with pytest.raises(ParamsError, match=r"'cells.perloop_raw.train.seed' has no effect "
                                          r"while 'cells.perloop_raw.seeds' list is set"):
        parse_params(raw)
