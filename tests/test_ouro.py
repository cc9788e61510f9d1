"""Ouro's layout (loopscope.released.ouro): its parameter names, loading a checkpoint
directory, and the loop-by-loop comparison with Ouro's published implementation.

The comparison's fixture (tests/fixtures/ouro_tiny) was made by the published
implementation itself, run with torch 2.13.0 (CPU) and transformers 4.54.1 (the version
Ouro's model cards ask for) in float32. The Hugging Face hub, where ByteDance publishes
modeling_ouro.py and configuration_ouro.py with the checkpoints, could not be reached
from the machine that made it, and huggingface/transformers holds no Ouro model, so the
files came from GitHub copies of the hub's:
- modeling_ouro.py of github.com/Eagle4398/ouro-nixpkgs at commit
  d4f815eca3d1f9c7dcde6b5e274bd45fd67a5af6 (the copy that repository puts in place of
  the hub file of ByteDance/Ouro-1.4B, whose hub revision its ouro-model.nix pins,
  574fa66cb8bf5abdc979642d01cf2b79b16bfab1). It changes only UniversalTransformerCache
  (a setter for its key/value lists, a get_mask_sizes), which a forward with
  use_cache=False does not run; the rest is, but for type-hint spelling, the same code
  as the copy in github.com/LoopedLMs/ouro_rl (ouro_rl/modeling/modeling_ouro.py at
  commit 3bad4c1891fa7a1c5e11f8eb4e59e7d1cec5502b), whose own changes are in that
  cache too;
- configuration_ouro.py of github.com/LoopedLMs/ouro_rl
  (ouro_rl/modeling/configuration_ouro.py, same commit).
config.json was written by the published config class's save_pretrained (hidden_size 32,
4 query heads over 2 key/value heads of head_dim 8, so grouped-query heads are
exercised, 2 decoder layers, intermediate_size 48, vocab_size 96,
max_position_embeddings 32, rope_theta 10000, total_ut_steps 4, and Ouro-1.4B's untied
head). Every parameter was drawn from a seeded generator (norm gains 1 + 0.2 N(0, 1),
the exit gate's bias -1 + 0.3 N(0, 1), the embedding 0.5 N(0, 1), every matrix, the
gate's weight and the head N(0, 1/fan_in)) and saved by the published model's
save_pretrained (model.safetensors). tokenizer.json is a word-level tokenizer over 96
words made with `tokenizers`, Ouro's <|endoftext|>, <|im_start|>, <|im_end|> at ids
0, 1, 2; the tokens are two sentences it encodes, 12 tokens each. reference.npz holds,
for the default positions and for positions (B, T) 0, 2, ..., 22 and 5, 7, ..., 27
(position_ids, with an all-ones attention_mask so the published mask does not read them
as packed sequences), from the published model at 6 UT steps (loaded with
total_ut_steps=6, past the config's 4): the embedding; per step the output of the last
decoder layer (core_states, a forward hook), the state the published forward lists
(states: the final norm of it), the exit gate's sigmoid (gates) and the logits the
published forward returns with exit_at_step (logits); and, at the config's 4 steps, the
logits the published forward returns with exit_threshold 0.3, 0.5 and 0.8 (exit_logits).
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import check_published_loops, check_sharded_load, loader_of, random_checkpoint

from loopscope.base.errors import CheckpointError, ParamsError
from loopscope.looped.interface import LoopedModel, run_loops
from loopscope.measure.exit_rules.exits import ExitScore, make
from loopscope.measure.exit_rules.masked import evaluate, masked_forward
from loopscope.measure.exit_rules.policies import sweep_settings
from loopscope.measure.per_loop.sweep import float64_reader, measure, radial_cosines, summarize
from loopscope.preflight import memory
from loopscope.released import loader, outside
from loopscope.released.layouts import LAYOUTS
from loopscope.released.ouro import OuroConfig, OuroLM
from loopscope.weights.outside_config import OutsideConfig

load_ouro = loader_of("ouro")


FIXTURES = Path(__file__).parent / "fixtures"
TINY = FIXTURES / "ouro_tiny"
SPEC = json.loads((FIXTURES / "ouro_names.json").read_text())["ouro_tiny"]
TOL = {"rtol": 1e-5, "atol": 1e-5}  # float32 across machines; here the match is exact


def write_checkpoint(directory: Path, drop: str = "", extra: dict | None = None,
                     reshape: str = "", config: dict | None = None) -> dict[str, torch.Tensor]:
    """A checkpoint directory in Ouro's layout with random weights under the fixture's
    names (less `drop`, plus `extra`, `reshape` one row short); returns the weights."""
    raw = {**SPEC["config"], "transformers_version": "4.54.1", **(config or {})}
    weights = random_checkpoint(directory, raw, SPEC["parameters"], drop, extra, reshape)
    shutil.copy(TINY / "tokenizer.json", directory / "tokenizer.json")
    return weights


def reference() -> tuple[OuroLM, dict[str, np.ndarray]]:
    return load_ouro(TINY), dict(np.load(TINY / "reference.npz"))


def tiny() -> OuroLM:
    return OuroLM(OuroConfig.from_json(SPEC["config"]))


# ------------------------------------------------------------------ names and loading


def test_the_layout_has_ouros_parameter_names_and_shapes():
    model = tiny()
    assert {name: list(p.shape) for name, p in model.named_parameters()} == SPEC["parameters"]
    assert set(model.state_dict()) == set(SPEC["parameters"])  # no saved buffer of ours
    assert model.lm_head is not None and not SPEC["shared"]  # Ouro-1.4B's untied head


def test_load_ouro_loads_every_parameter_by_name(tmp_path):
    weights = write_checkpoint(tmp_path)
    model = load_ouro(tmp_path)
    state = model.state_dict()
    assert set(state) == set(weights)
    for name, value in weights.items():
        assert torch.equal(state[name], value), name
    assert model.tokenizer.get_vocab_size() == 96 and not model.training
    assert not any(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("fault, words", [
    ({"drop": "model.layers.1.self_attn.k_proj.weight"},
     ["model.layers.1.self_attn.k_proj.weight", "is missing", "model.safetensors"]),
    ({"extra": {"model.layers.2.input_layernorm.weight": torch.ones(32)}},
     ["model.safetensors: model.layers.2.input_layernorm.weight", "not a parameter of Ouro"]),
    ({"reshape": "model.layers.0.self_attn.v_proj.weight"},
     ["model.safetensors: model.layers.0.self_attn.v_proj.weight", "(15, 32)", "(16, 32)"]),
    ({"drop": "model.early_exit_gate.bias"}, ["model.early_exit_gate.bias (1,) is missing"]),
    ({"config": {"model_type": "huginn_raven"}}, ["config.json", "model_type is 'huginn_raven'"]),
    ({"config": {"use_sliding_window": True}}, ["config.json", "use_sliding_window"]),
    ({"config": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}},
     ["config.json", "rope_scaling"]),
    ({"config": {"num_key_value_heads": 3}}, ["config.json", "multiple of num_key_value_heads"]),
])
def test_a_checkpoint_that_does_not_fit_fails_naming_file_and_parameter(tmp_path, fault, words):
    write_checkpoint(tmp_path, **fault)
    with pytest.raises(CheckpointError) as err:
        load_ouro(tmp_path)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_a_config_of_another_layout_and_missing_files_fail_naming_them(tmp_path):
    write_checkpoint(tmp_path)
    huginn = json.loads((FIXTURES / "huginn_tiny" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(huginn))
    with pytest.raises(CheckpointError, match="config.json: model_type is 'huginn_raven'"):
        load_ouro(tmp_path)
    del huginn["model_type"]
    (tmp_path / "config.json").write_text(json.dumps(huginn))
    with pytest.raises(CheckpointError, match="config.json: missing hidden_size"):
        load_ouro(tmp_path)
    write_checkpoint(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="tokenizer.json: no such file"):
        load_ouro(tmp_path)
    with pytest.raises(CheckpointError, match="not a directory"):
        load_ouro(tmp_path / "absent")


def test_sharded_weights_load_through_their_index(tmp_path):
    check_sharded_load(tmp_path, write_checkpoint(tmp_path), load_ouro, first=12)


def test_a_tied_head_is_the_embedding(tmp_path):
    """With tie_word_embeddings the head is the embedding: lm_head.weight is no
    parameter, and a copy of it in the checkpoint is shape-checked and not used."""
    copy = torch.zeros(96, 32)
    weights = write_checkpoint(tmp_path, drop="lm_head.weight", config={
        "tie_word_embeddings": True}, extra={"lm_head.weight": copy})
    model = load_ouro(tmp_path)
    assert model.lm_head is None
    assert torch.equal(model.head_weight, weights["model.embed_tokens.weight"])
    assert set(dict(model.reader().named_parameters())) == {"model.norm.weight",
                                                           "model.embed_tokens.weight"}
    write_checkpoint(tmp_path, drop="lm_head.weight", config={"tie_word_embeddings": True},
                     extra={"lm_head.weight": torch.zeros(96, 31)})
    with pytest.raises(CheckpointError, match=r"lm_head.weight has shape \(96, 31\)"):
        load_ouro(tmp_path)


# --------------------------------------------- the comparison with the published model


@pytest.mark.parametrize("positions", ["", "spread_"], ids=["default", "spread"])
def test_states_logits_and_gates_match_the_published_implementation_loop_by_loop(positions):
    """H_k is the last decoder layer's output; carry(H_k) is the normed state the
    published forward lists and hands on; read and exit_score give its logits and gate
    probability, at every loop, past total_ut_steps too."""
    model, ref = reference()
    assert not model.random_state  # H_0 is the embedding itself

    def initial(e: torch.Tensor) -> torch.Tensor:
        h = model.initial_state(e)
        assert h is e
        return h

    def carried_and_gate(k: int, h: torch.Tensor, _: torch.Tensor) -> None:
        at = {name: torch.from_numpy(ref[positions + name][k - 1]) for name in ("states", "gates")}
        torch.testing.assert_close(model.carry(h), at["states"], **TOL)
        torch.testing.assert_close(model.exit_score(h), at["gates"], **TOL)

    check_published_loops(model, ref, positions, TOL, states="core_states",
                          initial=initial, also=carried_and_gate)


@torch.no_grad()
def test_the_comparison_fails_on_a_missing_norm_between_loops():
    """Starting loop 2 from the un-normed state (carry as the identity) is caught."""
    model, ref = reference()
    e = model.inputs(torch.from_numpy(ref["tokens"]))
    h1 = model.step(e, e, k=1)
    torch.testing.assert_close(h1, torch.from_numpy(ref["core_states"][0]), **TOL)
    h2 = model.step(h1, e, k=2)
    assert not torch.allclose(h2, torch.from_numpy(ref["core_states"][1]), **TOL)


@torch.no_grad()
def test_the_interface_runs_ouros_layout():
    """run_loops (default positions) gives the published per-loop states; the masked
    forward's attention override, with no exit, gives the uniform-depth state."""
    model, ref = reference()
    assert isinstance(model, LoopedModel)
    assert (model.prelude_blocks, model.coda_blocks, model.kv_blocks) == (0, 0, 2)
    idx = torch.from_numpy(ref["tokens"])
    initial, states = run_loops(model, idx, 6)
    torch.testing.assert_close(initial, torch.from_numpy(ref["inputs"]), **TOL)
    torch.testing.assert_close(torch.stack(states), torch.from_numpy(ref["core_states"]), **TOL)
    never = masked_forward(model, idx, ExitScore(model.exit_score, 0.0), cap=6)
    torch.testing.assert_close(never.state, states[-1], **TOL)
    assert (never.exit_loop == 6).all()
    torch.testing.assert_close(never.logits, torch.from_numpy(ref["logits"][-1]), **TOL)


