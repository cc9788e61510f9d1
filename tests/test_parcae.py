"""Parcae's layout (loopscope.released.parcae): its parameter names, loading a checkpoint
directory, and the loop-by-loop comparison with Parcae's published implementation.

The comparison's fixture (tests/fixtures/parcae_tiny) was made by the published
implementation itself: parcae_lm and receval of github.com/sandyresearch/parcae at
commit dee8363b7c0e1229395edf52a7d751d4a9b9a092 (the repository on PYTHONPATH, not
installed), run with torch 2.13.0 (CPU), numpy 2.4.6, safetensors 0.8.0 and tokenizers
0.23.3 in a separate virtual environment, in float32. Nothing was stubbed: on a machine
without CUDA the published attention falls back to torch's scaled_dot_product_attention
by itself (parcae_lm/attention_backends/flash_attention.py), and its optional Triton
loss is not imported (parcae_lm/ops), neither of which a forward with the default
use_fused_head "pytorch" uses. The script that made it is kept outside the repository;
run again, it wrote the same four files byte for byte.

- config.json: the published ParcaeConfig (every field, as parcae_lm.save_pretrained
  writes it: asdict of the config and _class_name) of parcae-small-140m's settings at a
  tiny size: n_embd 32, 4 heads (num_key_value_heads 4), block_size 32, vocab_size 96
  (padding_multiple 32, so padded_vocab_size 96), intermediate_size 48, the core's
  recurrent_intermediation_embedding_dimension 64 (so the core's MLP width is read from
  its own key), recurrent_embedding_dimension 32, two prelude, two core and two coda
  blocks, mean_recurrence 4, mean_backprop_depth 2 (so, as in parcae-140m, blocks 1, 3
  and 5 use a value embedding), and parcae-140m's tie_embeddings, prelude_norm, qk_norm,
  RMSNorm (norm_eps 1e-5), ReLU2 MLP, diagonal injection, like-init state,
  init_strategy scaled-zero, sampling_scheme poisson-truncated-full, per-sequence depth
  and rope base 50000.
- model.safetensors: the published Parcae model built from that config under
  torch.manual_seed(0), then every parameter (named_parameters, sorted by name) drawn
  from torch.Generator().manual_seed(0): norm gains 1 + 0.2 N(0, 1); A_log and dt_bias
  0.5 N(0, 1); the embedding and value embeddings 0.5 N(0, 1); every matrix (B, C, q,
  k, v, projections, MLP, ve_gate) N(0, 1/fan_in). Saved by the published
  parcae_lm.save_pretrained (config.json and a torch state_dict, model.pt), whose
  state_dict was then written with safetensors.torch.save_file under the same names,
  each tensor cloned (the tied lm_head.weight shares the embedding's storage, which
  save_file refuses); so the file also holds lm_head.weight and the rotary table
  freqs_cis. The published receval loader (ModelingParcae.from_pretrained, which reads
  model.safetensors) loaded the directory back to the same weights, and that loaded
  model made the reference.
- tokenizer.json: a word-level tokenizer over 96 words made with `tokenizers` (as
  tests/test_huginn.py's write_tokenizer), Parcae's special tokens <|bos|>, <|eos|>,
  <|pad|> at ids 0, 1, 2; the tokens are two sentences it encodes, 12 tokens each.
- reference.npz: for the default positions and for positions 0, 2, ..., 22
  (position_ids), from the published model in eval mode under torch.no_grad: the
  prelude output after ln_prelude (inputs, a forward hook), the initial state the
  published initialize_state drew (initial: the adapter's first input, under
  torch.manual_seed(7), and 8 for the spread positions, before each forward), for loops
  1..6 (past mean_recurrence) the last core block's output of each loop (states, a
  forward hook) and the logits the published forward returns with num_steps_pair
  (k, 0), k = 1..6, from that same initial state (logits).

tests/fixtures/parcae_names.json holds, from the published model, the parameter names
and shapes, the tied name and the saved buffer of parcae_tiny, of a variant (untied,
no prelude norm, no qk norm, one prelude, three core and two coda blocks,
mean_recurrence 5, mean_backprop_depth 3: value embeddings and their gates on
different blocks) and of parcae-small-140m itself (parcae_lm.create_model), with each
one's config.json as save_pretrained writes it.
"""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import (
    Scripted,
    check_published_loops,
    check_sharded_load,
    loader_of,
    random_checkpoint,
)

