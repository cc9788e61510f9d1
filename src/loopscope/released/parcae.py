"""Parcae's layout: the stable looped language models of Prairie et al. 2026 (Parcae,
released as parcae-140m, -370m, -770m and -1.3b) as looped models.

Written here from the published code's facts (github.com/sandyresearch/parcae,
parcae_lm/models/parcae and parcae_lm/modules) and checked, loop by loop, against that
code at a tiny configuration (tests/test_parcae.py):

    tokens -> embedding -> prelude (n_layers_in_prelude blocks) -> ln_prelude = e
    H_0: noise (a truncated normal, +-3 sigma, sigma = sqrt(2/(5d)))
    loop k: H_k = core(decay * H_{k-1} + dt * B e)    (n_layers_in_recurrent_block blocks)
            dt = softplus(dt_bias), decay = exp(-dt * exp(A_log)), per channel
    read:   logits = head(ln_f(coda(C H_k)))

- the injection is Parcae's constrained ("stable") one: a diagonal decay in (0, 1) on
  the state, so the map from H_{k-1} to the core's input contracts whatever the
  weights, plus dt times a learned matrix B of e; e enters every loop;
- C, a linear map, takes the state into the coda's space (both are n_embd wide here);
- a block is pre-norm: x = x + attn(norm_1(x)); x = x + mlp(norm_2(x)), every norm an
  RMSNorm computed in float32 (norm_eps) and cast back before its gain;
- attention: separate c_q, c_k, c_v, c_proj without bias, the rotary embedding on
  interleaved channel pairs (2i, 2i + 1) (base rope_settings.rope_base; the table
  the checkpoint saves, freqs_cis, as the published model computes with it:
  after_load), then a parameter-free RMSNorm of each query and key head (qk_norm, eps
  of its dtype), causal scaled dot-product attention at scale 1 / sqrt(head_dim);
- value embeddings: some blocks add to their values a per-token embedding of the
  token id (value_embeds.<i>, i counting the prelude, core and coda blocks once),
  gated per key head by 2 sigmoid(ve_gate(x[..., :32])); the published model gives
  block i an embedding where i has the parity of its last block, and a gate where the
  block's layer id has the parity of n_layers_in_recurrent_block * mean_backprop_depth
  - 1 (a coda block's layer id counts the core mean_recurrence times); a block with
  one and not the other adds nothing;
- the MLP is proj(relu(fc(x))^2 / 2) (ReLU2);
- the head is the embedding when tie_embeddings (the released models), else lm_head,
  the logits float32, soft-capped where logit_softcap is set.

Token ids beyond the prelude: the core's and the coda's value embeddings read each
token's id, which the looped-model interface does not pass to `step` and `read`. As the
published forward keeps its input ids on the model for its core, `inputs` records the
ids of its batch (Tokens), and `step` and `read` use them for a state of that batch
(the same tokens and positions), refusing any other: a subset of the tokens (the exit
runtime's gathered and decoding calls, which pass both positions and attention
overrides) has no ids here, so the exit runtime (loopscope.measure.bench.runtime) does
not run on this layout.

The parameters carry Parcae's names (transformer.wte, transformer.prelude.<i>...,
transformer.ln_prelude, transformer.adapter.{A_log,dt_bias,B}, transformer.core_block.<i>...,
transformer.C, transformer.coda.<i>..., transformer.ln_f, value_embeds.<i>, lm_head), so a
checkpoint directory in Parcae's layout loads by name (loopscope.released.loader.load).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from tokenizers import Tokenizer

from loopscope.base.errors import CheckpointError
from loopscope.looped.types import KV, Cost, Spec, Specified
from loopscope.released.huginn import HuginnNorm, Rotary, rotate, widened
from loopscope.released.layouts import (
    Files,
    LayoutReader,
    checked_positions,
    register,
    tied_head,
)

ROTARY_TABLE = "freqs_cis"  # the published model's rotary table, a saved buffer
TIED_HEAD = "lm_head.weight"  # the tied head, saved beside the embedding it is
GATE_CHANNELS = 32  # the value-embedding gate reads a block input's first 32 channels


# Parcae's config.json, read into the options loopscope.released.parcae builds from.
#
# The published save_pretrained writes every field of its config class (asdict) and
# _class_name. Keys that set a shape, or which blocks carry value embeddings and gates
# (mean_recurrence, mean_backprop_depth), are required; the others take the published
# class's defaults when absent. A key naming a variant this layout does not implement
# is refused with its key (where config.json omits it, its published default is
# checked: the class's norm is LayerNorm, its MLP's GELU, its depth sampler per-batch).
# Keys that only training reads (attn_impl, activation_checkpoint_impl, lockstep_*,
# curriculum_target, init_orthogonal, ...) are ignored.
SCALED = ("scaled", "scaled-zero", "scaled-geiping", "small")  # sigma sqrt(2/(5d)), no scales
VARIANTS: dict[str, tuple[Any, tuple[Any, ...]]] = {  # key -> (published default, implemented)
    "_class_name": ("ParcaeConfig", ("ParcaeConfig",)),
    "model_class_name": ("Parcae", ("Parcae",)),
    "block_class_name": ("TransformerPreNormBlock", ("TransformerPreNormBlock",)),
    "norm_class_name": ("LayerNorm", ("RMSNorm",)),
    "mlp_class_name": ("BaseMLP", ("BaseMLP",)), "nonlin_name": ("GELU", ("ReLU2",)),
    "injection_type": ("diagonal", ("diagonal",)), "state_init": ("like-init", ("like-init",)),
    "init_strategy": ("scaled", SCALED),
    "sampling_scheme": ("poisson-truncated-full", ("poisson-truncated-full",)),
    "recurrent_iteration_method": ("per-batch", ("per-sequence", "per-token")),
    "use_fused_head": ("pytorch", ("pytorch", "cce")),
    "bias": (False, (False,)), "qk_bias": (False, (False,)), "clip_qkv": (None, (None,)),
    "use_abacus": (False, (False,)), "randomize_positions_from": (None, (None,)),
    "mup_model_scaling_factor": (1, (1,)), "debias_attention": (False, (False,)),
    "center_attention": (False, (False,))}
REQUIRED = ("n_embd", "num_attention_heads", "vocab_size", "block_size",
            "n_layers_in_prelude", "n_layers_in_recurrent_block", "n_layers_in_coda",
            "recurrent_embedding_dimension", "recurrent_intermediation_embedding_dimension",
            "mean_recurrence", "mean_backprop_depth")
DEFAULTS: dict[str, Any] = {"padding_multiple": 512, "norm_eps": 1e-5, "tie_embeddings": False,
                            "prelude_norm": False, "qk_norm": False, "logit_softcap": None}


def alternate(i: int, n: int) -> bool:
    """The published parity rule (has_ve): block i of n carries a value embedding (or a
    gate) where i has the parity of n - 1, so the last one always does."""
    return i % 2 == (n - 1) % 2


@dataclass(frozen=True)
class ParcaeConfig:
    """The options of Parcae's layout, in loopscope's words; each field's comment names
    the config.json key it comes from."""

    d_model: int  # n_embd, = recurrent_embedding_dimension (refused otherwise)
    n_heads: int  # num_attention_heads, = num_key_value_heads = the core's heads
    mlp_width: int  # intermediate_size: the prelude's and the coda's MLP
    core_mlp_width: int  # recurrent_intermediation_embedding_dimension: the core's MLP
    vocab_size: int  # padded_vocab_size: the embedding's rows
    context: int  # block_size: the rotary table's length, the longest window
    n_prelude: int  # n_layers_in_prelude
    n_core: int  # n_layers_in_recurrent_block
    n_coda: int  # n_layers_in_coda
    mean_recurrence: int  # the depth it is read at (R), the training sampler's mean
    mean_backprop_depth: int  # the loops of a training step that built a graph
    tie_embeddings: bool = False  # the head is the embedding
    prelude_norm: bool = False  # ln_prelude on the prelude's output
    qk_norm: bool = False  # a parameter-free RMSNorm of each query and key head
    logit_softcap: float | None = None  # softcap * tanh(logits / softcap)
    norm_eps: float = 1e-5
    rope_base: float = 50_000.0  # rope_settings.rope_base

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def intermediate(self) -> int:
        """The widest MLP: what the memory estimate sizes a block's activations by."""
        return max(self.mlp_width, self.core_mlp_width)

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "mlp_width", "core_mlp_width", "vocab_size",
                     "context", "n_core", "mean_recurrence"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("n_prelude", "n_coda", "mean_backprop_depth"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.d_model % self.n_heads or self.head_dim % 2:
            raise ValueError(f"n_embd {self.d_model} must split into {self.n_heads} heads of "
                             "an even width (the rotary embedding turns channel pairs)")
        if self.d_model < GATE_CHANNELS:
            raise ValueError(f"n_embd {self.d_model} is below {GATE_CHANNELS}, the channels "
                             "the published value-embedding gate reads")
        if self.norm_eps <= 0 or self.rope_base <= 0:
            raise ValueError("norm_eps and rope_settings.rope_base must be > 0")
        if self.logit_softcap is not None and self.logit_softcap <= 0:
            raise ValueError(f"logit_softcap must be > 0 or null, got {self.logit_softcap}")

    def layers(self, part: str) -> list[tuple[int, int]]:
        """(layer id, value-embedding index) of each block of a part ("prelude", "core",
        "coda"), as the published model numbers them: the layer ids count the core
        mean_recurrence times, the embeddings' indices once."""
        p, c = self.n_prelude, self.n_core
        first, index, n = {"prelude": (0, 0, p), "core": (p, p, c),
                           "coda": (p + c * self.mean_recurrence, p + c, self.n_coda)}[part]
        return [(first + i, index + i) for i in range(n)]

    def gated(self, layer_id: int) -> bool:
        """Whether a block has a value-embedding gate (ve_gate)."""
        return alternate(layer_id, self.n_core * self.mean_backprop_depth)

    def embedded(self) -> list[int]:
        """The indices of the blocks with a value embedding (value_embeds.<i>)."""
        n = self.n_prelude + self.n_core + self.n_coda
        return [i for i in range(n) if alternate(i, n)]

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ParcaeConfig:
        """The options a config.json dict sets (Parcae's keys); ValueError naming the key
        for a missing, contradictory or unsupported one."""
        missing = [k for k in REQUIRED if k not in raw]
        if missing:
            raise ValueError(f"missing {', '.join(missing)} (Parcae's layout needs them)")
        for key, (default, implemented) in VARIANTS.items():
            value = raw.get(key, default)
            if value not in implemented or type(value) is not type(implemented[0]):
                where = "" if key in raw else " (the published default; config.json omits it)"
                raise ValueError(f"{key} is {value!r}{where}; Parcae's layout implements "
                                 f"{' or '.join(map(repr, implemented))}")
        get = {**DEFAULTS, **raw}.__getitem__
        heads, d = int(raw["num_attention_heads"]), int(raw["n_embd"])
        _same_widths(raw, heads, d)
        rope = {"use_rope": True, "rope_condense_ratio": 1, "rope_base": 50_000,
                **(raw.get("rope_settings") or {})}
        if rope["use_rope"] is not True or rope["rope_condense_ratio"] != 1:
            raise ValueError(f"rope_settings is {rope}; Parcae's layout implements use_rope "
                             "true with rope_condense_ratio 1")
        step = int(get("padding_multiple"))  # the published find_multiple
        vocab = int(raw.get("padded_vocab_size") or -(-int(raw["vocab_size"]) // step) * step)
        softcap = get("logit_softcap")
        return cls(
            d_model=d, n_heads=heads, mlp_width=int(raw.get("intermediate_size") or 4 * d),
            core_mlp_width=int(raw["recurrent_intermediation_embedding_dimension"]),
            vocab_size=vocab, context=int(raw["block_size"]),
            n_prelude=int(raw["n_layers_in_prelude"]),
            n_core=int(raw["n_layers_in_recurrent_block"]), n_coda=int(raw["n_layers_in_coda"]),
            mean_recurrence=int(raw["mean_recurrence"]),
            mean_backprop_depth=int(raw["mean_backprop_depth"]),
            tie_embeddings=bool(get("tie_embeddings")), prelude_norm=bool(get("prelude_norm")),
            qk_norm=bool(get("qk_norm")), logit_softcap=None if softcap is None else float(softcap),
            norm_eps=float(get("norm_eps")), rope_base=float(rope["rope_base"]))


def _same_widths(raw: dict[str, Any], heads: int, d: int) -> None:
    """The widths this layout implements: no grouped-query heads, and a core as wide,
    with as many heads, as the prelude and the coda (as every released config). The
    published model runs a core value embedding at the prelude's key/value width, so
    it cannot run most configs that differ here."""
    checks = (("num_key_value_heads", heads), ("recurrent_num_attention_heads", heads),
              ("recurrent_embedding_dimension", d))
    for key, wanted in checks:
        value = raw.get(key)
        if value is not None and int(value) != wanted:
            raise ValueError(f"{key} is {value}; Parcae's layout implements {wanted} (no "
                             "grouped-query heads; a core of the prelude's width and heads)")


# Parcae's RMSNorm computes as Huginn's: normalized in float32 (or wider), cast back to
# the input's dtype, then scaled by the gain
ParcaeNorm = HuginnNorm


class Attention(nn.Module):
    """Parcae's causal self-attention (see the module doc), with an optional override.

    The override contract: kv(q, k, v) -> y receives the tokens of this call as
    q, k and v (B, n_heads, T, head_dim) in the model's dtype; q and k already carry
    the rotary embedding at the call's positions and the qk norm, v its value
    embedding. It returns y in the same layout and applies the causal mask and the
    scale 1 / sqrt(head_dim) itself."""

    def __init__(self, cfg: ParcaeConfig, gated: bool) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.qk_norm = cfg.n_heads, cfg.head_dim, cfg.qk_norm
        d = cfg.d_model
        self.c_q = nn.Linear(d, d, bias=False)
        self.c_k = nn.Linear(d, d, bias=False)
        self.c_v = nn.Linear(d, d, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)
        self.ve_gate = nn.Linear(GATE_CHANNELS, cfg.n_heads, bias=False) if gated else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv: KV | None = None, ve: torch.Tensor | None = None) -> torch.Tensor:
        b, t, d = x.shape
        shape = (b, t, self.n_heads, self.head_dim)
        q, k, v = self.c_q(x).view(shape), self.c_k(x).view(shape), self.c_v(x).view(shape)
        if ve is not None and self.ve_gate is not None:
            gate = 2 * torch.sigmoid(self.ve_gate(x[..., :GATE_CHANNELS]))
            v = v + gate.unsqueeze(-1) * ve.view(shape)
        q, k = rotate(q, *rope), rotate(k, *rope)
        if self.qk_norm:
            q, k = F.rms_norm(q, (self.head_dim,)), F.rms_norm(k, (self.head_dim,))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        y = kv(q, k, v) if kv is not None else F.scaled_dot_product_attention(
            q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class ReLU2MLP(nn.Module):
    """proj(relu(fc(x))^2 / 2): the published BaseMLP with its ReLU2."""

    def __init__(self, d: int, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, width, bias=False)
        self.proj = nn.Linear(width, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.relu(self.fc(x)).pow(2).mul(0.5))


class Block(nn.Module):
    """x = x + attn(norm_1(x)); x = x + mlp(norm_2(x)) (TransformerPreNormBlock)."""

    def __init__(self, cfg: ParcaeConfig, width: int, gated: bool) -> None:
        super().__init__()
        self.norm_1 = ParcaeNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, gated)
        self.norm_2 = ParcaeNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = ReLU2MLP(cfg.d_model, width)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv: KV | None = None, ve: torch.Tensor | None = None) -> torch.Tensor:
        x = self.attn(self.norm_1(x), rope, kv, ve) + x
        return self.mlp(self.norm_2(x)) + x


class DiagonalInjection(nn.Module):
    """Parcae's injection: decay * h + dt * (e B^T), dt = softplus(dt_bias) and decay =
    exp(-dt exp(A_log)) per channel. decay lies in (0, 1) for any weights: the stable
    part, the state's own map before the core is a contraction."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.A_log = nn.Parameter(torch.zeros(d))
        self.dt_bias = nn.Parameter(torch.zeros(d))
        self.B = nn.Parameter(torch.zeros(d, d))

    def coefficients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(decay, dt) per channel."""
        dt = F.softplus(self.dt_bias)
        return torch.exp(-dt * torch.exp(self.A_log)), dt

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        decay, dt = self.coefficients()
        return h * decay + dt * (e @ self.B.T)


class Tokens:
    """The token ids (and positions) of the batch `inputs` was last given, which the
    core's and the coda's value embeddings read (module doc). Shared, not copied, by a
    deep copy (the depth sweep's float64 copy of the readout reads the live batch)."""

    def __init__(self) -> None:
        self.ids: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None

    def __deepcopy__(self, memo: dict) -> Tokens:
        return self

    def of(self, h: torch.Tensor, positions: torch.Tensor | None, kvs: list[KV] | None
           ) -> torch.Tensor:
        """The ids of a state's tokens: those `inputs` recorded, for a state of that
        batch at the same positions; a ValueError for any other call."""
        if kvs is not None and positions is not None:
            raise ValueError("Parcae's value embeddings need each token's id: a call on a "
                             "subset of the tokens (attention overrides at given positions, "
                             "the exit runtime's) has none; loopscope's interface passes no "
                             "ids to step and read")
        ids = self.ids
        if ids is None or tuple(h.shape[:2]) != tuple(ids.shape) or not torch.equal(
                _spread(positions, ids.shape), _spread(self.positions, ids.shape)):
            raise ValueError("Parcae's value embeddings read the token ids `inputs` was "
                             "given: step and read take a state of that batch (its shape "
                             "and positions) only")
        return ids.to(h.device)


def _spread(positions: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
    """Positions (T,) or (B, T), or None (0 .. T - 1), as a (B, T) tensor on the CPU."""
    if positions is None:
        positions = torch.arange(shape[1])
    return positions.cpu().expand(shape)


def cost(cfg: ParcaeConfig) -> Cost:
    """Forward FLOPs per token of Parcae's layout at a config: 2 per weight of every
    matrix a token goes through (a value embedding is a lookup; its gate, 32 x heads,
    counts where the block uses it), plus attention's two products at the mean query
    position of a full context (2 d (T + 1) per block), as loopscope.weights.model.cost
    counts them. A loop adds B (d x d), a readout C (d x d) and the head. A function of
    the config alone, so `plan` needs no weights."""
    d, embedded = cfg.d_model, set(cfg.embedded())

    def part(name: str, width: int) -> float:
        total = 0.0
        for layer_id, index in cfg.layers(name):
            gate = GATE_CHANNELS * cfg.n_heads if cfg.gated(layer_id) and index in embedded else 0
            total += 2 * (4 * d * d + 2 * d * width + gate) + 2 * d * (cfg.context + 1)
        return total

    return Cost(prelude=part("prelude", cfg.mlp_width),
                loop=part("core", cfg.core_mlp_width) + 2 * d * d,
                readout=2 * d * d + part("coda", cfg.mlp_width) + 2 * d * cfg.vocab_size)


def _overrides(kvs: list[KV] | None, blocks: int, part: str) -> None:
    """A ValueError where a part is given another number of attention overrides than it
    has blocks."""
    if kvs is not None and len(kvs) != blocks:
        raise ValueError(f"{len(kvs)} attention overrides for {blocks} {part} blocks")


def extras(cfg: ParcaeConfig) -> dict[str, tuple[int, ...]]:
    """Tensors a published checkpoint holds beyond the parameters: its rotary table and,
    tied, the head (the embedding under a second name), shape-checked, not loaded."""
    found = {ROTARY_TABLE: (1, cfg.context, 1, cfg.head_dim // 2, 2)}
    if cfg.tie_embeddings:
        found[TIED_HEAD] = (cfg.vocab_size, cfg.d_model)
    return found


def after_load(model: nn.Module, files: Files, device: torch.device | str) -> None:
    """The rotary table the published model computes with: the checkpoint's saved
    freqs_cis, checked against the one config.json's rope base and block_size give (to
    2 eps of its dtype), else the exact one; in the weights' dtype, as the published
    loaders' model.to(dtype) casts that buffer (a bf16 model turns by bf16-rounded
    angles), then widened to float32 for the rotation."""
    rotary = model.rotary
    rotary.rebuild(device)
    table = torch.stack([rotary.cos, rotary.sin], dim=-1)[None, :, None]
    found = files.get(ROTARY_TABLE)
    if found is not None:
        with safe_open(str(found[0]), framework="pt") as f:
            saved = f.get_tensor(ROTARY_TABLE)
        tol = max(1e-5, 2 * torch.finfo(saved.dtype).eps)
        if not torch.allclose(saved.float(), table.cpu(), atol=tol, rtol=0.0):
            raise CheckpointError(f"{found[0]}: {ROTARY_TABLE} is not the rotary table of "
                                  f"config.json's rope_settings.rope_base {rotary.base} "
                                  f"and block_size {rotary.context}")
        table = saved
    rotary.use(table.to(model.transformer.wte.weight.dtype))


@register("parcae", config=ParcaeConfig, eos="<|eos|>", title="Parcae's", optional=extras,
          after_load=after_load)
class ParcaeLM(Specified, nn.Module):
    """Parcae's layout with the looped-model interface (loopscope.looped.interface).

    The module tree repeats the published one, so that named_parameters() are Parcae's
    parameter names. Precision: the weights' dtype (fp32 on CPU, bf16 on a GPU); norms
    and the rotary embedding compute in float32 either way, and the logits are
    float32. gathers: False, the exit runtime's calls on a subset of a batch's tokens
    carry no token ids for the value embeddings, so its benchmark is not run."""

    gathers = False

    def __init__(self, cfg: ParcaeConfig, loops: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        d, v = cfg.d_model, cfg.vocab_size

        def blocks(part: str, width: int) -> nn.ModuleList:
            return nn.ModuleList(Block(cfg, width, cfg.gated(layer_id))
                                 for layer_id, _ in cfg.layers(part))

        parts = dict(wte=nn.Embedding(v, d), prelude=blocks("prelude", cfg.mlp_width),
                     adapter=DiagonalInjection(d), core_block=blocks("core", cfg.core_mlp_width),
                     C=nn.Linear(d, d, bias=False), coda=blocks("coda", cfg.mlp_width),
                     ln_f=ParcaeNorm(d, cfg.norm_eps))
        if cfg.prelude_norm:
            parts["ln_prelude"] = ParcaeNorm(d, cfg.norm_eps)
        self.transformer = nn.ModuleDict(parts)
        self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(v, d) for i in cfg.embedded()})
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(d, v, bias=False)
        self.rotary = Rotary(cfg.head_dim, cfg.context, cfg.rope_base)
        self.tokens = Tokens()
        self.tokenizer: Tokenizer | None = None  # set by the loader
        # The interface's sizes (Spec). R: the depth it is read at, passed in (an outside
        # model's `loops`), else mean_recurrence, the depth the published evaluation
        # runs. The training depth: r = max(Poisson(m), 1) per sequence, m =
        # max(mean_recurrence, mean_backprop_depth), so E[r] = m + exp(-m).
        nominal = max(cfg.mean_recurrence, cfg.mean_backprop_depth)
        self.spec = Spec(loops=loops or cfg.mean_recurrence, d_model=d, context=cfg.context,
                         prelude_blocks=cfg.n_prelude, kv_blocks=cfg.n_core,
                         coda_blocks=cfg.n_coda,
                         readout_eps=cfg.norm_eps,  # ln_f, after C and the coda
                         random_state=True,  # H_0 is Parcae's like-init noise
                         nominal_mean=nominal, sampler_mean=nominal + math.exp(-nominal))

    exit_score = None  # Parcae has no exit gate: its exits are the rules' (measure/exits)

    def sample_depth(self, generator: torch.Generator | None = None) -> int:
        """One training depth from Parcae's sampler (poisson-truncated-full, per
        sequence): max(Poisson(m), 1) loops, the last min(r, mean_backprop_depth) with
        a graph."""
        lam = torch.tensor([float(self.nominal_mean)], dtype=torch.float64)
        return max(1, int(torch.poisson(lam, generator=generator).item()))

    def cost(self) -> Cost:
        """Forward FLOPs per token of its parts (cost)."""
        return cost(self.cfg)

    # The interface's methods; positions (T,) or (B, T) default to 0 .. T - 1
    def _rope(self, t: int, positions: torch.Tensor | None, device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary.at(checked_positions(t, positions, self.cfg.context, device))

    def _ve(self, block: Block, index: int, ids: torch.Tensor) -> torch.Tensor | None:
        """Block `index`'s value embedding of the tokens, where it has one and a gate."""
        key = str(index)
        if block.attn.ve_gate is None or key not in self.value_embeds:
            return None
        return self.value_embeds[key](ids)

    def _blocks(self, part: str, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kvs: list[KV] | None, ids: torch.Tensor) -> torch.Tensor:
        """x through a part's blocks ("prelude", "core" or "coda")."""
        blocks = self.transformer[{"core": "core_block"}.get(part, part)]
        for i, ((_, index), block) in enumerate(zip(self.cfg.layers(part), blocks, strict=True)):
            x = block(x, rope, kvs[i] if kvs is not None else None, self._ve(block, index, ids))
        return x

    def inputs(self, idx: torch.Tensor, positions: torch.Tensor | None = None,
               kvs: list[KV] | None = None) -> torch.Tensor:
        """e (B, T, d): the embedding through the prelude and ln_prelude, re-injected
        every loop. Records the batch's ids for its core and coda (Tokens). kvs: one
        attention override per prelude block."""
        _overrides(kvs, self.cfg.n_prelude, "prelude")
        rope = self._rope(idx.shape[1], positions, idx.device)
        self.tokens.ids, self.tokens.positions = idx, positions
        e = self._blocks("prelude", self.transformer.wte(idx), rope, kvs, idx)
        return self.transformer.ln_prelude(e) if self.cfg.prelude_norm else e

    def initial_state(self, e: torch.Tensor, generator: torch.Generator | None = None
                      ) -> torch.Tensor:
        """H_0: Parcae's like-init noise, a truncated normal (+-3 sigma, sigma =
        sqrt(2/(5d)), the published init's embedding sigma), drawn in float32 from
        generator (torch's RNG if None) and cast to e's dtype."""
        std = math.sqrt(2.0 / (5 * self.cfg.d_model))
        noise = torch.empty(e.shape, dtype=torch.float32, device=e.device)
        nn.init.trunc_normal_(noise, std=std, a=-3 * std, b=3 * std, generator=generator)
        return noise.to(e.dtype)

    def carry(self, h: torch.Tensor, first: bool | torch.Tensor = False) -> torch.Tensor:
        """A loop starts from the previous state as it is (no norm between loops)."""
        return h

    def step(self, h: torch.Tensor, e: torch.Tensor, kvs: list[KV] | None = None,
             k: int | torch.Tensor | None = None, positions: torch.Tensor | None = None
             ) -> torch.Tensor:
        """One loop: H_k = core(adapter(h, e)). kvs: one attention override per core
        block (contract: Attention). k: the loop's index (1-based); the published core
        takes it only to key its KV cache. positions: as given to `inputs`."""
        if k is not None and int(torch.as_tensor(k).min()) < 1:
            raise ValueError(f"the loop index k is 1-based, got {k}")
        _overrides(kvs, self.cfg.n_core, "core")
        ids = self.tokens.of(h, positions, kvs)
        rope = self._rope(h.shape[1], positions, h.device)
        return self._blocks("core", self.transformer.adapter(h, e), rope, kvs, ids)

    def read(self, h: torch.Tensor, last: bool = True, positions: torch.Tensor | None = None,
             kvs: list[KV] | None = None) -> torch.Tensor:
        """A loop's state (B, T, d) -> logits (B, T, V), float32 or wider: C, the coda,
        ln_f, the head (soft-capped where logit_softcap is set). Every loop reads the
        same way (last changes nothing). kvs: one attention override per coda block."""
        _overrides(kvs, self.cfg.n_coda, "coda")
        ids = self.tokens.of(h, positions, kvs)
        rope = self._rope(h.shape[1], positions, h.device)
        x = self._blocks("coda", self.transformer.C(h), rope, kvs, ids)
        logits = widened(F.linear(self.transformer.ln_f(x), self.head_weight))
        cap = self.cfg.logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    @property
    def head_weight(self) -> torch.Tensor:
        """The readout's matrix (tied_head)."""
        return tied_head(self.transformer, "wte", self.lm_head)

    def reader(self) -> ParcaeReader:
        """The modules read runs, sharing this model's parameters (ParcaeReader)."""
        return ParcaeReader(self)


class ParcaeReader(LayoutReader):
    """What ParcaeLM.read runs: C, the coda and its value embeddings, ln_f, the head,
    the rotary table and its Tokens (LayoutReader)."""

    def __init__(self, model: ParcaeLM) -> None:
        parts = dict(C=model.transformer.C, coda=model.transformer.coda,
                     ln_f=model.transformer.ln_f)
        super().__init__(model, "transformer", parts, "wte")
        self.rotary, self.tokens = model.rotary, model.tokens
        coda = {str(index) for _, index in model.cfg.layers("coda")}
        self.value_embeds = nn.ModuleDict({key: e for key, e in model.value_embeds.items()
                                           if key in coda})

    forward = ParcaeLM.read
    _rope = ParcaeLM._rope
    _ve = ParcaeLM._ve
    _blocks = ParcaeLM._blocks
    head_weight = ParcaeLM.head_weight