@torch.no_grad()
def test_the_exit_score_rule_at_one_minus_q_is_the_published_exit_at_threshold_q():
    """The published forward exits each token where the running sum of its exit
    distribution reaches q; the exit-score rule (exits.make), checked on the same
    uniform-depth states at threshold 1 - q, picks the same loop for every token."""
    model, ref = reference()
    _, states = run_loops(model, torch.from_numpy(ref["tokens"]), 4)
    flat = [h.flatten(0, 1) for h in states]
    tokens = torch.arange(len(flat[0]))
    spread = set()
    for q, published in zip(ref["exit_thresholds"], ref["exit_logits"], strict=True):
        policy = make("exit-score", 1.0 - float(q), score=model.exit_score)
        policy.reset(len(tokens))
        exit_loop = torch.full_like(tokens, 4)
        active = torch.ones_like(tokens, dtype=torch.bool)
        for loop in range(1, 4):
            leaving = policy.check(torch.full_like(tokens, loop), flat[loop - 1], None,
                                   tokens) & active
            exit_loop[leaving], active = loop, active & ~leaving
        logits = model.read(torch.stack(flat)[exit_loop - 1, tokens])
        torch.testing.assert_close(logits, torch.from_numpy(published).flatten(0, 1), **TOL)
        spread |= set(exit_loop.tolist())
    assert spread == {1, 2, 3, 4}  # the thresholds exit tokens at every loop


