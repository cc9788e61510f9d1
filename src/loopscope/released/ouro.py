"""Ouro's layout: ByteDance's looped language models (Ouro-1.4B, Ouro-2.6B) as looped
models.

Zhu et al. 2025, "Scaling Latent Reasoning via Looped Language Models" (Ouro, LoopLM),
written here from the architecture's description and checked, loop by loop, against the
published implementation at a tiny configuration (tests/test_ouro.py):

    tokens -> embedding = e = H_0           (no prelude, no embedding scale)
    loop k: H_k = core(carry(H_{k-1}))      (all num_hidden_layers decoder layers)
            carry(H_0) = H_0, carry(H_k) = norm(H_k) for k >= 1
    read:   logits = head(norm(H_k))
    exit:   lambda_k = sigmoid(early_exit_gate(norm(H_k)))

- the published forward applies the final norm after every recurrent step, and the
  *normed* state is what the next step starts from, what the head reads and what the
  exit gate sees. Here H_k is the residual stream before that norm, and the norm is
  the carry and the first thing `read` and `exit_score` do: the same numbers, with the
  norm at the readout (what paper A's Lemma 1 reads) and between loops (as paper A's
  inter-loop norm), so the state's scale is the residual stream's, not the norm's gain;
- the embedding enters once: it is the first loop's input and is not re-injected, so
  H_0 is the embedding itself (not random) and `step` ignores e;
- a decoder layer normalizes before and after each sub-block, inside the residual:
  x = x + n2(attn(n1(x))); x = x + n4(mlp(n3(x))) (input_layernorm, input_layernorm_2,
  post_attention_layernorm, post_attention_layernorm_2), every norm an RMSNorm computed
  in float32 (rms_norm_eps) and cast back before its gain;
- attention: separate q, k, v, o projections without bias, grouped-query heads
  (num_key_value_heads), the rotary embedding on the two halves of each head (base
  rope_theta, computed in float32) at the tokens' positions, causal scaled dot-product
  attention, scale 1 / sqrt(head_dim);
- the MLP is SiLU-gated: down(silu(gate(x)) * up(x));
- the exit gate is Linear(hidden, 1) with a bias; the published code turns its per-loop
  sigmoid lambda_k into an exit distribution (lambda_k times the mass not yet exited,
  the rest at the last loop) and exits where its running sum reaches
  early_exit_threshold q: loopscope's exit-score rule (measure/exits.ExitScore) is that
  rule, at threshold 1 - q (it exits once prod (1 - lambda_j) < 1 - q).

The parameters carry Ouro's names (model.embed_tokens, model.layers.<i>...,
model.norm, model.early_exit_gate, lm_head), so a checkpoint directory in Ouro's layout
loads by name (loopscope.released.loader.load). OuroLM implements the looped-model interface
(loopscope.looped.interface.LoopedModel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from tokenizers import Tokenizer

from loopscope.looped.types import KV, Cost, Spec, Specified
from loopscope.released.huginn import widened
from loopscope.released.layouts import LayoutReader, checked_positions, register, tied_head

TIED_HEAD = "lm_head.weight"  # a copy of the embedding some tied checkpoints also hold


# Ouro's config.json, read into the options loopscope.released.ouro builds from.
#
# A checkpoint directory in Ouro's layout (ByteDance's Ouro-1.4B and Ouro-2.6B) describes
# its model in config.json with the published config class's keys (hidden_size,
# num_hidden_layers, num_attention_heads, num_key_value_heads, total_ut_steps, ...). Keys
# that set a shape are required; the others take the published class's defaults when
# absent. Keys naming a variant this layout does not implement (a sliding window, a
# scaled rotary embedding, another activation, another model_type) are refused with
# their key, so a config of another layout is not loaded into the wrong model. Keys that
# only the published code's generation, training or exit selection read
# (early_exit_threshold, use_cache, initializer_range, bos/eos/pad token ids,
# transformers_version, auto_map, ...) are ignored: loopscope's exit rules replace the
# published exit selection (the exit-score rule reads the same gate).
# key -> the one value this layout implements (the published config's defaults)
FIXED: dict[str, Any] = {"model_type": "ouro", "hidden_act": "silu",
                         "use_sliding_window": False, "rope_scaling": None}
REQUIRED = ("hidden_size", "vocab_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "max_position_embeddings")
DEFAULTS: dict[str, Any] = {"tie_word_embeddings": False, "rms_norm_eps": 1e-6,
                            "rope_theta": 10_000.0, "total_ut_steps": 4}


@dataclass(frozen=True)
class OuroConfig:
    """The options of Ouro's layout, in loopscope's words; each field's comment names
    the config.json key it comes from. Ouro has no prelude and no coda blocks: its
    num_hidden_layers decoder layers are the core, run once per loop."""

    d_model: int  # hidden_size
    n_heads: int  # num_attention_heads (query heads)
    n_kv_heads: int  # num_key_value_heads (grouped-query heads when fewer)
    head_dim: int  # head_dim (hidden_size / num_attention_heads when absent)
    intermediate: int  # intermediate_size: the gated MLP's hidden width
    vocab_size: int  # vocab_size
    context: int  # max_position_embeddings: the longest window
    n_core: int  # num_hidden_layers: the decoder layers of one loop
    # total_ut_steps: the loops Ouro runs (it trained at this fixed depth); loopscope
    # reads it as R, the depth it is read at, under Huginn's config name
    mean_recurrence: int
    tie_embeddings: bool = False  # tie_word_embeddings: the head is the embedding
    norm_eps: float = 1e-6  # rms_norm_eps, of every RMSNorm
    rope_base: float = 10_000.0  # rope_theta

    n_prelude = 0  # blocks before the loop: none, the loop's input is the embedding
    n_coda = 0  # blocks after it: none, the readout is the final norm and the head

    def __post_init__(self) -> None:
        positive = ("d_model", "n_heads", "n_kv_heads", "head_dim", "intermediate",
                    "vocab_size", "context", "n_core", "mean_recurrence")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even (the rotary embedding "
                             "turns pairs of channels)")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"num_attention_heads {self.n_heads} must be a multiple of "
                             f"num_key_value_heads {self.n_kv_heads} (grouped-query heads)")
        if self.norm_eps <= 0 or self.rope_base <= 0:
            raise ValueError("rms_norm_eps and rope_theta must be > 0")

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> OuroConfig:
        """The options a config.json dict sets (Ouro's keys); ValueError naming the key
        for a missing, contradictory or unsupported one."""
        for key, value in FIXED.items():
            if key in raw and raw[key] != value:
                raise ValueError(f"{key} is {raw[key]!r}; Ouro's layout is {value!r}")
        missing = [k for k in REQUIRED if k not in raw]
        if missing:
            raise ValueError(f"missing {', '.join(missing)} (Ouro's layout needs them)")
        sliding = [t for t in raw.get("layer_types") or [] if t != "full_attention"]
        if sliding:
            raise ValueError(f"layer_types holds {sliding[0]!r}; Ouro's layout attends "
                             "over the full window in every layer ('full_attention')")
        get = {**DEFAULTS, **raw}.__getitem__
        heads = int(raw["num_attention_heads"])
        return cls(
            d_model=int(raw["hidden_size"]), n_heads=heads,
            n_kv_heads=int(raw["num_key_value_heads"]),
            head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
            intermediate=int(raw["intermediate_size"]), vocab_size=int(raw["vocab_size"]),
            context=int(raw["max_position_embeddings"]),
            n_core=int(raw["num_hidden_layers"]), mean_recurrence=int(get("total_ut_steps")),
            tie_embeddings=bool(get("tie_word_embeddings")), norm_eps=float(get("rms_norm_eps")),
            rope_base=float(get("rope_theta")))



class OuroNorm(nn.Module):
    """RMSNorm as Ouro computes it: normalized in float32 (or wider), cast back to the
    input's dtype, then scaled by the gain (so bf16 weights give Ouro's bf16 numbers)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = widened(x)
        z = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * z.type_as(x)