from loopscope.base.errors import CheckpointError
from loopscope.looped.interface import LoopedModel, run_loops
from loopscope.measure.bench.runtime import score
from loopscope.measure.exit_rules.exits import KL
from loopscope.measure.exit_rules.masked import masked_forward
from loopscope.measure.per_loop.sweep import measure, summarize
from loopscope.preflight import memory
from loopscope.released import loader, outside
from loopscope.released.layouts import LAYOUTS
from loopscope.released.parcae import ParcaeConfig, ParcaeLM
from loopscope.weights.outside_config import OutsideConfig

FIXTURES = Path(__file__).parent / "fixtures"
TINY = FIXTURES / "parcae_tiny"
SPECS = json.loads((FIXTURES / "parcae_names.json").read_text())
SPEC = SPECS["parcae_tiny"]
TOL = {"rtol": 1e-5, "atol": 1e-5}  # float32 across machines; here the match is exact


load_parcae = loader_of("parcae")


def write_checkpoint(directory: Path, drop: str = "", extra: dict | None = None,
                     reshape: str = "", config: dict | None = None,
                     omit: str = "") -> dict[str, torch.Tensor]:
    """A checkpoint directory in Parcae's layout with random weights under the fixture's
    names (less `drop`, plus `extra`, `reshape` one row short; config.json less `omit`);
    returns the weights."""
    raw = {**SPEC["config"], **(config or {})}
    raw.pop(omit, None)
    weights = random_checkpoint(directory, raw, SPEC["parameters"], drop, extra, reshape)
    shutil.copy(TINY / "tokenizer.json", directory / "tokenizer.json")
    return weights


def reference() -> tuple[ParcaeLM, dict[str, np.ndarray]]:
    return load_parcae(TINY), dict(np.load(TINY / "reference.npz"))


def tiny() -> ParcaeLM:
    return ParcaeLM(ParcaeConfig.from_json(SPEC["config"]))


# ------------------------------------------------------------------ names and loading


@pytest.mark.parametrize("name", ["parcae_tiny", "parcae_variant", "parcae_140m"])
def test_the_layout_has_parcaes_parameter_names_and_shapes(name):
    """The published model's names and shapes, at the fixture's config, a variant's and
    parcae-140m's (built on the meta device)."""
    spec = SPECS[name]
    with torch.device("meta"):
        model = ParcaeLM(ParcaeConfig.from_json(spec["config"]))
    assert {n: list(p.shape) for n, p in model.named_parameters()} == spec["parameters"]
    assert set(model.state_dict()) == set(spec["parameters"])  # no saved buffer of ours
    assert (model.lm_head is None) == (spec["shared"] == ["lm_head.weight"])
    assert list(spec["buffers"]) == ["freqs_cis"]