@torch.no_grad()
def test_the_published_exit_mode_is_the_published_forward_and_ours_is_not():
    """The masked forward in the published exit mode (freeze=False: every token loops to
    the cap, its output read at its exit loop) gives the published forward's logits at
    every q; ours freezes an exited token's state, keys and values, so later tokens
    attend to other states and some logits move."""
    model, ref = reference()
    idx = torch.from_numpy(ref["tokens"])
    moved = 0
    for q, published in zip(ref["exit_thresholds"], ref["exit_logits"], strict=True):
        policy = make("exit-score", 1.0 - float(q), score=model.exit_score)
        run = masked_forward(model, idx, policy, cap=4, freeze=False)
        torch.testing.assert_close(run.logits, torch.from_numpy(published), **TOL)
        ours = masked_forward(model, idx, policy, cap=4)
        moved += int((~torch.isclose(ours.logits, run.logits, rtol=1e-5, atol=1e-5))
                     .any(-1).sum())
    assert moved > 0


@torch.no_grad()
def test_the_exit_score_rule_exits_tokens_in_the_masked_forward_and_the_policy_sweep():
    model, ref = reference()
    idx = torch.from_numpy(ref["tokens"])
    run = masked_forward(model, idx, make("exit-score", 0.5, score=model.exit_score), cap=4)
    assert 0 < (run.exit_loop < 4).sum() < idx.numel()
    # loop 1 is the same in every run: its exits are the tokens whose lambda_1 > 0.5
    torch.testing.assert_close((run.exit_loop == 1), torch.from_numpy(ref["gates"][0] > 0.5))
    x, y = idx[:, :-1], idx[:, 1:]
    swept = sweep_settings(model, x, y, None, 4, 2, {"exit-score": [0.0, 0.5]}, 1, 1)
    assert (swept[("exit-score", 0.0)].exit_loop == 4).all()
    assert swept[("exit-score", 0.5)].mean_loops < 4


