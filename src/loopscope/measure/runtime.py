"""Per-token exits that skip the work: the adaptive runtime.

Same semantics as the masked forward (loopscope.measure.masked.masked_forward), which
computes every token at every loop; here each loop gathers the tokens still active and
runs the core's projections and feed-forward on them alone. Attention runs for the
active queries over every key: each core block keeps a key/value buffer with one row
per token position, written in place for the tokens computed now, so an exited token
shows the keys and values of its exit loop. Final outputs equal the masked forward's to
float tolerance for any exit decisions (tests/test_runtime.py).

- `score`: teacher-forced scoring of whole sequences (B, T).
- `generate`: token-by-token decoding with a KV cache per (core block, loop): at loop i
  a block attends to each earlier token's keys and values from min(i, its exit loop).
  Several streams advance together, each at its own loop, sharing one core call per
  step (depth-wise batching).

Both call the policy objects of loopscope.measure.exits exactly as the masked forward does:
begin() with each token's H_0 when it starts, check() with the tokens checked at a loop.
The work is marked by part (loopscope.measure.ledger), so the exit benchmark can say
where a call's time goes. Exit checks: a rule that reads logits runs the coda and head
for the active tokens only. With at most one coda block its keys and values are cached
too (an exited token's coda input is its frozen exit state); a deeper coda is
recomputed over every token, since its later blocks' inputs change while other tokens
still move.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from loopscope.measure.exits import Policy
from loopscope.measure.ledger import part
from loopscope.weights.model import LoopedLM


@dataclass
class Layout:
    """Where the active tokens of a loop sit: flat positions idx (sorted, into B * T),
    the batch rows that hold any, and each token's row and slot among the padded
    queries of its row; mask (rows, 1, slots, T) lets a query see keys at positions up
    to its own."""

    idx: torch.Tensor
    rows: torch.Tensor
    row_of: torch.Tensor
    slot_of: torch.Tensor
    slots: int
    mask: torch.Tensor
    full: bool  # every token active: plain causal attention, no gathering

    @classmethod
    def of(cls, active: torch.Tensor) -> Layout:
        b, t = active.shape
        idx = active.flatten().nonzero().squeeze(1)
        if len(idx) == b * t:
            every = torch.arange(b, device=active.device)
            return cls(idx, every, idx // t, idx % t, t, torch.empty(0), True)
        batch_row, pos = idx // t, idx % t
        counts = active.sum(1)
        rows = counts.nonzero().squeeze(1)
        row_index = torch.full((b,), -1, dtype=torch.long, device=active.device)
        row_index[rows] = torch.arange(len(rows), device=active.device)
        starts = torch.cumsum(counts, 0) - counts
        slot_of = torch.arange(len(idx), device=active.device) - starts[batch_row]
        slots = int(counts.max()) if len(idx) else 0
        qpos = torch.full((len(rows), slots), -1, dtype=torch.long, device=active.device)
        qpos[row_index[batch_row], slot_of] = pos
        keys = torch.arange(t, device=active.device)
        mask = (keys[None, None, :] <= qpos[:, :, None])[:, None]
        return cls(idx, rows, row_index[batch_row], slot_of, slots, mask, False)


class GatherKV:
    """One attention block of the runtime: a (B * T, H, d_head) key and value buffer,
    written in place for the tokens computed now; the queries of those tokens attend,
    per sequence, to every key at a position up to theirs."""

    def __init__(self, b: int, t: int, n_heads: int, d_head: int, like: torch.Tensor) -> None:
        self.b, self.t = b, t
        self.k = like.new_zeros((b * t, n_heads, d_head))
        self.v = like.new_zeros((b * t, n_heads, d_head))
        self.layout: Layout | None = None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        lay = self.layout
        n_heads, d_head = q.shape[1], q.shape[3]
        if lay.full:  # x is the whole batch (B, T, d): keep the keys, attend as usual
            with part("kv"):
                self.k.copy_(k.transpose(1, 2).reshape(-1, n_heads, d_head))
                self.v.copy_(v.transpose(1, 2).reshape(-1, n_heads, d_head))
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        with part("kv"):
            self.k.index_copy_(0, lay.idx, k[0].transpose(0, 1))
            self.v.index_copy_(0, lay.idx, v[0].transpose(0, 1))
            keys = self.k.view(self.b, self.t, n_heads, d_head)[lay.rows].transpose(1, 2)
            values = self.v.view(self.b, self.t, n_heads, d_head)[lay.rows].transpose(1, 2)
        with part("gather"):
            queries = q.new_zeros((len(lay.rows), lay.slots, n_heads, d_head))
            queries[lay.row_of, lay.slot_of] = q[0].transpose(0, 1)
        y = F.scaled_dot_product_attention(queries.transpose(1, 2), keys, values,
                                           attn_mask=lay.mask)
        with part("gather"):
            return y.transpose(1, 2)[lay.row_of, lay.slot_of].transpose(0, 1)[None]


@dataclass
class ScoreRun:
    """The runtime's results on a batch: final logits over the exit states (B, T, V),
    the exit states, each token's exit loop and checks, and per loop how many tokens
    were active (the work the loop did)."""

    logits: torch.Tensor
    state: torch.Tensor
    exit_loop: torch.Tensor
    checks: torch.Tensor
    active_per_loop: list[int]


def _kv(model: LoopedLM, b: int, t: int, like: torch.Tensor, blocks: int) -> list[GatherKV]:
    heads = model.cfg.n_heads
    return [GatherKV(b, t, heads, model.cfg.d_model // heads, like) for _ in range(blocks)]


class Scorer:
    """The state of one scoring batch: every token's current state (H_k as read out;
    the next loop starts from model.carry of it), the prelude output, the loops run, and
    the core's (and a one-block coda's) key/value buffers."""

    def __init__(self, model: LoopedLM, idx: torch.Tensor, h0: torch.Tensor | None) -> None:
        self.model, (self.b, self.t) = model, idx.shape
        with part("once"):
            e = model.inputs(idx)
            self.h = (model.initial_state(e) if h0 is None else h0.to(e.dtype)
                      ).flatten(0, 1).clone()
        self.e = e.flatten(0, 1)
        self.loops = 0
        self.core = _kv(model, self.b, self.t, self.h, len(model.core))
        self.coda = _kv(model, self.b, self.t, self.h, 1) if len(model.coda) == 1 else None

    def advance(self, lay: Layout) -> None:
        """One loop for the tokens of the layout; the others keep their state."""
        for kv in self.core:
            kv.layout = lay
        first, self.loops = self.loops == 0, self.loops + 1
        if lay.full:
            with part("loop"):
                h = self.model.carry(self.h.view(self.b, self.t, -1), first)
                out = self.model.step(h, self.e.view(self.b, self.t, -1), self.core)
            with part("gather"):
                self.h.copy_(out.flatten(0, 1))
            return
        with part("gather"):
            h, e = self.h[lay.idx][None], self.e[lay.idx][None]
        with part("loop"):
            out = self.model.step(self.model.carry(h, first), e, self.core)
        with part("gather"):
            self.h.index_copy_(0, lay.idx, out[0])

    def logits(self, lay: Layout) -> torch.Tensor:
        """Logits (N, V) of the layout's tokens at a check: the coda over every token's
        current state, computed for those queries alone where that is exact."""
        model, h = self.model, self.h
        if not model.coda:
            return model.readout(h[lay.idx], last=True)
        if self.coda is not None:
            self.coda[0].layout = lay
            x = h.view(self.b, self.t, -1) if lay.full else h[lay.idx][None]
            return model.readout(model.coda[0](x, self.coda[0]).flatten(0, 1), last=True)
        return model.read(h.view(self.b, self.t, -1), last=True).flatten(0, 1)[lay.idx]

    def state(self) -> torch.Tensor:
        return self.h.view(self.b, self.t, -1)


@torch.no_grad()
def score(model: LoopedLM, idx: torch.Tensor, policy: Policy, cap: int,
          h0: torch.Tensor | None = None) -> ScoreRun:
    """Teacher-forced scoring with per-token exits (module doc); tokens still active
    after loop `cap` exit there."""
    b, t = idx.shape
    run = Scorer(model, idx, h0)
    active = torch.ones((b, t), dtype=torch.bool, device=idx.device)
    exit_loop = torch.full((b * t,), cap, dtype=torch.long, device=idx.device)
    checks = torch.zeros(b * t, dtype=torch.long, device=idx.device)
    counts = []
    policy.reset(b * t)
    policy.begin(torch.arange(b * t, device=idx.device), run.h)
    for loop in range(1, cap + 1):
        with part("gather"):
            lay = Layout.of(active)
        counts.append(len(lay.idx))
        run.advance(lay)
        if loop == cap or not policy.checks_at(loop):
            continue
        with part("check"):
            logits = run.logits(lay) if policy.needs_logits else None
            checks[lay.idx] += 1
            loops = torch.full_like(lay.idx, loop)
            leaving = lay.idx[policy.check(loops, run.h[lay.idx], logits, lay.idx)]
        with part("gather"):
            exit_loop[leaving] = loop
            active.view(-1)[leaving] = False
            done = not active.any()
        if done:
            break
    state = run.state()
    with part("once"):
        logits = model.read(state, last=True)
    return ScoreRun(logits, state, exit_loop.view(b, t), checks.view(b, t), counts)


class LoopKV:
    """Decoding cache of one attention block: keys and values per stream, loop and
    position, (S, loops, T, H, d_head). The calling streams write their current
    token's entry at their own loop and attend to their own stream at that loop up to
    their position; `freeze` gives an exited token's later loops its exit-loop entry."""

    def __init__(self, s: int, loops: int, t: int, n_heads: int, d_head: int,
                 like: torch.Tensor) -> None:
        self.k = like.new_zeros((s, loops, t, n_heads, d_head))
        self.v = like.new_zeros((s, loops, t, n_heads, d_head))
        self.t = t
        self.at: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        streams, loop, pos = self.at  # (S',) each; loop 0-based
        with part("kv"):
            self.k[streams, loop, pos] = k[:, :, 0]
            self.v[streams, loop, pos] = v[:, :, 0]
            keys = self.k[streams, loop].transpose(1, 2)
            values = self.v[streams, loop].transpose(1, 2)
            mask = (torch.arange(self.t, device=q.device)[None, :]
                    <= pos[:, None])[:, None, None]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)

    def freeze(self, streams: torch.Tensor, loop: torch.Tensor, pos: torch.Tensor) -> None:
        """Exited tokens (0-based exit loop): loops after it see the exit-loop entry."""
        for s, j, p in zip(streams.tolist(), loop.tolist(), pos.tolist(), strict=True):
            self.k[s, j + 1:, p] = self.k[s, j, p]
            self.v[s, j + 1:, p] = self.v[s, j, p]