def test_load_parcae_loads_every_parameter_by_name(tmp_path):
    weights = write_checkpoint(tmp_path)
    model = load_parcae(tmp_path)
    state = model.state_dict()
    assert set(state) == set(weights)
    for name, value in weights.items():
        assert torch.equal(state[name], value), name
    assert model.head_weight is model.transformer.wte.weight  # tied, as config.json says
    assert model.tokenizer.get_vocab_size() == 96 and not model.training
    assert not any(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("fault, words", [
    ({"drop": "transformer.core_block.1.attn.ve_gate.weight"},
     ["transformer.core_block.1.attn.ve_gate.weight", "is missing", "model.safetensors"]),
    ({"drop": "value_embeds.3.weight"}, ["value_embeds.3.weight (96, 32) is missing"]),
    ({"extra": {"transformer.core_block.2.norm_1.weight": torch.ones(32)}},
     ["model.safetensors: transformer.core_block.2.norm_1.weight", "not a parameter of Parcae"]),
    ({"reshape": "transformer.adapter.B"},
     ["model.safetensors: transformer.adapter.B", "(31, 32)", "(32, 32)"]),
    ({"extra": {"lm_head.weight": torch.zeros(96, 31)}},
     ["model.safetensors: lm_head.weight has shape (96, 31)"]),
    ({"config": {"injection_type": "linear"}}, ["config.json", "injection_type is 'linear'"]),
    ({"omit": "norm_class_name"}, ["config.json", "norm_class_name is 'LayerNorm' (the "
                                   "published default"]),
    ({"omit": "mean_backprop_depth"}, ["config.json", "missing mean_backprop_depth"]),
    ({"config": {"recurrent_iteration_method": "per-batch"}}, ["recurrent_iteration_method"]),
    ({"config": {"num_key_value_heads": 2}}, ["config.json", "num_key_value_heads is 2"]),
    ({"config": {"recurrent_embedding_dimension": 64}}, ["recurrent_embedding_dimension is 64"]),
    ({"config": {"_class_name": "GPTConfig"}}, ["config.json", "_class_name is 'GPTConfig'"]),
    ({"config": {"rope_settings": {"rope_condense_ratio": 2}}}, ["config.json", "rope_settings"]),
    ({"config": {"n_embd": 16, "recurrent_embedding_dimension": 16}},
     ["config.json", "n_embd 16 is below 32"]),
])
def test_a_checkpoint_that_does_not_fit_fails_naming_file_and_parameter(tmp_path, fault, words):
    write_checkpoint(tmp_path, **fault)
    with pytest.raises(CheckpointError) as err:
        load_parcae(tmp_path)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_the_published_extras_are_accepted_and_checked(tmp_path):
    """The fixture holds what the published state_dict holds beyond the parameters (the
    tied head and the rotary table); a table of another rope base is refused."""
    assert {"lm_head.weight", "freqs_cis"} <= set(loader.weight_files(TINY))
    model = load_parcae(TINY)
    assert torch.equal(model.head_weight, model.transformer.wte.weight)
    other = model.rotary.table()  # the fixture's table at base 10000 instead of 50000
    model.rotary.base = 10_000.0
    cos, sin = model.rotary.table()
    table = torch.stack([cos, sin], dim=-1)[None, :, None]
    assert not torch.allclose(cos, other[0])
    write_checkpoint(tmp_path, extra={"freqs_cis": table})
    with pytest.raises(CheckpointError, match="freqs_cis is not the rotary table"):
        load_parcae(tmp_path)


def test_sharded_weights_load_through_their_index(tmp_path):
    check_sharded_load(tmp_path, write_checkpoint(tmp_path), load_parcae)


# --------------------------------------------- the comparison with the published model


@pytest.mark.parametrize("positions", ["", "spread_"], ids=["default", "spread"])
def test_states_and_logits_match_the_published_implementation_loop_by_loop(positions):
    """e is the prelude's output after ln_prelude; each loop's state is the last core
    block's output; read gives the published forward's logits at that many loops."""
    check_published_loops(*reference(), positions, TOL)


@torch.no_grad()
def test_the_comparison_fails_on_a_wrong_injection_or_a_skipped_norm():
    """e B instead of e B^T, the decay without exp(A_log), or no ln_prelude: each is
    caught at the first loop."""
    _, ref = reference()
    idx, h0 = torch.from_numpy(ref["tokens"]), torch.from_numpy(ref["initial"])
    first = torch.from_numpy(ref["states"][0])

    def state_after(change) -> torch.Tensor:
        model = load_parcae(TINY)
        change(model)
        return model.step(h0, model.inputs(idx), k=1)

    torch.testing.assert_close(state_after(lambda m: None), first, **TOL)
    wrongs = [lambda m: m.transformer.adapter.B.copy_(m.transformer.adapter.B.T.clone()),
              lambda m: m.transformer.adapter.A_log.zero_(),
              lambda m: m.transformer.__setitem__("ln_prelude", torch.nn.Identity())]
    for wrong in wrongs:
        assert not torch.allclose(state_after(wrong), first, **TOL)


@torch.no_grad()
def test_the_interface_runs_parcaes_layout():
    """run_loops gives the published per-loop states; the masked forward with a KL
    policy, its attention through the overrides, gives the uniform-depth state and the
    published logits where nothing exits, and exits tokens where the threshold lets it."""
    model, ref = reference()
    assert isinstance(model, LoopedModel)
    assert (model.prelude_blocks, model.kv_blocks, model.coda_blocks) == (2, 2, 2)
    idx, h0 = torch.from_numpy(ref["tokens"]), torch.from_numpy(ref["initial"])
    _, states = run_loops(model, idx, 6, h0=h0)
    torch.testing.assert_close(torch.stack(states), torch.from_numpy(ref["states"]), **TOL)
    never = masked_forward(model, idx, KL(0.0), cap=6, h0=h0)
    torch.testing.assert_close(never.state, states[-1], **TOL)
    assert (never.exit_loop == 6).all()
    torch.testing.assert_close(never.logits, torch.from_numpy(ref["logits"][-1]), **TOL)
    some = masked_forward(model, idx, KL(0.05), cap=6, h0=h0)
    assert (some.exit_loop < 6).any() and torch.isfinite(some.logits).all()


@torch.no_grad()
def test_the_attention_override_gets_the_heads_after_the_rotary_embedding_and_qk_norm():
    model, ref = reference()
    idx, h0 = torch.from_numpy(ref["tokens"]), torch.from_numpy(ref["initial"])
    e = model.inputs(idx)
    seen = []

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        seen.append((tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        assert torch.allclose(k.pow(2).mean(-1), torch.ones(()), atol=1e-4)  # qk norm
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    h = model.step(h0, e, [attend, attend], k=1)
    assert seen == [((2, 4, 12, 8),) * 3] * 2
    torch.testing.assert_close(h, torch.from_numpy(ref["states"][0]), **TOL)
    assert not torch.allclose(model.step(h0, e, [lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v)] * 2, k=1), h, **TOL)  # an override without the causal mask differs
    with pytest.raises(ValueError, match="1 attention overrides for 2 core blocks"):
        model.step(h0, e, [attend], k=1)
    torch.testing.assert_close(model.read(h, kvs=[attend, attend]),
                               torch.from_numpy(ref["logits"][0]), **TOL)
    torch.testing.assert_close(model.inputs(idx, kvs=[attend, attend]), e, **TOL)


@torch.no_grad()
def test_step_and_read_need_the_ids_of_the_batch_inputs_was_given():
    """The core's and coda's value embeddings read token ids the interface does not
    pass: a state of another batch, or the exit runtime's subset of the tokens, is
    refused, never read with the wrong ids."""
    model, ref = reference()
    idx, h0 = torch.from_numpy(ref["tokens"]), torch.from_numpy(ref["initial"])
    with pytest.raises(ValueError, match="token ids `inputs` was given"):
        tiny().read(h0)  # no batch yet
    e = model.inputs(idx)
    with pytest.raises(ValueError, match="token ids `inputs` was given"):
        model.step(h0[:1], e[:1], k=1)
    with pytest.raises(ValueError, match="token ids `inputs` was given"):
        model.step(h0, e, k=1, positions=torch.arange(1, 13))
    with pytest.raises(ValueError, match="subset of the tokens"):
        model.read(h0[:, :3], positions=torch.arange(3), kvs=[None, None])
    exit_at = torch.randint(1, 5, idx.shape, generator=torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="subset of the tokens"):
        score(model, idx, Scripted(exit_at), cap=4, h0=h0)
    assert torch.equal(model.step(h0, e, k=torch.tensor([1, 3])), model.step(h0, e, k=1))
    with pytest.raises(ValueError, match="1-based"):
        model.step(h0, e, k=0)


def test_paper_as_depth_sweep_runs_on_parcaes_layout():
    """The sweep's float64 copy of the readout (C, the coda with its value embeddings,
    ln_f, the head) reads the batch the sweep's own loops were given."""
    model, ref = reference()
    idx = torch.from_numpy(ref["tokens"])
    x, y = idx[:, :-1], idx[:, 1:]
    got = summarize(measure(model, x, y, np.array([0, 1]), 2, sweep_depth=6))
    assert set(got["ppl_at_depth"]) == {f"k{k}" for k in range(1, 5)}
    assert all(np.isfinite(v) for v in got["radial_fraction_token"].values())
    reader = model.reader()
    assert set(dict(reader.named_parameters())) == {
        "transformer.C.weight", "transformer.wte.weight", "transformer.ln_f.weight",
        "value_embeds.5.weight", *(f"transformer.coda.{n}" for n, _ in
                                   model.transformer.coda.named_parameters())}
    wide = model.double()
    h = wide.step(torch.from_numpy(ref["initial"]).double(), wide.inputs(idx), k=1)
    assert h.dtype == wide.read(h).dtype == torch.float64


@torch.no_grad()
def test_bf16_weights_give_float32_logits_near_fp32():
    _, ref = reference()
    half = load_parcae(TINY, dtype="bfloat16")
    assert half.transformer.wte.weight.dtype == torch.bfloat16
    idx, h0 = torch.from_numpy(ref["tokens"]), torch.from_numpy(ref["initial"])
    _, states = run_loops(half, idx, 4, h0=h0)
    logits = half.read(states[-1])
    assert states[-1].dtype == torch.bfloat16 and logits.dtype == torch.float32
    torch.testing.assert_close(logits, torch.from_numpy(ref["logits"][3]), rtol=0, atol=0.5)
    rounded = half.rotary.cos.to(torch.bfloat16).float()
    assert torch.equal(half.rotary.cos, rounded)  # the table as the published bf16 model's


# ------------------------------------------------------ depth, initial state, cost


def test_the_training_depth_is_parcaes_sampler():
    """poisson-truncated-full per sequence: max(Poisson(m), 1) loops, m = 4 here."""
    model = tiny()
    assert model.loops == model.nominal_mean == 4
    assert model.sampler_mean == pytest.approx(4 + math.exp(-4))
    assert ParcaeLM(model.cfg, loops=6).loops == 6  # the depth it is read at, passed in
    g = torch.Generator().manual_seed(0)
    draws = [model.sample_depth(g) for _ in range(4000)]
    assert min(draws) >= 1 and abs(np.mean(draws) - model.sampler_mean) < 0.15
    big = ParcaeConfig.from_json(SPECS["parcae_140m"]["config"])
    assert ParcaeLM(big).loops == 8 and big.context == 2048 and big.vocab_size == 32768


def test_the_initial_state_is_parcaes_like_init_noise_from_the_generator():
    model = tiny()
    e = torch.zeros(4, 16, 32)
    h = model.initial_state(e, torch.Generator().manual_seed(3))
    assert torch.equal(h, model.initial_state(e, torch.Generator().manual_seed(3)))
    sigma = (2 / (5 * 32)) ** 0.5
    assert h.abs().max() <= 3 * sigma + 1e-6
    assert abs(h.std().item() - 0.986 * sigma) < 0.01  # +-3 sigma truncation
    _, ref = reference()
    assert abs(float(ref["initial"].std()) - 0.986 * sigma) < 0.01  # the published draw's


def test_the_cost_counts_every_matrix_a_token_passes():
    model = tiny()
    t = model.transformer
    matrices = lambda part: sum(p.numel() for n, p in part.named_parameters()  # noqa: E731
                                if p.ndim == 2 and "ve_gate" not in n)
    attention = 2 * 32 * (32 + 1)  # per block, at the mean query position of a full context
    gate = 2 * 32 * 4  # the one block per part whose value embedding is gated
    assert model.cost().prelude == 2 * matrices(t.prelude) + 2 * attention + gate
    assert model.cost().loop == 2 * (matrices(t.core_block) + 32 * 32) + 2 * attention + gate
    assert model.cost().readout == (2 * (32 * 32 + matrices(t.coda) + 96 * 32)
                                    + 2 * attention + gate)
    size = loader.sizing(LAYOUTS["parcae"], model.cfg)  # counted on the meta device
    assert size.params == sum(p.numel() for p in model.parameters())
    assert size.readout_params == sum(p.numel() for p in model.reader().parameters())
    assert size.intermediate == 64 and model.readout_eps == 1e-5


def test_positions_are_checked():
    model = tiny()
    idx = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 32\)"):
        model.inputs(idx, positions=torch.arange(30, 34))
    with pytest.raises(ValueError, match="exceeds the context 32"):
        model.inputs(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="positions give 3 tokens, the input 4"):
        model.inputs(idx, positions=torch.arange(3))


# ------------------------------------------------------------ as an outside model


def test_parcae_is_an_outside_adapter():
    cfg = OutsideConfig("m", "parcae", str(TINY))
    assert outside.depth(cfg) == 4 and isinstance(outside.model_config(cfg), ParcaeConfig)
    assert outside.eos_token(cfg, outside.tokenizer(cfg)) == ("<|eos|>", 1)
    model = outside.load(OutsideConfig("m", "parcae", str(TINY), loops=6), torch.device("cpu"))
    assert isinstance(model, ParcaeLM) and model.loops == 6
    shape = memory.outside_shape(cfg, outside.sizing(cfg), 4)
    assert (shape.params, shape.loops, shape.context, shape.readout_blocks) == (
        sum(p.numel() for p in model.parameters()), 4, 32, 2)
    assert outside.resolve(cfg).exit_mode == "frozen"
