"""Huginn's layout: the released recurrent-depth model (Huginn-0125, 3.5B) as a looped model.

Geiping et al. 2025, "Scaling up Test-Time Compute with Latent Reasoning: A Recurrent
Depth Approach", written here from the architecture's description and checked, loop by
loop, against the published implementation at tiny configurations
(tests/test_huginn.py):

    tokens -> embedding * sqrt(d) -> prelude (n_layers_in_prelude sandwich blocks) = e
    H_0: noise (a truncated normal, +-3 sigma, sigma = sqrt(2/(5d)), times sqrt(d))
    loop k: H_k = core(adapter([H_{k-1}, e]))   (n_layers_in_recurrent_block blocks)
    read:   logits = head(ln_f(coda(ln_f(H_k))))

- the adapter is one linear map of the concatenation [state, e], the state first (its
  bias is config's `bias`);
- a sandwich block is x = n2(attn(n1(x)) + x); x = n4(mlp(n3(x)) + x), every norm an
  RMSNorm computed in float32 (norm_eps);
- attention: one fused projection Wqkv of (n_heads + 2 n_kv_heads) head_dim outputs, a
  learned bias on the queries' and keys' heads (qk_bias, added before the rotary
  embedding), the rotary embedding on interleaved pairs of channels (2i, 2i + 1) at the
  tokens' positions (base rope_base, in float32; a checkpoint's saved table, where it
  holds one, as the published model computes with it: after_load), causal scaled
  dot-product attention;
  Huginn's query and key bias are per head, so its keys have as many heads as its
  queries (no grouped-query heads; a config saying otherwise is refused);
- the MLP is SiLU-gated: fc gives [gate, up] (2 x intermediate_size), proj maps back;
- ln_f is used twice: on the state before the coda and on the coda's output before the
  head; the head is the embedding when tie_embeddings, else lm_head.

The parameters carry Huginn's names (transformer.wte, transformer.prelude.<i>...,
transformer.adapter, transformer.core_block.<i>..., transformer.coda.<i>...,
transformer.ln_f, lm_head), so a checkpoint directory in Huginn's layout loads by name
(loopscope.released.loader.load). HuginnLM implements the looped-model interface
(loopscope.looped.interface.LoopedModel) and adds what a released model needs: positions
for the rotary embedding, and the loop index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from tokenizers import Tokenizer

from loopscope.base.errors import CheckpointError
from loopscope.looped.types import KV, Cost, Spec, Specified
from loopscope.released.layouts import (
    Files,
    LayoutReader,
    checked_positions,
    register,
    tied_head,
)

ROTARY_TABLE = "freqs_cis"  # the published model's rotary table, saved with its weights
TIED_HEAD = "lm_head.weight"  # a copy of the embedding some tied checkpoints also hold
DEPTH_SIGMA = 0.5  # the log-normal's sigma in Huginn's training depth sampler


# Huginn's config.json, read into the options loopscope.released.huginn builds from.
#
# A checkpoint directory in Huginn's layout describes its model in config.json with the
# published config class's keys (n_embd, n_heads or num_attention_heads, block_size,
# n_layers_in_prelude, mean_recurrence, ...). Keys that set a shape are required; the
# others take the published class's defaults when absent (its own example config omits
# rope_base, for one). Keys naming a part of the architecture (block_class_name,
# injection_type, ...) must name the parts this layout implements, so a config for
# another variant is refused with its key, not loaded into the wrong model. Keys that
# only the published code's training or generation read (init_strategy, auto_map,
# transformers_version, ...) are ignored.
# key -> the one value this layout implements (the published config's defaults)
FIXED = {"block_class_name": "SandwichBlock", "norm_class_name": "RMSNorm_llama",
         "mlp_class_name": "GatedMLP", "nonlin_name": "SiLU", "injection_type": "linear",
         "state_init": "like-init", "sampling_scheme": "poisson-lognormal-filling",
         "architecture_class_name": "RecurrentGPT"}
REQUIRED = ("n_embd", "vocab_size", "block_size", "intermediate_size", "n_layers_in_prelude",
            "n_layers_in_recurrent_block", "n_layers_in_coda", "mean_recurrence")
DEFAULTS: dict[str, Any] = {"tie_embeddings": True, "bias": False, "qk_bias": True,
                            "norm_eps": 1e-6, "rope_base": 50_000.0, "mean_backprop_depth": 8,
                            "test_time_noise": 0}


@dataclass(frozen=True)
class HuginnConfig:
    """The options of Huginn's layout, in loopscope's words; each field's comment
    names the config.json key it comes from."""

    d_model: int  # n_embd
    n_heads: int  # n_heads (num_attention_heads)
    n_kv_heads: int  # num_key_value_heads; Huginn's equals n_heads
    intermediate: int  # intermediate_size: the gated MLP's hidden width
    vocab_size: int  # vocab_size (the embedding's rows, padded_vocab_size if given)
    context: int  # block_size: the rotary table's length, the longest window
    n_prelude: int  # n_layers_in_prelude
    n_core: int  # n_layers_in_recurrent_block
    n_coda: int  # n_layers_in_coda
    mean_recurrence: int  # the depth it is read at (R), the training sampler's mean
    mean_backprop_depth: int  # loops of each training step that built a graph
    tie_embeddings: bool = True  # the head is the embedding
    adapter_bias: bool = False  # bias: the adapter's bias (the only biased linear map)
    qk_bias: bool = True  # a learned bias on the query and key heads
    norm_eps: float = 1e-6
    rope_base: float = 50_000.0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def __post_init__(self) -> None:
        positive = ("d_model", "n_heads", "intermediate", "vocab_size", "context", "n_core",
                    "mean_recurrence")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("n_prelude", "n_coda", "mean_backprop_depth"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.d_model % self.n_heads or self.head_dim % 2:
            raise ValueError(f"n_embd {self.d_model} must split into {self.n_heads} heads of an "
                             "even width (the rotary embedding turns channel pairs)")
        if self.n_kv_heads != self.n_heads:
            raise ValueError(f"num_key_value_heads {self.n_kv_heads} differs from n_heads "
                             f"{self.n_heads}: Huginn's query/key bias is per query head, so "
                             "its layout has no grouped-query heads")
        if self.norm_eps <= 0 or self.rope_base <= 0:
            raise ValueError("norm_eps and rope_base must be > 0")

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> HuginnConfig:
        """The options a config.json dict sets (Huginn's keys); ValueError naming the key
        for a missing, contradictory or unsupported one."""
        missing = [k for k in REQUIRED if k not in raw]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        if "n_heads" not in raw and "num_attention_heads" not in raw:
            raise ValueError("missing n_heads (or num_attention_heads)")
        for key, value in FIXED.items():
            if key in raw and raw[key] != value:
                raise ValueError(f"{key} is {raw[key]!r}; Huginn's layout is {value!r}")
        get = {**DEFAULTS, **raw}.__getitem__
        if get("test_time_noise"):
            raise ValueError(f"test_time_noise is {get('test_time_noise')}; only 0 (no noise "
                             "between loops, the published default) is implemented")
        heads = int(raw.get("n_heads", raw.get("num_attention_heads")))
        if int(raw.get("num_attention_heads", heads)) != heads:
            raise ValueError(f"n_heads {heads} and num_attention_heads "
                             f"{raw['num_attention_heads']} disagree")
        vocab = int(raw["vocab_size"])
        if int(raw.get("padded_vocab_size", vocab)) != vocab:
            raise ValueError(f"padded_vocab_size {raw['padded_vocab_size']} differs from "
                             f"vocab_size {vocab} (the published config sets them equal)")
        return cls(
            d_model=int(get("n_embd")), n_heads=heads,
            n_kv_heads=int(raw.get("num_key_value_heads", heads)),
            intermediate=int(get("intermediate_size")), vocab_size=vocab,
            context=int(get("block_size")), n_prelude=int(get("n_layers_in_prelude")),
            n_core=int(get("n_layers_in_recurrent_block")), n_coda=int(get("n_layers_in_coda")),
            mean_recurrence=int(get("mean_recurrence")),
            mean_backprop_depth=int(get("mean_backprop_depth")),
            tie_embeddings=bool(get("tie_embeddings")), adapter_bias=bool(get("bias")),
            qk_bias=bool(get("qk_bias")), norm_eps=float(get("norm_eps")),
            rope_base=float(get("rope_base")))



def widened(x: torch.Tensor) -> torch.Tensor:
    """x in float32 if it is narrower (bf16, fp16), else as it is (a float64 copy of
    the model keeps its precision)."""
    return x.float() if x.element_size() < 4 else x


class HuginnNorm(nn.Module):
    """RMSNorm as Huginn computes it: normalized in float32 (or wider), cast back to the
    input's dtype, then scaled by the gain (so bf16 weights give Huginn's bf16 numbers)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = widened(x)
        z = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + self.eps)
        return z.type_as(x) * self.weight