class Rotary(nn.Module):
    """The rotary embedding's inverse frequencies, base^(-2i / head_dim), computed as
    the published default does; cos and sin are formed per call at the tokens' positions
    (Ouro keeps no table). Not a parameter and not saved."""

    def __init__(self, head_dim: int, base: float) -> None:
        super().__init__()
        self.head_dim, self.base = head_dim, base
        self.register_buffer("inv_freq", self.frequencies(), persistent=False)

    def frequencies(self, device: torch.device | str | None = None) -> torch.Tensor:
        pairs = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float()
        return 1.0 / (self.base ** (pairs / self.head_dim))

    def rebuild(self, device: torch.device | str) -> None:
        """Recompute the frequencies on a device (after building on the meta device)."""
        self.inv_freq = self.frequencies(device)

    def at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin at positions (T,) or (B, T), float32, shaped to broadcast over the
        heads of (B, H, T, head_dim): (1 or B, 1, T, head_dim), the angles repeated over
        the two halves of a head."""
        angles = positions.float()[..., None] * self.inv_freq.float()
        angles = torch.cat([angles, angles], dim=-1)
        if angles.ndim == 2:
            angles = angles[None]
        return torch.cos(angles)[:, None], torch.sin(angles)[:, None]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, head_dim) turned by its angles, the first half of each head paired with
    the second, in float32 (or wider), returned in x's dtype."""
    z = widened(x)
    a, b = z.chunk(2, dim=-1)
    return (z * cos + torch.cat([-b, a], dim=-1) * sin).type_as(x)


