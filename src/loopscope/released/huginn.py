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
  tokens' positions (base rope_base, in float32), causal scaled dot-product attention;
  Huginn's query and key bias are per head, so its keys have as many heads as its
  queries (no grouped-query heads; a config saying otherwise is refused);
- the MLP is SiLU-gated: fc gives [gate, up] (2 x intermediate_size), proj maps back;
- ln_f is used twice: on the state before the coda and on the coda's output before the
  head; the head is the embedding when tie_embeddings, else lm_head.

The parameters carry Huginn's names (transformer.wte, transformer.prelude.<i>...,
transformer.adapter, transformer.core_block.<i>..., transformer.coda.<i>...,
transformer.ln_f, lm_head), so a checkpoint directory in Huginn's layout loads by name
(load_huginn). HuginnLM implements the looped-model interface
(loopscope.looped.interface.LoopedModel) and adds what a released model needs: positions
for the rotary embedding, and the loop index.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from tokenizers import Tokenizer

from loopscope.base.errors import CheckpointError
from loopscope.looped.types import KV, Cost
from loopscope.released.huginn_config import HuginnConfig

TOKENIZER = "tokenizer.json"
INDEX = "model.safetensors.index.json"
ROTARY_TABLE = "freqs_cis"  # the published model's rotary table, saved with its weights
TIED_HEAD = "lm_head.weight"  # a copy of the embedding some tied checkpoints also hold
DEPTH_SIGMA = 0.5  # the log-normal's sigma in Huginn's training depth sampler


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
    Not a parameter and not saved (the published model saves its table as freqs_cis;
    load_huginn checks that one against this)."""

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
        """Recompute the table on a device (after building the model on the meta device)."""
        self.cos, self.sin = self.table(device)

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


class HuginnLM(nn.Module):
    """Huginn's layout with the looped-model interface (loopscope.looped.interface).

    The module tree repeats the published one, so that named_parameters() are Huginn's
    parameter names. Precision: the weights' dtype (fp32 on CPU; bf16 on a GPU, as
    Huginn was trained and evaluated); norms and the rotary embedding compute in
    float32 either way, and the logits are float32."""

    def __init__(self, cfg: HuginnConfig) -> None:
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
        self.tokenizer: Tokenizer | None = None  # set by load_huginn
        self.read_depth: int | None = None  # R where it is not mean_recurrence (loops)

    # The looped-model interface's attributes, and the training depth
    @property
    def loops(self) -> int:
        """R, the depth it is read at: Huginn's mean_recurrence (its nominal mean),
        unless set (an outside model's `loops`: loopscope.released.outside.load)."""
        return self.cfg.mean_recurrence if self.read_depth is None else self.read_depth

    @loops.setter
    def loops(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"the depth it is read at must be >= 1, got {value}")
        self.read_depth = value

    @property
    def d_model(self) -> int:
        return self.cfg.d_model

    @property
    def context(self) -> int:
        return self.cfg.context

    @property
    def kv_blocks(self) -> int:
        """Attention overrides `step` takes: one per core block."""
        return self.cfg.n_core

    @property
    def prelude_blocks(self) -> int:
        """Attention overrides `inputs` takes: one per prelude block."""
        return self.cfg.n_prelude

    @property
    def coda_blocks(self) -> int:
        """Attention overrides `read` takes: one per coda block."""
        return self.cfg.n_coda

    @property
    def readout_eps(self) -> float:
        """The eps of ln_f, which normalizes the state first thing in `read`."""
        return self.cfg.norm_eps

    random_state = True  # H_0 is Huginn's like-init noise (initial_state)
    exit_score = None  # Huginn has no exit gate: its exits are the rules' (measure/exits)

    @property
    def nominal_mean(self) -> int:
        """m of the training depth sampler (its mean_recurrence); E[r] = m + 1."""
        return max(self.cfg.mean_recurrence, self.cfg.mean_backprop_depth)

    @property
    def sampler_mean(self) -> float:
        """E[r], the mean depth of a training step: m + 1 (1 + Poisson)."""
        return self.nominal_mean + 1.0

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
        if positions is None:
            if t > self.cfg.context:
                raise ValueError(f"sequence length {t} exceeds the context {self.cfg.context}")
            positions = torch.arange(t, device=device)
        elif positions.shape[-1] != t:
            raise ValueError(f"positions give {positions.shape[-1]} tokens, the input {t}")
        return self.rotary.at(positions.to(device))

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
        """The readout's matrix: the embedding when tied, else lm_head's."""
        return self.transformer.wte.weight if self.lm_head is None else self.lm_head.weight

    def reader(self) -> HuginnReader:
        """The modules read runs, sharing this model's parameters (HuginnReader)."""
        return HuginnReader(self)


class HuginnReader(nn.Module):
    """What HuginnLM.read runs (ln_f, the coda, the head: the embedding when tied, else
    lm_head) with the model's own modules under the same names: its forward is
    HuginnLM.read, the same code, so a float64 copy (loopscope.measure.per_loop.sweep) holds the
    readout alone."""

    def __init__(self, model: HuginnLM) -> None:
        super().__init__()
        self.cfg, self.rotary, self.lm_head = model.cfg, model.rotary, model.lm_head
        parts = dict(coda=model.transformer.coda, ln_f=model.transformer.ln_f)
        if model.lm_head is None:  # tied: the embedding is the head
            parts["wte"] = model.transformer.wte
        self.transformer = nn.ModuleDict(parts)

    forward = HuginnLM.read
    _rope = HuginnLM._rope
    head_weight = HuginnLM.head_weight


def load_huginn(directory: str | Path, dtype: torch.dtype | str = torch.float32,
                device: torch.device | str = "cpu") -> HuginnLM:
    """The model in a checkpoint directory in Huginn's layout, in eval mode, with its
    tokenizer as `.tokenizer`: config.json (Huginn's keys: HuginnConfig.read), the
    weights by Huginn's parameter names in safetensors files (model.safetensors, or the
    shards a model.safetensors.index.json maps), and tokenizer.json (read with
    `tokenizers`). Every name and shape is checked against the layout before a weight
    is read: a missing, unexpected or misshapen parameter is a CheckpointError naming
    the file and the parameter. Two extras the published model's checkpoints may hold
    are accepted: its rotary table (freqs_cis, checked against the one config.json
    implies) and, with tied embeddings, a copy of the embedding as lm_head.weight
    (shape-checked and not used: the published model ties it to the embedding too).

    Built on the meta device and filled by assignment, so loading needs the weights'
    memory once (a 3.5B model: about 14 GB in fp32, 7 GB in bf16), not twice.

    A local directory is the real path. To fetch Huginn-0125 from the Hugging Face
    hub first (optional; run nowhere in this project, and it needs the
    `huggingface_hub` package and network access):

        from huggingface_hub import snapshot_download
        path = snapshot_download("tomg-group-umd/huginn-0125", allow_patterns=[
            "config.json", "model*.safetensors*", "tokenizer.json"])
        model = load_huginn(path, dtype="bfloat16", device="cuda")
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory (a checkpoint directory in "
                              "Huginn's layout: config.json, safetensors weights, "
                              "tokenizer.json)")
    dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype, got {dtype!r}")
    cfg = HuginnConfig.read(directory)
    tokenizer = read_tokenizer(directory, cfg)
    with torch.device("meta"):
        model = HuginnLM(cfg)
    files = weight_files(directory)
    shapes = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    check_names(files, shapes, extras(cfg))
    state = {}
    for path, names in group_by_file(files, shapes).items():
        with safe_open(str(path), framework="pt") as f:
            for name in names:
                state[name] = f.get_tensor(name).to(device=device, dtype=dtype)
    model.load_state_dict(state, strict=True, assign=True)
    model.rotary.rebuild(device)
    table = files.get(ROTARY_TABLE)
    if table is not None:
        check_rotary(table[0], model.rotary)
    model.tokenizer = tokenizer
    return model.eval().requires_grad_(False)


def read_tokenizer(directory: Path, cfg: HuginnConfig) -> Tokenizer:
    """tokenizer.json, whose ids must index the embedding."""
    path = directory / TOKENIZER
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file; the model's own tokenizer is read "
                              "from the checkpoint directory")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception on a malformed file
        raise CheckpointError(f"{path}: not a tokenizers tokenizer.json ({err})") from err
    if tokenizer.get_vocab_size() > cfg.vocab_size:
        raise CheckpointError(f"{path}: {tokenizer.get_vocab_size()} tokens, more than "
                              f"config.json's vocab_size {cfg.vocab_size}")
    return tokenizer


def weight_files(directory: Path) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """Every tensor the directory's safetensors files hold: name -> (file, shape), read
    from the files' headers only. The files: those model.safetensors.index.json maps
    names to, else every *.safetensors in the directory."""
    index = directory / INDEX
    if index.is_file():
        try:
            mapped = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{index}: no readable weight_map ({err})") from err
        paths = sorted({directory / f for f in mapped.values()})
    else:
        paths = sorted(directory.glob("*.safetensors"))
    if not paths:
        raise CheckpointError(f"{directory}: no *.safetensors weights")
    found: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for path in paths:
        if not path.is_file():
            raise CheckpointError(f"{path}: listed in {index.name} but missing")
        try:
            with safe_open(str(path), framework="pt") as f:
                names = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
        except Exception as err:  # safetensors raises its own error types
            raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from err
        for name, shape in names.items():
            if name in found:
                raise CheckpointError(f"{path}: {name} is also in {found[name][0].name}")
            found[name] = (path, shape)
    return found


def extras(cfg: HuginnConfig) -> dict[str, tuple[int, ...]]:
    """Tensors a checkpoint may hold beyond the parameters, with their shapes."""
    found = {ROTARY_TABLE: (1, cfg.context, 1, cfg.head_dim // 2, 2)}
    if cfg.tie_embeddings:
        found[TIED_HEAD] = (cfg.vocab_size, cfg.d_model)
    return found


def check_names(files: dict[str, tuple[Path, tuple[int, ...]]],
                shapes: dict[str, tuple[int, ...]], optional: dict[str, tuple[int, ...]]) -> None:
    """CheckpointError naming the files and parameters that do not fit the layout:
    missing, unexpected, or of another shape than config.json implies."""
    where = sorted({str(p) for p, _ in files.values()})
    problems = [f"{name} {shape} is missing (looked in {', '.join(where)})"
                for name, shape in shapes.items() if name not in files]
    for name, (path, shape) in files.items():
        wanted = shapes.get(name, optional.get(name))
        if wanted is None:
            problems.append(f"{path}: {name} is not a parameter of Huginn's layout at this "
                            "config.json")
        elif shape != wanted:
            problems.append(f"{path}: {name} has shape {shape}; config.json implies {wanted}")
    if problems:
        shown = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more"
                                            if len(problems) > 8 else "")
        raise CheckpointError(f"the weights do not fit Huginn's layout: {shown}")


def group_by_file(files: dict[str, tuple[Path, tuple[int, ...]]],
                  names: dict[str, tuple[int, ...]]) -> dict[Path, list[str]]:
    """The parameters to read, by the file that holds each (one open per file)."""
    grouped: dict[Path, list[str]] = {}
    for name in names:
        grouped.setdefault(files[name][0], []).append(name)
    return grouped


def check_rotary(path: Path, rotary: Rotary) -> None:
    """The published model saves its rotary table (1, T, 1, head_dim / 2, [cos, sin]):
    it must be the one config.json's rope_base and block_size give."""
    with safe_open(str(path), framework="pt") as f:
        saved = f.get_tensor(ROTARY_TABLE)
    ours = torch.stack([rotary.cos, rotary.sin], dim=-1).cpu()
    tol = max(1e-5, 2 * torch.finfo(saved.dtype).eps)
    if not torch.allclose(saved[0, :, 0].float(), ours, atol=tol, rtol=0.0):
        raise CheckpointError(f"{path}: {ROTARY_TABLE} is not the rotary table of "
                              f"config.json's rope_base {rotary.base} and block_size "
                              f"{rotary.context}")