class Rotary(nn.Module):
    """The rotary embedding's cos and sin per position (context, head_dim / 2), float32.
    Not a parameter and not saved. Built exact (table) on construction and by rebuild;
    where a checkpoint holds the published model's saved table (freqs_cis), after_load
    checks it against the exact one and then computes with the saved values (use), as
    the published model does: a bf16-saved table moves the logits by about 1e-3
    relative, far beyond float32 agreement (tests/test_huginn.py)."""

    def __init__(self, head_dim: int, context: int, base: float) -> None:
        super().__init__()
        self.head_dim, self.context, self.base = head_dim, context, base
        cos, sin = self.table()
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def table(self, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Channel pair i turns by position * base^(-2i / head_dim)."""
        pairs = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device)
        inv = 1.0 / (self.base ** (pairs / self.head_dim))
        angles = torch.outer(torch.arange(self.context, dtype=torch.float32, device=device), inv)
        return torch.cos(angles), torch.sin(angles)

    def rebuild(self, device: torch.device | str) -> None:
        """Recompute the exact table on a device (after building the model on the meta
        device); this drops a saved table taken by `use`."""
        self.cos, self.sin = self.table(device)

    def use(self, saved: torch.Tensor) -> None:
        """Compute with a saved table (1, context, 1, head_dim / 2, [cos, sin]) of any
        float dtype instead of the exact one: its values widened to float32, on the
        device of the table it replaces (the model's, after rebuild). The published
        model multiplies by its freqs_cis buffer as loaded: registered float32 (its
        precompute is float32 whatever the default dtype), a checkpoint's table is cast
        into it (to float32, so a bf16 table's rounded values, exactly), and its rotary
        product promotes to float32 (apply_rotary_emb_complex_like), in a bf16 model as
        in fp32."""
        table = saved[0, :, 0].to(device=self.cos.device, dtype=torch.float32)
        self.cos, self.sin = table[..., 0].contiguous(), table[..., 1].contiguous()

    def at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin at positions (T,) or (B, T), shaped to broadcast over heads:
        (1 or B, T, 1, head_dim / 2)."""
        if positions.numel() and (int(positions.min()) < 0
                                  or int(positions.max()) >= self.context):
            raise ValueError(f"positions must lie in [0, {self.context}) (config.json's "
                             f"block_size), got {int(positions.min())}..{int(positions.max())}")
        cos, sin = self.cos[positions], self.sin[positions]
        if positions.ndim == 1:
            cos, sin = cos[None], sin[None]
        return cos[:, :, None, :], sin[:, :, None, :]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, T, H, head_dim) with each channel pair (2i, 2i + 1) turned by its angle,
    in float32 (or wider), returned in x's dtype."""
    pair = widened(x).unflatten(-1, (-1, 2))
    a, b = pair[..., 0], pair[..., 1]
    turned = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1)
    return turned.flatten(-2).type_as(x)


class Attention(nn.Module):
    """Huginn's causal self-attention (see the module doc), with an optional override.

    The override contract: kv(q, k, v) -> y receives the tokens of this call as
    q (B, n_heads, T, head_dim), k and v (B, n_kv_heads, T, head_dim), in the model's
    dtype; q and k already carry the query/key bias and the rotary embedding at the
    call's positions; n_kv_heads == n_heads (Huginn has no grouped-query heads). It
    returns y (B, n_heads, T, head_dim) in the same layout, and must itself apply the
    causal mask (token t attends to tokens <= t), as Huginn's own attention does."""

    def __init__(self, cfg: HuginnConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.chunks = [cfg.d_model, cfg.n_kv_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim]
        self.Wqkv = nn.Linear(cfg.d_model, sum(self.chunks), bias=False)
        self.qk_bias = (nn.Parameter(torch.zeros(2, 1, cfg.n_heads, cfg.head_dim))
                        if cfg.qk_bias else None)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv: KV | None = None) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.Wqkv(x).split(self.chunks, dim=2)
        q = q.view(b, t, self.n_heads, self.head_dim)
        k = k.view(b, t, self.n_kv_heads, self.head_dim)
        v = v.view(b, t, self.n_kv_heads, self.head_dim)
        if self.qk_bias is not None:
            q, k = q + self.qk_bias[0], k + self.qk_bias[1]
        q, k = rotate(q, *rope), rotate(k, *rope)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        y = kv(q, k, v) if kv is not None else F.scaled_dot_product_attention(
            q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class GatedMLP(nn.Module):
    """SiLU(gate) * up, where fc computes [gate, up] in one matrix."""

    def __init__(self, cfg: HuginnConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 2 * cfg.intermediate, bias=False)
        self.proj = nn.Linear(cfg.intermediate, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc(x).chunk(2, dim=-1)
        return self.proj(F.silu(gate) * up)


class SandwichBlock(nn.Module):
    """x = n2(attn(n1(x)) + x); x = n4(mlp(n3(x)) + x): normalized after each sub-block
    as well as before, which bounds the state a loop hands on."""

    def __init__(self, cfg: HuginnConfig) -> None:
        super().__init__()
        self.norm_1 = HuginnNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.norm_2 = HuginnNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = GatedMLP(cfg)
        self.norm_3 = HuginnNorm(cfg.d_model, cfg.norm_eps)
        self.norm_4 = HuginnNorm(cfg.d_model, cfg.norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv: KV | None = None) -> torch.Tensor:
        x = self.norm_2(self.attn(self.norm_1(x), rope, kv) + x)
        return self.norm_4(self.mlp(self.norm_3(x)) + x)


def cost(cfg: HuginnConfig) -> Cost:
    """Forward FLOPs per token of Huginn's layout at a config: 2 per weight of every
    matrix a token goes through, plus attention's two products at the mean query
    position of a full context (2 d (T + 1) per block), as loopscope.weights.model.cost
    counts them. A function of the config alone, so `plan` needs no weights."""
    d = cfg.d_model
    qkv = d * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    block = 2 * (qkv + d * d + 3 * d * cfg.intermediate) + 2 * d * (cfg.context + 1)
    return Cost(prelude=cfg.n_prelude * block, loop=cfg.n_core * block + 2 * 2 * d * d,
                readout=cfg.n_coda * block + 2 * d * cfg.vocab_size)


def _overrides(kvs: list[KV] | None, blocks: int, part: str) -> None:
    """A ValueError where a part is given another number of attention overrides than it
    has blocks."""
    if kvs is not None and len(kvs) != blocks:
        raise ValueError(f"{len(kvs)} attention overrides for {blocks} {part} blocks")


def extras(cfg: HuginnConfig) -> dict[str, tuple[int, ...]]:
    """Tensors a checkpoint may hold beyond the parameters, with their shapes."""
    found = {ROTARY_TABLE: (1, cfg.context, 1, cfg.head_dim // 2, 2)}
    if cfg.tie_embeddings:
        found[TIED_HEAD] = (cfg.vocab_size, cfg.d_model)
    return found


def check_rotary(path: Path, rotary: Rotary) -> torch.Tensor:
    """The published model saves its rotary table (1, T, 1, head_dim / 2, [cos, sin]):
    it must be the one config.json's rope_base and block_size give (to 2 eps of its
    dtype: a bf16 table passes, a table of another base does not). Returns it as saved,
    on the CPU, for Rotary.use."""
    with safe_open(str(path), framework="pt") as f:
        saved = f.get_tensor(ROTARY_TABLE)
    ours = torch.stack([rotary.cos, rotary.sin], dim=-1).cpu()
    tol = max(1e-5, 2 * torch.finfo(saved.dtype).eps)
    if not torch.allclose(saved[0, :, 0].float(), ours, atol=tol, rtol=0.0):
        raise CheckpointError(f"{path}: {ROTARY_TABLE} is not the rotary table of "
                              f"config.json's rope_base {rotary.base} and block_size "
                              f"{rotary.context}")
    return saved


def after_load(model: nn.Module, files: Files, device: torch.device | str) -> None:
    """The rotary table built exact on the device; where the checkpoint holds the
    published model's saved one, that one checked against it (check_rotary) and then
    used in its place (Rotary.use): the published model computes with the table it
    loads, so a checkpoint that saved it in bf16 gives the published model's logits
    only with the saved values (about 1e-3 relative apart from the exact table's). A
    checkpoint without the table keeps the exact one, as the published model's own
    precomputed buffer is."""
    model.rotary.rebuild(device)
    table = files.get(ROTARY_TABLE)
    if table is not None:
        model.rotary.use(check_rotary(table[0], model.rotary))


@register("huginn", config=HuginnConfig, eos="<|end_text|>", title="Huginn's",
          optional=extras, after_load=after_load)
class HuginnLM(Specified, nn.Module):
    """Huginn's layout with the looped-model interface (loopscope.looped.interface).

    The module tree repeats the published one, so that named_parameters() are Huginn's
    parameter names. Precision: the weights' dtype (fp32 on CPU; bf16 on a GPU, as
    Huginn was trained and evaluated); norms and the rotary embedding compute in
    float32 either way, and the logits are float32."""

    def __init__(self, cfg: HuginnConfig, loops: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg

        def blocks(n: int) -> nn.ModuleList:
            return nn.ModuleList(SandwichBlock(cfg) for _ in range(n))

        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.d_model), prelude=blocks(cfg.n_prelude),
            adapter=nn.Linear(2 * cfg.d_model, cfg.d_model, bias=cfg.adapter_bias),
            core_block=blocks(cfg.n_core), coda=blocks(cfg.n_coda),
            ln_f=HuginnNorm(cfg.d_model, cfg.norm_eps)))
        self.lm_head = (None if cfg.tie_embeddings
                        else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False))
        self.rotary = Rotary(cfg.head_dim, cfg.context, cfg.rope_base)
        self.embed_scale = math.sqrt(cfg.d_model)  # Huginn's embeddings start small
        self.tokenizer: Tokenizer | None = None  # set by the loader
        # The interface's sizes (Spec). R: the depth it is read at, passed in (an outside
        # model's `loops`), else Huginn's mean_recurrence. The training depth: m, the
        # sampler's nominal mean, and E[r] = m + 1 (1 + Poisson).
        nominal = max(cfg.mean_recurrence, cfg.mean_backprop_depth)
        self.spec = Spec(loops=loops or cfg.mean_recurrence, d_model=cfg.d_model,
                         context=cfg.context, prelude_blocks=cfg.n_prelude,
                         kv_blocks=cfg.n_core, coda_blocks=cfg.n_coda,
                         readout_eps=cfg.norm_eps,  # ln_f normalizes first thing in read
                         random_state=True,  # H_0 is Huginn's like-init noise
                         nominal_mean=nominal, sampler_mean=nominal + 1.0)

    exit_score = None  # Huginn has no exit gate: its exits are the rules' (measure/exits)


    def sample_depth(self, generator: torch.Generator | None = None) -> int:
        """One training depth from Huginn's sampler: r = 1 + Poisson(lam), lam ~
        LogNormal(ln m - sigma^2 / 2, sigma), sigma = DEPTH_SIGMA. Training ran the
        first max(r - mean_backprop_depth, 0) loops without a graph."""
        mu = math.log(self.nominal_mean) - DEPTH_SIGMA ** 2 / 2
        z = torch.randn(1, generator=generator, dtype=torch.float64)
        lam = torch.exp(mu + DEPTH_SIGMA * z)
        return 1 + int(torch.poisson(lam, generator=generator).item())

    def cost(self) -> Cost:
        """Forward FLOPs per token of its parts (cost)."""
        return cost(self.cfg)

    # The interface's methods; positions (T,) or (B, T) default to 0 .. T - 1
    def _rope(self, t: int, positions: torch.Tensor | None, device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary.at(checked_positions(t, positions, self.cfg.context, device))

    def inputs(self, idx: torch.Tensor, positions: torch.Tensor | None = None,
               kvs: list[KV] | None = None) -> torch.Tensor:
        """e (B, T, d): the scaled embedding through the prelude, re-injected every
        loop. kvs: one attention override per prelude block."""
        _overrides(kvs, self.cfg.n_prelude, "prelude")
        rope = self._rope(idx.shape[1], positions, idx.device)
        e = self.transformer.wte(idx) * self.embed_scale
        for i, block in enumerate(self.transformer.prelude):
            e = block(e, rope, kvs[i] if kvs is not None else None)
        return e

    def initial_state(self, e: torch.Tensor, generator: torch.Generator | None = None
                      ) -> torch.Tensor:
        """H_0: Huginn's like-init noise, a truncated normal (+-3 sigma, sigma =
        sqrt(2/(5d))) times sqrt(d), drawn in float32 from generator (torch's RNG if
        None) and cast to e's dtype, so every precision starts from the same state."""
        std = math.sqrt(2.0 / (5 * self.cfg.d_model))
        noise = torch.empty(e.shape, dtype=torch.float32, device=e.device)
        nn.init.trunc_normal_(noise, std=std, a=-3 * std, b=3 * std, generator=generator)
        return (noise * self.embed_scale).to(e.dtype)

    def carry(self, h: torch.Tensor, first: bool | torch.Tensor = False) -> torch.Tensor:
        """A loop starts from the previous state as it is (no norm between loops)."""
        return h

    def step(self, h: torch.Tensor, e: torch.Tensor, kvs: list[KV] | None = None,
             k: int | torch.Tensor | None = None, positions: torch.Tensor | None = None
             ) -> torch.Tensor:
        """One loop: H_k = core(adapter([h, e])). kvs: one attention override per core
        block (contract: Attention). k: the loop's index (1-based); Huginn's core
        takes its step and block index (block n_prelude + (k - 1) n_core + j) only to
        key its KV cache, so the state does not depend on it. positions: the tokens'
        rotary positions, as given to `inputs`."""
        if k is not None and int(torch.as_tensor(k).min()) < 1:
            raise ValueError(f"the loop index k is 1-based, got {k}")
        _overrides(kvs, self.cfg.n_core, "core")
        rope = self._rope(h.shape[1], positions, h.device)
        h = self.transformer.adapter(torch.cat([h, e], dim=-1))
        for i, block in enumerate(self.transformer.core_block):
            h = block(h, rope, kvs[i] if kvs is not None else None)
        return h

    def read(self, h: torch.Tensor, last: bool = True, positions: torch.Tensor | None = None,
             kvs: list[KV] | None = None) -> torch.Tensor:
        """A loop's state (B, T, d) -> logits (B, T, V), float32 or wider: ln_f, the
        coda, ln_f again, the head. Every loop reads the same way (last changes
        nothing). kvs: one attention override per coda block."""
        _overrides(kvs, self.cfg.n_coda, "coda")
        rope = self._rope(h.shape[1], positions, h.device)
        x = self.transformer.ln_f(h)
        for i, block in enumerate(self.transformer.coda):
            x = block(x, rope, kvs[i] if kvs is not None else None)
        return widened(F.linear(self.transformer.ln_f(x), self.head_weight))

    @property
    def head_weight(self) -> torch.Tensor:
        """The readout's matrix (tied_head)."""
        return tied_head(self.transformer, "wte", self.lm_head)

    def reader(self) -> HuginnReader:
        """The modules read runs, sharing this model's parameters (HuginnReader)."""
        return HuginnReader(self)


class HuginnReader(LayoutReader):
    """What HuginnLM.read runs: ln_f, the coda, the head, and the rotary table the coda
    attends with (LayoutReader)."""

    def __init__(self, model: HuginnLM) -> None:
        parts = dict(coda=model.transformer.coda, ln_f=model.transformer.ln_f)
        super().__init__(model, "transformer", parts, "wte")
        self.rotary = model.rotary

    forward = HuginnLM.read
    _rope = HuginnLM._rope
    head_weight = HuginnLM.head_weight
