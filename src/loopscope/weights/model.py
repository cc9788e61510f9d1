"""LoopedLM: one model class for every looped-transformer variant loopscope studies.

    tokens -> embedding -> prelude (n_prelude unshared blocks)
           -> core (n_core shared blocks, applied `loops` times) -> H_1 .. H_K
           -> coda (n_coda unshared blocks) -> readout -> tied LM head

Paper A's looped LM is ``n_prelude = n_coda = 0``, pre-norm blocks, H_0 = embeddings.
Paper B's backbone adds a prelude and coda, sandwich blocks, prelude re-injection at
every loop and a noise initial state. Each loop's state H_k is both read out (so it can
be supervised) and fed back (so it drives the next loop): the readout option decides
whether the loss can see the state's scale. An inter-loop norm (paper A's control) sits
on the recurrent path only: the next loop starts from RMSNorm(H_k) while H_k, as the core
produced it, is what is read out (LoopedLM.carry). Stable injection (Parcae's, a fourth
scale control: StableInjection) contracts the carried state every loop instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from loopscope.looped.types import KV, Cost, LoopHook, Spec, Specified
from loopscope.weights.config import ModelConfig, Read


class RMSNorm(nn.Module):
    """x / rms(x) * g: invariant to the scale of x, which is the point of paper A."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.proj.residual = True
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, kv: KV | None = None) -> torch.Tensor:
        """Causal self-attention over x (B, T, d); with kv, the queries of x attend to
        what kv returns instead (per-token exits: frozen keys and values of exited
        tokens, and a layout where x holds only the tokens still computing)."""
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)
                   for z in (q, k, v))
        if kv is not None:
            y = kv(q, k, v)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    """The feed-forward sub-block, 4x wide: GELU, or SwiGLU (a SiLU-gated third matrix,
    which is what paper A's published parameter counts imply)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False)
        self.gate = (nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False)
                     if cfg.ffn == "swiglu" else None)
        self.down = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=False)
        self.down.residual = True
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is None:
            return self.drop(self.down(F.gelu(self.up(x))))
        return self.drop(self.down(F.silu(self.gate(x)) * self.up(x)))


class Block(nn.Module):
    """A decoder block; pre-norm ``h + f(norm(h))`` or Huginn's sandwich form.

    Pre-norm leaves the residual stream unnormalized, so its scale is carried from
    loop to loop (paper A, Lemma 2). Sandwich normalizes after each sub-block as well,
    which bounds the state (paper B's backbone).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.sandwich = cfg.block == "sandwich"
        self.n1, self.n2 = RMSNorm(cfg.d_model), RMSNorm(cfg.d_model)
        if self.sandwich:
            self.n3, self.n4 = RMSNorm(cfg.d_model), RMSNorm(cfg.d_model)
        self.attn, self.mlp = Attention(cfg), MLP(cfg)

    def forward(self, x: torch.Tensor, kv: KV | None = None) -> torch.Tensor:
        if self.sandwich:
            x = self.n2(self.attn(self.n1(x), kv) + x)
            return self.n4(self.mlp(self.n3(x)) + x)
        x = x + self.attn(self.n1(x), kv)
        return x + self.mlp(self.n2(x))


# Per-token math over the vocabulary (log-softmax, KL, CE) runs on CHUNK_BYTES of rows
# at a time: each temporary then stays in cache and on the reused heap, where a whole
# (tokens x vocabulary) array (16 MiB for a batch of 2048 tokens and V = 2048) costs a
# fresh mapping and a page fault per 4 KiB on every operation (compute.tune_heap's
# measure setting). Row by row the results are bit-identical
# (tests/test_policies.py).
# Side by side on a 2-core AMD EPYC (fp32), A1's KL signal over a batch of 2048 tokens
# took 26 ms in 1 MiB chunks against 88 ms whole.
CHUNK_BYTES = 1 << 20


def row_chunks(n: int, width: int, itemsize: int = 4) -> list[slice]:
    """Slices over n rows of `width` values, each about CHUNK_BYTES."""
    rows = max(1, CHUNK_BYTES // max(1, width * itemsize))
    return [slice(i, min(i + rows, n)) for i in range(0, n, rows)]


def token_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy (N,) of logits (N, V) in fp32, in row chunks."""
    out = torch.empty(len(targets), dtype=torch.float32, device=logits.device)
    for rows in row_chunks(len(targets), logits.shape[-1]):
        out[rows] = F.cross_entropy(logits[rows].float(), targets[rows], reduction="none")
    return out


def loop_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of a readout (B, T, V) against targets (B, T), in float32:
    the training loss and every measured CE use this one definition."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


@dataclass(frozen=True)
class LoopSchedule:
    """Which loops of a forward pass build a graph and which are read out.

    LoopedLM.forward runs by it, and `plan` asks it what a training step keeps in
    memory, so the two cannot disagree.
    """

    loops: int
    frozen: int  # the first `frozen` loops run without a graph (truncated backprop)
    read: tuple[int, ...]  # the loops (1-based) whose state is decoded to logits

    @property
    def graph_loops(self) -> int:
        return self.loops - self.frozen


def schedule(loops: int, read: Read = "all", grad_loops: int = 0) -> LoopSchedule:
    """read: "all" reads out every loop that builds a graph (per-loop loss,
    diagnostics), "last" only the final one (final-loop loss), "none" none.
    grad_loops: only the last grad_loops loops build a graph (0: every loop)."""
    if loops < 1:
        raise ValueError(f"loops must be >= 1, got {loops}")
    if read not in ("all", "last", "none"):
        raise ValueError(f"read must be all | last | none, got {read!r}")
    frozen = loops - grad_loops if 0 < grad_loops < loops else 0
    wanted = {"all": range(frozen + 1, loops + 1), "last": (loops,), "none": ()}[read]
    return LoopSchedule(loops, frozen, tuple(wanted))


def cost(cfg: ModelConfig) -> Cost:
    """Forward FLOPs per token of a model of this config: 2 per weight of every matrix a
    token goes through, plus attention's two (T x d) products at the mean query position,
    4 d (T + 1) / 2 per block for a causal context T. Norms and elementwise ops are not
    counted (a few percent at d = 128). A function of the config alone, so planning and
    benchmarks need no model."""
    d, t = cfg.d_model, cfg.context
    ffn = (3 if cfg.ffn == "swiglu" else 2) * 4 * d * d
    block = 2 * (4 * d * d + ffn) + 2 * d * (t + 1)
    adapter = {"concat_adapter": 2 * 2 * d * d, "stable": 2 * d * d}.get(cfg.inject, 0)
    return Cost(prelude=cfg.n_prelude * block, loop=cfg.n_core * block + adapter,
                readout=cfg.n_coda * block + 2 * d * cfg.vocab_size)


def param_count(cfg: ModelConfig) -> int:
    """Unique parameters of LoopedLM(cfg), the tied head once: the same count as
    LoopedLM.num_params (tests/test_model.py), from the config alone, so a memory or disk
    check needs no model (building one, even on the meta device, costs a second)."""
    d = cfg.d_model
    ffn = (3 if cfg.ffn == "swiglu" else 2) * 4 * d * d
    block = 4 * d * d + ffn + (4 if cfg.block == "sandwich" else 2) * d
    return (cfg.vocab_size * d + cfg.context * d
            + (cfg.n_prelude + cfg.n_core + cfg.n_coda) * block
            + (2 * d * d if cfg.inject == "concat_adapter" else 0)
            + (d * d + 3 * d if cfg.inject == "stable" else 0)
            + (d if cfg.inter_loop_norm else 0) + d)


@dataclass
class LoopOutput:
    """Per-loop results: states[k-1] is H_k; logits[k-1] is its readout (None if unread);
    initial is H_0, the state the first loop starts from."""

    states: list[torch.Tensor]
    logits: list[torch.Tensor | None]
    initial: torch.Tensor


class StableInjection(nn.Module):
    """Parcae's stable injection (Prairie, Novack, Berg-Kirkpatrick, Fu 2026, its
    DiagonalInjection): a loop starts from A_bar h + Delta (B RMSNorm(e)), with A_bar =
    exp(-Delta A), A = exp(a) and Delta = softplus(delta) per channel, and B a full
    d x d matrix applied to the normalised injection input (Parcae normalises its
    prelude's output). Every entry of A_bar lies in (0, 1) whatever the parameters
    (Delta A is kept in [MIN_RATE, MAX_RATE], so float32 rounds it to neither 0 nor 1):
    the carried state is contracted every loop, and what the core adds on top is all
    that can grow it. Initialised as Parcae does: A = 1, Delta such that A_bar = DECAY,
    B the identity. Its parameters take no weight decay (Parcae's `_no_weight_decay`)."""

    DECAY = math.sqrt(1.0 / 5.0)  # Parcae's initial A_bar, about 0.447
    MIN_RATE, MAX_RATE = 1e-6, 30.0

    def __init__(self, d: int) -> None:
        super().__init__()
        rate = -math.log(self.DECAY)  # Delta at A = 1; delta is its inverse softplus
        self.a = nn.Parameter(torch.zeros(d))
        self.delta = nn.Parameter(torch.full((d,), rate + math.log(-math.expm1(-rate))))
        self.b = nn.Parameter(torch.eye(d))
        self.norm = RMSNorm(d)  # the injection input's normalisation
        for param in self.parameters():
            param.no_weight_decay = True

    def coefficients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(A_bar, Delta), each per channel. The rate Delta A is formed in log space,
        log Delta + a, so that no parameter value overflows it to inf or nan (softplus
        is exp(x) below -20, where its log is x)."""
        d = self.delta
        log_step = torch.where(d < -20, d, torch.log(F.softplus(d.clamp(min=-20))))
        log_rate = (log_step + self.a).clamp(math.log(self.MIN_RATE), math.log(self.MAX_RATE))
        return torch.exp(-torch.exp(log_rate)), torch.exp(log_step)

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        a_bar, step = self.coefficients()
        return a_bar * h + step * F.linear(self.norm(e), self.b)


class LoopedLM(Specified, nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.prelude = nn.ModuleList(Block(cfg) for _ in range(cfg.n_prelude))
        self.core = nn.ModuleList(Block(cfg) for _ in range(cfg.n_core))
        self.coda = nn.ModuleList(Block(cfg) for _ in range(cfg.n_coda))
        self.adapter = (nn.Linear(2 * cfg.d_model, cfg.d_model, bias=False)
                        if cfg.inject == "concat_adapter" else None)
        self.stable = StableInjection(cfg.d_model) if cfg.inject == "stable" else None
        self.loop_norm = RMSNorm(cfg.d_model) if cfg.inter_loop_norm else None
        self.norm_out = RMSNorm(cfg.d_model)  # used by the normed readouts only
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied embeddings
        # Huginn scales the input embedding by sqrt(d) (its embeddings start small).
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.init == "huginn" else 1.0
        # The interface's sizes and flags (Spec). The depth it trained at (nominal_mean,
        # sampler_mean): R for a fixed depth; loopscope.weights.checkpoint.load_model
        # sets a sampled depth's from the cell's train options (weights.depth.means).
        self.spec = Spec(loops=cfg.loops, d_model=cfg.d_model, context=cfg.context,
                         prelude_blocks=cfg.n_prelude, kv_blocks=cfg.n_core,
                         coda_blocks=cfg.n_coda, readout_eps=self.norm_out.eps,
                         random_state=cfg.state_init == "noise",
                         nominal_mean=float(cfg.loops), sampler_mean=float(cfg.loops))
        self.init_weights()

    def init_weights(self) -> None:
        """Initialize the weights by model.init; the norms' gains stay 1 in every scheme.

        gpt2: N(0, 0.02), output projections of residual branches 0.02 / sqrt(2L).
        huginn (Huginn's recipe): truncated normal (+-3 sigma) with sigma = sqrt(2/(5d)),
        output projections sigma / sqrt(2L), embeddings sigma, times sqrt(d) at the input.
        L = n_prelude + n_core * loops + n_coda, the expected depth in blocks.
        paper_a (paper A's reference code): PyTorch's defaults, left as constructed:
        token and position embeddings N(0, 1) (the tied head shares the token
        embedding), nn.Linear's kaiming-uniform U(-1/sqrt(fan_in), 1/sqrt(fan_in)), no
        scaled residual projections, no embedding scale. This matters to paper A, whose
        H_0 is the embedding: with N(0, 1) coordinates ||H_0|| is about sqrt(2d) (token
        plus position), 1/0.02 = 50 times gpt2's 0.02 * sqrt(2d), so the scale the loops
        carry, the quantity paper A studies, starts where the reference's does."""
        cfg = self.cfg
        if cfg.init == "paper_a":
            return
        n_layers = cfg.n_prelude + cfg.n_core * cfg.loops + cfg.n_coda
        std = 0.02 if cfg.init == "gpt2" else math.sqrt(2 / (5 * cfg.d_model))
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)) and name != "head":
                s = std / math.sqrt(2 * n_layers) if getattr(module, "residual", False) else std
                if cfg.init == "gpt2":
                    nn.init.normal_(module.weight, mean=0.0, std=s)
                else:
                    nn.init.trunc_normal_(module.weight, mean=0.0, std=s, a=-3 * s, b=3 * s)

    def num_params(self) -> int:
        """Unique parameters (the tied head counted once)."""
        return sum(p.numel() for p in self.parameters())

    exit_score = None  # no native exit score: its exits are the rules' alone

    def reader(self) -> Reader:
        """The modules read runs, sharing this model's parameters (Reader)."""
        return Reader(self)

    def cost(self) -> Cost:
        """Forward FLOPs per token of this model's parts (see cost)."""
        return cost(self.cfg)

    def read(self, h: torch.Tensor, last: bool, positions: torch.Tensor | None = None,
             kvs: list[KV] | None = None) -> torch.Tensor:
        """Decode a loop's state to logits through the coda and the readout. kvs: one
        attention override per coda block (the exit runtime's cached keys and values);
        positions: unused, the coda's attention is causal over the tokens given or the
        override's."""
        for i, block in enumerate(self.coda):
            h = block(h, kvs[i] if kvs is not None else None)
        return self.readout(h, last)

    def readout(self, z: torch.Tensor, last: bool) -> torch.Tensor:
        """The LM head over the coda's output, normalized first where the readout is
        (normed; final_norm at the last loop only)."""
        if self.cfg.readout == "normed" or (self.cfg.readout == "final_norm" and last):
            z = self.norm_out(z)
        return self.head(z)

    def inputs(self, idx: torch.Tensor, positions: torch.Tensor | None = None,
               kvs: list[KV] | None = None) -> torch.Tensor:
        """The prelude's output e for token ids (B, T): what loop 1 starts from (embed)
        and what the core re-injects at every loop. positions (T,) or (B, T): the learned
        position embedding's rows (default 0 .. T - 1). kvs: one attention override per
        prelude block (the exit runtime's decoding cache)."""
        t = idx.shape[1]
        if t > self.cfg.context:
            raise ValueError(f"sequence length {t} exceeds model.context {self.cfg.context}")
        if positions is None:
            positions = torch.arange(t, device=idx.device)
        e = self.embed(idx) + self.pos(positions)
        e = self.drop(e * self.embed_scale if self.embed_scale != 1.0 else e)
        for i, block in enumerate(self.prelude):
            e = block(e, kvs[i] if kvs is not None else None)
        return e

    def initial_state(self, e: torch.Tensor, generator: torch.Generator | None = None
                      ) -> torch.Tensor:
        """H_0. embed: the prelude output. noise: drawn like the embeddings are, a
        truncated normal (+-3 sigma) with the embeddings' initial sigma, times the
        embedding scale: Huginn's initialize_state under Huginn's init (sigma =
        sqrt(2/(5d)), times sqrt(d)), Parcae's "like-init" under any. Pass a seeded
        generator to draw the same H_0 in every stage (training uses torch's RNG)."""
        if self.cfg.state_init == "embed":
            return e
        std = self.embedding_std()
        noise = torch.empty(e.shape, dtype=e.dtype, device=e.device)
        nn.init.trunc_normal_(noise, std=std, a=-3 * std, b=3 * std, generator=generator)
        return noise * self.embed_scale if self.embed_scale != 1.0 else noise

    def embedding_std(self) -> float:
        """The sigma the token embeddings are initialised with (init_weights)."""
        return {"gpt2": 0.02, "paper_a": 1.0}.get(self.cfg.init,
                                                  math.sqrt(2 / (5 * self.cfg.d_model)))

    def carry(self, h: torch.Tensor, first: bool | torch.Tensor = False) -> torch.Tensor:
        """What a loop starts from: carry(H_0, first=True) for loop 1, carry(H_k) for
        loop k + 1, where H_k is loop k's state as step returned it (after any hook).

        With model.inter_loop_norm, loop k + 1 starts from RMSNorm(H_k), as in paper
        A's reference code; H_k itself is what is read out, stored, logged and
        penalized, so the loss still sees its scale while the recurrent path does not.
        Loop 1 starts from H_0 as it is (no norm before the first loop). Without the
        norm, h itself. first: True for H_0, or a bool tensor (h.shape[:-1]) where
        tokens at different loops share one call (the runtime's decoding)."""
        if self.loop_norm is None or first is True:
            return h
        normed = self.loop_norm(h)
        if first is False:
            return normed
        return torch.where(first[..., None], h, normed)

    def step(self, h: torch.Tensor, e: torch.Tensor, kvs: list[KV] | None = None,
             k: int | torch.Tensor | None = None, positions: torch.Tensor | None = None
             ) -> torch.Tensor:
        """One loop: re-inject the prelude output, apply the shared core. h is the
        loop's input, carry(...) of the previous state (see carry); returns the loop's
        state H_k, before any inter-loop norm. kvs: one attention override per core
        block. k (the loop index) and positions: unused, the core is the same at every
        loop and its attention is causal over the tokens given."""
        if self.cfg.inject == "add":
            h = h + e
        elif self.cfg.inject == "concat_adapter":
            h = self.adapter(torch.cat([h, e], dim=-1))
        elif self.cfg.inject == "stable":
            h = self.stable(h, e)
        for i, block in enumerate(self.core):
            h = block(h, kvs[i] if kvs is not None else None)
        return h

    def forward(
        self,
        idx: torch.Tensor,
        loops: int | None = None,
        hook: LoopHook | None = None,
        read: Read = "all",
        grad_loops: int = 0,
        h0: torch.Tensor | None = None,
    ) -> LoopOutput:
        """Run `loops` loops (default: the configured count) over token ids (B, T).

        read: "all" reads out every loop (per-loop loss, diagnostics), "last" only the
        final one (final-loop loss), "none" returns states only.
        grad_loops: truncated backprop (paper B): only the last grad_loops loops build a
        graph and are read out; the earlier ones run without gradients, so memory does
        not grow with a long sampled depth. 0: every loop.
        h0: the initial state (B, T, d) for a noise state_init; default: drawn here.
        """
        sched = schedule(self.cfg.loops if loops is None else loops, read, grad_loops)
        e = self.inputs(idx)
        h = self.initial_state(e) if h0 is None else h0.to(e.dtype)
        initial = h
        states, logits = [], []
        for k in range(1, sched.loops + 1):
            with torch.set_grad_enabled(torch.is_grad_enabled() and k > sched.frozen):
                h = self.step(self.carry(h, first=k == 1), e, k=k)
            if hook is not None:
                h = hook(k, h)
            states.append(h)
            logits.append(self.read(h, last=k == sched.loops) if k in sched.read else None)
        return LoopOutput(states=states, logits=logits, initial=initial)


class Reader(nn.Module):
    """What LoopedLM.read runs (the coda, the readout's norm and the head), holding the
    model's own modules: its forward is LoopedLM.read, the same code, so a float64 copy
    of it (loopscope.measure.per_loop.sweep) computes exactly what a float64 copy of the whole
    model would, at the cost of the readout's weights alone."""

    def __init__(self, model: LoopedLM) -> None:
        super().__init__()
        self.cfg, self.coda, self.norm_out, self.head = (model.cfg, model.coda,
                                                         model.norm_out, model.head)

    forward = LoopedLM.read
    readout = LoopedLM.readout