@dataclass
class GenerateRun:
    """Decoding results: per stream and position the final logits (S, T, V), the exit
    loop and checks, and the number of batched steps the decode took."""

    logits: torch.Tensor
    exit_loop: torch.Tensor
    checks: torch.Tensor
    steps: int


def _cache(model: LoopedLM, s: int, loops: int, t: int, like: torch.Tensor, blocks: int
           ) -> list[LoopKV]:
    heads = model.cfg.n_heads
    return [LoopKV(s, loops, t, heads, model.cfg.d_model // heads, like) for _ in range(blocks)]


def _point(caches: list[LoopKV], streams: torch.Tensor, loop: torch.Tensor,
           pos: torch.Tensor) -> None:
    for cache in caches:
        cache.at = (streams, loop, pos)


@torch.no_grad()
def generate(model: LoopedLM, tokens: torch.Tensor, policy: Policy, cap: int,
             h0: torch.Tensor | None = None) -> GenerateRun:
    """Decode S streams token by token, teacher-forced on tokens (S, T), each token
    running its own number of loops (module doc). Every step, each stream still
    decoding runs one loop of its current token, whatever loop that is, in one
    batched core call; a stream whose token exits reads it out and starts its next
    token in the following step."""
    s, t = tokens.shape
    d, dev = model.cfg.d_model, tokens.device
    like = model.head.weight
    prelude = _cache(model, s, 1, t, like, len(model.prelude))
    core = _cache(model, s, cap, t, like, len(model.core))
    coda = _cache(model, s, 1, t, like, len(model.coda))
    pos = torch.zeros(s, dtype=torch.long, device=dev)  # current token of each stream
    loop = torch.zeros(s, dtype=torch.long, device=dev)  # loops it has run
    h = like.new_zeros((s, d))
    e = like.new_zeros((s, d))
    logits = like.new_zeros((s, t, model.cfg.vocab_size))
    exit_loop = torch.zeros((s, t), dtype=torch.long, device=dev)
    checks = torch.zeros((s, t), dtype=torch.long, device=dev)
    policy.reset(s * t)
    steps = 0
    while bool((pos < t).any()):
        steps += 1
        with part("gather"):
            live = (pos < t).nonzero().squeeze(1)
            start = live[loop[live] == 0]
        if len(start):  # a new token: its embedding through the prelude, then H_0
            with part("once"):
                _start_tokens(model, tokens, start, pos[start], prelude, e, h, h0, policy)
        with part("gather"):
            _point(core, live, loop[live], pos[live])
            x, first, inject = h[live][:, None], (loop[live] == 0)[:, None], e[live][:, None]
        with part("loop"):  # H_0 at loop 1
            out = model.step(model.carry(x, first=first), inject, core)[:, 0]
        with part("gather"):
            h[live] = out
            loop[live] += 1
            checking = live[(loop[live] < cap)
                            & torch.tensor([policy.checks_at(int(i)) for i in loop[live]],
                                           dtype=torch.bool, device=dev)]
            leaving = live[loop[live] == cap]
            read = torch.zeros(0, dtype=torch.long, device=dev)
        if len(checking):
            with part("check"):
                flat = checking * t + pos[checking]
                out = None
                if policy.needs_logits:
                    out = _read_current(model, h, coda, checking, pos)
                checks[checking, pos[checking]] += 1
                exits = policy.check(loop[checking], h[checking], out, flat)
            with part("gather"):
                if out is not None:
                    logits[checking[exits], pos[checking[exits]]] = out[exits]
                    read = checking[exits]
                leaving = torch.cat([leaving, checking[exits]])
        if len(leaving):
            _leave(model, h, coda, core, leaving, read, loop, pos, logits, exit_loop)
    return GenerateRun(logits, exit_loop, checks, steps)


def _leave(model: LoopedLM, h: torch.Tensor, coda: list[LoopKV], core: list[LoopKV],
           leaving: torch.Tensor, read: torch.Tensor, loop: torch.Tensor, pos: torch.Tensor,
           logits: torch.Tensor, exit_loop: torch.Tensor) -> None:
    """The streams `leaving` finish their current tokens: the final readout of those a
    check did not read, their exit loops, their keys and values frozen for the later
    loops, and their next tokens."""
    with part("once"):
        unread = leaving[~torch.isin(leaving, read)]
        if len(unread):
            logits[unread, pos[unread]] = _read_current(model, h, coda, unread, pos)
    with part("kv"):
        for cache in core:
            cache.freeze(leaving, loop[leaving] - 1, pos[leaving])
    with part("gather"):
        exit_loop[leaving, pos[leaving]] = loop[leaving]
        pos[leaving] += 1
        loop[leaving] = 0


def _start_tokens(model: LoopedLM, tokens: torch.Tensor, start: torch.Tensor,
                  p: torch.Tensor, prelude: list[LoopKV], e: torch.Tensor, h: torch.Tensor,
                  h0: torch.Tensor | None, policy: Policy) -> None:
    """Streams `start` begin their tokens at positions p: the embedding through the
    prelude (into e, what every loop re-injects), then H_0 (into h), handed to the
    policy."""
    t = tokens.shape[1]
    x = model.embed(tokens[start, p]) + model.pos(p)
    x = (x * model.embed_scale)[:, None]
    _point(prelude, start, torch.zeros_like(start), p)
    for block, cache in zip(model.prelude, prelude, strict=True):
        x = block(x, cache)
    e[start] = x[:, 0]
    h[start] = (model.initial_state(x)[:, 0] if h0 is None else h0[start, p])
    policy.begin(start * t + p, h[start])


def _read_current(model: LoopedLM, h: torch.Tensor, coda: list[LoopKV],
                  streams: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Logits of the streams' current tokens: the coda over their current state,
    attending to the earlier tokens' coda entries (from their exit states)."""
    z = h[streams][:, None]
    _point(coda, streams, torch.zeros_like(streams), pos[streams])
    for block, cache in zip(model.coda, coda, strict=True):
        z = block(z, cache)
    return model.readout(z[:, 0], last=True)