# ------------------------------------------------------------ the interface's details


@torch.no_grad()
def test_the_attention_override_gets_grouped_query_heads_after_the_rotary_embedding():
    model, ref = reference()
    e = model.inputs(torch.from_numpy(ref["tokens"]))
    seen = []

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        seen.append((tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    h = model.step(e, e, [attend, attend], k=1)
    assert seen == [((2, 4, 12, 8), (2, 2, 12, 8), (2, 2, 12, 8))] * 2
    torch.testing.assert_close(h, torch.from_numpy(ref["core_states"][0]), **TOL)
    assert not torch.allclose(  # an override that ignores the causal mask differs
        model.step(e, e, [lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, enable_gqa=True)] * 2, k=1), h, **TOL)
    with pytest.raises(ValueError, match="1 attention overrides for 2 decoder layers"):
        model.step(e, e, [attend], k=1)


@torch.no_grad()
def test_loop_indices_carry_and_the_prelude_and_coda_overrides():
    model, ref = reference()
    e = model.inputs(torch.from_numpy(ref["tokens"]), kvs=[])
    h1 = model.step(e, e, k=1)
    assert torch.equal(model.step(e, e, k=torch.tensor([1, 3])), h1)  # rows at other loops
    with pytest.raises(ValueError, match="1-based"):
        model.step(e, e, k=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="1-based"):
        model.step(e, e, k=0)
    first = torch.tensor([True, False])[:, None].expand(2, 12)
    mixed = model.carry(h1, first=first)
    assert torch.equal(mixed[0], h1[0]) and torch.equal(mixed[1], model.carry(h1)[1])
    assert torch.equal(model.read(h1, kvs=[]), model.read(h1))
    with pytest.raises(ValueError, match="no attention blocks"):
        model.read(h1, kvs=[lambda q, k, v: q])
    with pytest.raises(ValueError, match="no attention blocks"):
        model.inputs(torch.zeros(1, 4, dtype=torch.long), kvs=[lambda q, k, v: q])


def test_positions_are_checked():
    model = tiny()
    e = model.inputs(torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 32\)"):
        model.step(e, e, positions=torch.arange(30, 34))
    with pytest.raises(ValueError, match="positions give 3 tokens, the input 4"):
        model.step(e, e, positions=torch.arange(3))
    with pytest.raises(ValueError, match="exceeds the context 32"):
        model.inputs(torch.zeros(1, 33, dtype=torch.long))


@torch.no_grad()
def test_one_token_at_its_position_attends_through_the_override():
    """A call may hold one token at its own position (decoding): with the other tokens'
    cached keys and values, the override gives that token's state of the full call."""
    model, ref = reference()
    idx = torch.from_numpy(ref["tokens"])
    e = model.inputs(idx)
    full = model.step(e, e, k=1)
    cache: list[tuple[torch.Tensor, torch.Tensor]] = []

    def record(q, k, v):
        cache.append((k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    model.step(e, e, [record, record], k=1)
    t = 7
    layer = iter(range(2))

    def cached(q, k, v):
        keys, values = cache[next(layer)]
        keys, values = keys[:, :, :t + 1].clone(), values[:, :, :t + 1].clone()
        keys[:, :, t:], values[:, :, t:] = k, v
        return F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)

    one = model.step(e[:, t:t + 1], e[:, t:t + 1], [cached, cached], k=1,
                     positions=torch.tensor([t]))
    torch.testing.assert_close(one[:, 0], full[:, t], **TOL)


def test_depth_training_depth_and_cost():
    model = tiny()
    assert model.loops == model.nominal_mean == 4 and model.sampler_mean == 4.0
    cfg = model.cfg
    assert OuroLM(cfg, loops=6).loops == 6  # the depth it is read at, passed in
    with pytest.raises(ValueError, match=">= 1"):
        OuroLM(cfg, loops=-1)
    size = loader.sizing(LAYOUTS["ouro"], cfg)  # counted on the meta device
    assert size.params == sum(p.numel() for p in model.parameters())
    assert size.readout_params == sum(p.numel() for p in model.reader().parameters())
    matrices = sum(p.numel() for n, p in model.model.layers.named_parameters() if p.ndim == 2)
    attention = 2 * 32 * (32 + 1)  # per layer, at the mean query position of a full context
    assert model.cost().prelude == 0
    assert model.cost().loop == 2 * matrices + 2 * attention
    assert model.cost().readout == 2 * model.lm_head.weight.numel()
    assert model.readout_eps == 1e-6


def test_paper_as_depth_sweep_runs_and_the_readout_normalizes_the_state():
    """The sweep's float64 copy of the readout (the final norm and the head) keeps
    float64; since read normalizes H_k, Lemma 1's radial cosine is at the eps floor."""
    model, ref = reference()
    idx = torch.from_numpy(ref["tokens"])
    x, y = idx[:, :-1], idx[:, 1:]
    got = summarize(measure(model, x, y, np.array([0, 1]), 2, sweep_depth=6))
    assert set(got["ppl_at_depth"]) == {f"k{k}" for k in range(1, 5)}
    _, states = run_loops(model, x, 4)
    cos, batch = radial_cosines(float64_reader(model), states[-1], y, last=True)
    assert cos.max() < 1e-5 and batch < 1e-5
    head_only = model.reader()
    head_only.forward = lambda h, last=True: F.linear(h, model.head_weight)
    cos, _ = radial_cosines(head_only.double(), states[-1], y, last=True)
    assert cos.max() > 1e-3  # a readout without the norm leaves a radial gradient


@torch.no_grad()
def test_bf16_weights_give_float32_logits_near_fp32():
    _, ref = reference()
    half = load_ouro(TINY, dtype="bfloat16")
    assert half.model.embed_tokens.weight.dtype == torch.bfloat16
    _, states = run_loops(half, torch.from_numpy(ref["tokens"]), 4)
    assert states[-1].dtype == torch.bfloat16
    logits, gates = half.read(states[-1]), half.exit_score(states[-1])
    assert logits.dtype == gates.dtype == torch.float32
    torch.testing.assert_close(logits, torch.from_numpy(ref["logits"][3]), rtol=0, atol=0.25)
    torch.testing.assert_close(gates, torch.from_numpy(ref["gates"][3]), rtol=0, atol=0.03)


# ------------------------------------------------------------ as an outside model


def test_ouro_is_an_outside_adapter():
    cfg = OutsideConfig("m", "ouro", str(TINY))
    assert outside.depth(cfg) == 4 and isinstance(outside.model_config(cfg), OuroConfig)
    assert outside.eos_token(cfg, outside.tokenizer(cfg)) == ("<|endoftext|>", 0)
    model = outside.load(OutsideConfig("m", "ouro", str(TINY), loops=6), torch.device("cpu"))
    assert isinstance(model, OuroLM) and model.loops == 6
    shape = memory.outside_shape(cfg, outside.sizing(cfg), 4)
    assert (shape.params, shape.loops, shape.context, shape.readout_blocks) == (
        sum(p.numel() for p in model.parameters()), 4, 32, 0)


def test_the_exit_mode_is_the_layouts_to_offer():
    """Ouro publishes its own exit semantics; Huginn's layout has ours alone, and asking
    it for another fails at configure, naming the key."""
    ouro = outside.resolve(OutsideConfig("m", "ouro", str(TINY), exit_mode="published"))
    assert ouro.exit_mode == "published"
    huginn = Path(__file__).parent / "fixtures" / "huginn_tiny"
    with pytest.raises(ParamsError, match="outside.m.exit_mode"):
        outside.resolve(OutsideConfig("m", "huginn", str(huginn), exit_mode="published"))


@torch.no_grad()
def test_the_published_mode_sweep_gives_each_setting_its_own_run():
    """In the published mode no run depends on its policy, so the sweep replays every
    loop of the never-exiting run: each setting's result is its own masked forward's."""
    model, ref = reference()
    idx = torch.from_numpy(ref["tokens"])
    x, y = idx[:, :-1], idx[:, 1:]
    grids = {"exit-score": [0.0, 0.2, 0.5, 0.7]}
    swept = sweep_settings(model, x, y, None, 4, 2, grids, 1, 1, freeze=False)
    for t in grids["exit-score"]:
        own = evaluate(model, x, y, None, make("exit-score", t, score=model.exit_score), 4, 2,
                       freeze=False)
        for field in ("ce", "exit_loop", "checks", "pred"):
            np.testing.assert_array_equal(getattr(swept[("exit-score", t)], field),
                                          getattr(own, field))