class Attention(nn.Module):
    """Ouro's causal self-attention with grouped-query heads (see the module doc), with an
    optional override (the contract of loopscope.looped.interface): kv(q, k, v) -> y gets
    q (B, n_heads, T, head_dim), k and v (B, n_kv_heads, T, head_dim) after the rotary
    embedding, and applies the causal mask and the scale itself."""

    def __init__(self, cfg: OuroConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        d, width, kv_width = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(d, width, bias=False)
        self.k_proj = nn.Linear(d, kv_width, bias=False)
        self.v_proj = nn.Linear(d, kv_width, bias=False)
        self.o_proj = nn.Linear(width, d, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv: KV | None = None) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, *rope), rotate(k, *rope)
        y = kv(q, k, v) if kv is not None else F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=self.n_heads != self.n_kv_heads)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class GatedMLP(nn.Module):
    """down(SiLU(gate(x)) * up(x))."""

    def __init__(self, cfg: OuroConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """x = x + n2(attn(n1(x))); x = x + n4(mlp(n3(x))): each sub-block's output is
    normalized before it joins the residual stream, which bounds what one loop adds."""

    def __init__(self, cfg: OuroConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = GatedMLP(cfg)
        self.input_layernorm = OuroNorm(cfg.d_model, cfg.norm_eps)
        self.input_layernorm_2 = OuroNorm(cfg.d_model, cfg.norm_eps)
        self.post_attention_layernorm = OuroNorm(cfg.d_model, cfg.norm_eps)
        self.post_attention_layernorm_2 = OuroNorm(cfg.d_model, cfg.norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv: KV | None = None) -> torch.Tensor:
        x = x + self.input_layernorm_2(self.self_attn(self.input_layernorm(x), rope, kv))
        return x + self.post_attention_layernorm_2(self.mlp(self.post_attention_layernorm(x)))


def cost(cfg: OuroConfig) -> Cost:
    """Forward FLOPs per token of Ouro's layout at a config: 2 per weight of every matrix
    a token goes through, plus attention's two products at the mean query position of a
    full context (2 n_heads head_dim (T + 1) per layer), as loopscope.weights.model.cost
    counts them. No prelude (the embedding is a lookup); a loop is every decoder layer;
    a readout is the head. A function of the config alone, so `plan` needs no weights."""
    d, width = cfg.d_model, cfg.n_heads * cfg.head_dim
    matrices = d * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim + 3 * d * cfg.intermediate
    layer = 2 * matrices + 2 * width * (cfg.context + 1)
    return Cost(prelude=0.0, loop=cfg.n_core * layer, readout=2 * d * cfg.vocab_size)


def _no_overrides(kvs: list[KV] | None, part: str) -> None:
    """Ouro has no attention in its prelude or readout: only None or no override."""
    if kvs:
        raise ValueError(f"{len(kvs)} attention overrides for Ouro's {part}, which has no "
                         "attention blocks")


def extras(cfg: OuroConfig) -> dict[str, tuple[int, ...]]:
    """With tied embeddings, a copy of the embedding as lm_head.weight (shape-checked
    and not used)."""
    return {TIED_HEAD: (cfg.vocab_size, cfg.d_model)} if cfg.tie_embeddings else {}


@register("ouro", config=OuroConfig, eos="<|endoftext|>", title="Ouro's", optional=extras,
          exit_modes=("frozen", "published"))
class OuroLM(Specified, nn.Module):
    """Ouro's layout with the looped-model interface (loopscope.looped.interface).

    The module tree repeats the published one, so that named_parameters() are Ouro's
    parameter names. Precision: the weights' dtype (fp32 on CPU; bf16 on a GPU, as Ouro
    is released); norms and the rotary embedding compute in float32 either way, and
    the logits and exit probabilities are float32."""

    def __init__(self, cfg: OuroConfig, loops: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(cfg.vocab_size, cfg.d_model),
            layers=nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_core)),
            norm=OuroNorm(cfg.d_model, cfg.norm_eps),
            early_exit_gate=nn.Linear(cfg.d_model, 1)))
        self.lm_head = (None if cfg.tie_embeddings
                        else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False))
        self.rotary = Rotary(cfg.head_dim, cfg.rope_base)
        self.tokenizer: Tokenizer | None = None  # set by the loader
        # The interface's sizes (Spec). R: the depth it is read at, passed in (an outside
        # model's `loops`), else Ouro's total_ut_steps, which is also the depth it
        # trained at, every step (Ouro's depth is fixed; its training loss weighs the
        # steps by the exit gate's distribution).
        self.spec = Spec(loops=loops or cfg.mean_recurrence, d_model=cfg.d_model,
                         context=cfg.context,
                         prelude_blocks=0,  # `inputs` is the embedding alone
                         kv_blocks=cfg.n_core,  # one per decoder layer
                         coda_blocks=0,  # `read` is the final norm and the head
                         readout_eps=cfg.norm_eps,  # the final norm, first thing in read
                         random_state=False,  # H_0 is the embedding itself
                         nominal_mean=cfg.mean_recurrence,
                         sampler_mean=float(cfg.mean_recurrence))

    def cost(self) -> Cost:
        """Forward FLOPs per token of its parts (cost)."""
        return cost(self.cfg)

    def exit_score(self, h: torch.Tensor) -> torch.Tensor:
        """lambda (...) from states (..., d): the exit gate's probability that a token
        exits at this loop, sigmoid(early_exit_gate(norm(h))), float32 (the gate reads
        the normed state, as in the published forward)."""
        gate = self.model.early_exit_gate(self.model.norm(h))
        return torch.sigmoid(widened(gate)).squeeze(-1)

    # The interface's methods; positions (T,) or (B, T) default to 0 .. T - 1
    def _rope(self, t: int, positions: torch.Tensor | None, device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor]:
        positions = checked_positions(t, positions, self.cfg.context, device)
        if positions.numel() and (int(positions.min()) < 0
                                  or int(positions.max()) >= self.cfg.context):
            raise ValueError(f"positions must lie in [0, {self.cfg.context}) (config.json's "
                             f"max_position_embeddings), got "
                             f"{int(positions.min())}..{int(positions.max())}")
        return self.rotary.at(positions)

    def inputs(self, idx: torch.Tensor, positions: torch.Tensor | None = None,
               kvs: list[KV] | None = None) -> torch.Tensor:
        """e (B, T, d): the token embedding (no prelude; positions enter in the loop)."""
        _no_overrides(kvs, "input (no prelude)")
        if positions is None and idx.shape[1] > self.cfg.context:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds the context "
                             f"{self.cfg.context}")
        return self.model.embed_tokens(idx)

    def initial_state(self, e: torch.Tensor, generator: torch.Generator | None = None
                      ) -> torch.Tensor:
        """H_0 = e: Ouro's first loop starts from the embedding (nothing is drawn, so the
        generator is unused)."""
        return e

    def carry(self, h: torch.Tensor, first: bool | torch.Tensor = False) -> torch.Tensor:
        """What a loop starts from: H_0 as it is for loop 1 (the embedding), norm(H_k)
        for loop k + 1 (the published forward normalizes after every step and hands the
        normed state on). first: True for H_0, or a bool tensor (h.shape[:-1]) where
        tokens at different loops share one call."""
        # The same three-way choice as LoopedLM.carry's inter-loop norm, kept here: a
        # shared helper would sit below weights/, and an edit to it would retrain cells
        if first is True:
            return h
        normed = self.model.norm(h)
        if first is False:
            return normed
        return torch.where(first[..., None], h, normed)

    def step(self, h: torch.Tensor, e: torch.Tensor, kvs: list[KV] | None = None,
             k: int | torch.Tensor | None = None, positions: torch.Tensor | None = None
             ) -> torch.Tensor:
        """One loop: H_k = the decoder layers on carry(H_{k-1}), before the final norm.
        e is not used (Ouro does not re-inject its input: it entered as H_0). kvs: one
        attention override per decoder layer (contract: Attention). k: the loop's index
        (1-based; an int or a (B,) tensor); the published code uses it only to key its
        KV cache, so the state does not depend on it. positions: the tokens' rotary
        positions (T,) or (B, T)."""
        if k is not None and int(torch.as_tensor(k).min()) < 1:
            raise ValueError(f"the loop index k is 1-based, got {k}")
        if kvs is not None and len(kvs) != self.cfg.n_core:
            raise ValueError(f"{len(kvs)} attention overrides for {self.cfg.n_core} decoder "
                             "layers")
        rope = self._rope(h.shape[1], positions, h.device)
        for i, layer in enumerate(self.model.layers):
            h = layer(h, rope, kvs[i] if kvs is not None else None)
        return h

    def read(self, h: torch.Tensor, last: bool = True, positions: torch.Tensor | None = None,
             kvs: list[KV] | None = None) -> torch.Tensor:
        """A loop's state (B, T, d) -> logits (B, T, V), float32 or wider: the final norm,
        then the head. Every loop reads the same way (last and positions change
        nothing; Ouro has no coda, so kvs is None or empty)."""
        _no_overrides(kvs, "readout (no coda)")
        return widened(F.linear(self.model.norm(h), self.head_weight))

    @property
    def head_weight(self) -> torch.Tensor:
        """The readout's matrix (tied_head)."""
        return tied_head(self.model, "embed_tokens", self.lm_head)

    def reader(self) -> OuroReader:
        """The modules read runs, sharing this model's parameters (OuroReader)."""
        return OuroReader(self)


class OuroReader(LayoutReader):
    """What OuroLM.read runs: the final norm and the head (LayoutReader)."""

    def __init__(self, model: OuroLM) -> None:
        super().__init__(model, "model", dict(norm=model.model.norm), "embed_tokens")

    forward = OuroLM.read
    head_weight = OuroLM.head_weight
