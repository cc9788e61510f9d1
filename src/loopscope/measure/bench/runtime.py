"""Per-token exits that skip the work: the adaptive runtime.

Same semantics as the masked forward (loopscope.measure.exit_rules.masked.masked_forward), which
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

Both ask the policies through the one exit control loop the masked forward runs by
(loopscope.measure.exit_rules.exit_control), and reach the model only through the looped-model
interface (loopscope.looped.interface): the prelude, core and coda take attention
overrides (GatherKV, LoopKV here), which hold every token's keys and values, with
grouped-query heads where the model has them. The work is marked by part
(loopscope.measure.bench.ledger), so the exit benchmark can say where a call's time goes. Exit
checks: a rule that reads logits runs the coda and head for the active tokens only.
With at most one coda block its keys and values are cached too (an exited token's coda
input is its frozen exit state); a deeper coda is recomputed over every token, since
its later blocks' inputs change while other tokens still move.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from loopscope.looped.interface import LoopedModel
from loopscope.measure.bench.ledger import part
from loopscope.measure.exit_rules.exit_control import ExitControl, Exits, run
from loopscope.measure.exit_rules.exits import Policy


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


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention of q (B, Hq, Tq, dh) over k, v (B, Hkv, Tk, dh),
    grouped-query heads where Hkv < Hq; causal over the call's tokens without a mask."""
    gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **gqa)


class GatherKV:
    """One attention block of the runtime: a (B * T, Hkv, d_head) key and value buffer
    (allocated at the first call, in the keys' shape and dtype), written in place for
    the tokens computed now; the queries of those tokens attend, per sequence, to every
    key at a position up to theirs."""

    def __init__(self, b: int, t: int) -> None:
        self.b, self.t = b, t
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.layout: Layout | None = None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        lay = self.layout
        heads, d_head = k.shape[1], k.shape[3]
        if self.k is None:
            self.k = k.new_zeros((self.b * self.t, heads, d_head))
            self.v = v.new_zeros((self.b * self.t, heads, d_head))
        if lay.full:  # x is the whole batch (B, T, d): keep the keys, attend as usual
            with part("kv"):
                self.k.copy_(k.transpose(1, 2).reshape(-1, heads, d_head))
                self.v.copy_(v.transpose(1, 2).reshape(-1, heads, d_head))
            return _attend(q, k, v)
        with part("kv"):
            self.k.index_copy_(0, lay.idx, k[0].transpose(0, 1))
            self.v.index_copy_(0, lay.idx, v[0].transpose(0, 1))
            keys = self.k.view(self.b, self.t, heads, d_head)[lay.rows].transpose(1, 2)
            values = self.v.view(self.b, self.t, heads, d_head)[lay.rows].transpose(1, 2)
        with part("gather"):
            queries = q.new_zeros((len(lay.rows), lay.slots, q.shape[1], d_head))
            queries[lay.row_of, lay.slot_of] = q[0].transpose(0, 1)
        y = _attend(queries.transpose(1, 2), keys, values, lay.mask)
        with part("gather"):
            return y.transpose(1, 2)[lay.row_of, lay.slot_of].transpose(0, 1)[None]


@dataclass
class ScoreRun(Exits):
    """The runtime's results on a batch (Exits), and per loop how many tokens were
    active (the work the loop did)."""

    active_per_loop: list[int]


class Scorer:
    """The state of one scoring batch: every token's current state (H_k as read out;
    the next loop starts from model.carry of it), the prelude output, the loops run, and
    the core's (and a one-block coda's) key/value buffers."""

    def __init__(self, model: LoopedModel, idx: torch.Tensor, h0: torch.Tensor | None) -> None:
        self.model, (self.b, self.t) = model, idx.shape
        with part("once"):
            e = model.inputs(idx)
            self.h = (model.initial_state(e) if h0 is None else h0.to(e.dtype)
                      ).flatten(0, 1).clone()
        self.e = e.flatten(0, 1)
        self.core = [GatherKV(self.b, self.t) for _ in range(model.kv_blocks)]
        self.coda = [GatherKV(self.b, self.t)] if model.coda_blocks == 1 else None

    def advance(self, lay: Layout, loop: int) -> None:
        """Loop `loop` for the tokens of the layout; the others keep their state."""
        for kv in self.core:
            kv.layout = lay
        first = loop == 1
        if lay.full:
            with part("loop"):
                h = self.model.carry(self.h.view(self.b, self.t, -1), first)
                out = self.model.step(h, self.e.view(self.b, self.t, -1), self.core, k=loop)
            with part("gather"):
                self.h.copy_(out.flatten(0, 1))
            return
        with part("gather"):
            h, e = self.h[lay.idx][None], self.e[lay.idx][None]
        with part("loop"):
            out = self.model.step(self.model.carry(h, first), e, self.core, k=loop,
                                  positions=(lay.idx % self.t)[None])
        with part("gather"):
            self.h.index_copy_(0, lay.idx, out[0])

    def logits(self, lay: Layout) -> torch.Tensor:
        """Logits (N, V) of the layout's tokens at a check: the coda over every token's
        current state, computed for those queries alone where that is exact."""
        model, h = self.model, self.h
        if model.coda_blocks > 1:
            return model.read(h.view(self.b, self.t, -1), last=True).flatten(0, 1)[lay.idx]
        if lay.full:
            x, positions = h.view(self.b, self.t, -1), None
        else:
            x, positions = h[lay.idx][None], (lay.idx % self.t)[None]
        if self.coda is not None:
            self.coda[0].layout = lay
        return model.read(x, last=True, positions=positions, kvs=self.coda).flatten(0, 1)

    def state(self) -> torch.Tensor:
        return self.h.view(self.b, self.t, -1)


@torch.no_grad()
def score(model: LoopedModel, idx: torch.Tensor, policy: Policy, cap: int,
          h0: torch.Tensor | None = None) -> ScoreRun:
    """Teacher-forced scoring with per-token exits (module doc); tokens still active
    after loop `cap` exit there."""
    b, t = idx.shape
    scorer = Scorer(model, idx, h0)
    control = ExitControl(policy, cap, (b, t), idx.device)
    control.begin(torch.arange(b * t, device=idx.device), scorer.h)
    counts: list[int] = []
    now: dict[str, Layout] = {}

    def advance(loop: int) -> None:
        with part("gather"):
            now["lay"] = lay = Layout.of(control.active)
        counts.append(len(lay.idx))
        scorer.advance(lay, loop)

    def checked() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        lay = now["lay"]
        with part("check"):
            logits = scorer.logits(lay) if control.needs_logits else None
        return lay.idx, scorer.h[lay.idx], logits

    run(control, advance, checked)
    state = scorer.state()
    with part("once"):
        logits = model.read(state, last=True)
    return ScoreRun(logits, state, control.exit_loop, control.checks, counts)


class LoopKV:
    """Decoding cache of one attention block: keys and values per stream, loop and
    position, (S, loops, T, Hkv, d_head), allocated at the first call in the keys'
    shape and dtype. The calling streams write their current token's entry at their own
    loop and attend to their own stream at that loop up to their position; `freeze`
    gives an exited token's later loops its exit-loop entry."""

    def __init__(self, s: int, loops: int, t: int) -> None:
        self.s, self.loops, self.t = s, loops, t
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.at: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        streams, loop, pos = self.at  # (S',) each; loop 0-based
        if self.k is None:
            shape = (self.s, self.loops, self.t, k.shape[1], k.shape[3])
            self.k, self.v = k.new_zeros(shape), v.new_zeros(shape)
        with part("kv"):
            self.k[streams, loop, pos] = k[:, :, 0]
            self.v[streams, loop, pos] = v[:, :, 0]
            keys = self.k[streams, loop].transpose(1, 2)
            values = self.v[streams, loop].transpose(1, 2)
            mask = (torch.arange(self.t, device=q.device)[None, :]
                    <= pos[:, None])[:, None, None]
        return _attend(q, keys, values, mask)

    def freeze(self, streams: torch.Tensor, loop: torch.Tensor, pos: torch.Tensor) -> None:
        """Exited tokens (0-based exit loop): loops after it see the exit-loop entry."""
        if self.k is None:
            return
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


def _point(caches: list[LoopKV], streams: torch.Tensor, loop: torch.Tensor,
           pos: torch.Tensor) -> None:
    for cache in caches:
        cache.at = (streams, loop, pos)


@dataclass
class Decoder:
    """The state of a decode: per stream its current token's position, the loops it has
    run, its state and input (S, d); the caches of the prelude, core and coda; the
    logits read so far (allocated at the first readout, in the model's vocabulary)."""

    model: LoopedModel
    tokens: torch.Tensor
    control: ExitControl
    prelude: list[LoopKV]
    core: list[LoopKV]
    coda: list[LoopKV]
    pos: torch.Tensor
    loop: torch.Tensor
    h: torch.Tensor | None = None
    e: torch.Tensor | None = None
    logits: torch.Tensor | None = None

    def start(self, start: torch.Tensor, h0: torch.Tensor | None) -> None:
        """Streams `start` begin their current tokens: the embedding through the prelude
        (into e, what every loop re-injects), then H_0 (into h), handed to the policy."""
        p, t = self.pos[start], self.tokens.shape[1]
        _point(self.prelude, start, torch.zeros_like(start), p)
        x = self.model.inputs(self.tokens[start, p][:, None], positions=p[:, None],
                              kvs=self.prelude)
        if self.h is None:  # the first tokens: the buffers, in the model's dtype
            s, d = self.tokens.shape[0], x.shape[-1]
            self.h, self.e = x.new_zeros((s, d)), x.new_zeros((s, d))
        self.e[start] = x[:, 0]
        self.h[start] = self.model.initial_state(x)[:, 0] if h0 is None else h0[start, p]
        self.control.begin(start * t + p, self.h[start])

    def read(self, streams: torch.Tensor) -> torch.Tensor:
        """Logits of the streams' current tokens: the coda over their current state,
        attending to the earlier tokens' coda entries (from their exit states)."""
        _point(self.coda, streams, torch.zeros_like(streams), self.pos[streams])
        out = self.model.read(self.h[streams][:, None], last=True,
                              positions=self.pos[streams][:, None], kvs=self.coda)[:, 0]
        if self.logits is None:
            s, t = self.tokens.shape
            self.logits = out.new_zeros((s, t, out.shape[-1]))
        return out

    def leave(self, leaving: torch.Tensor, read: torch.Tensor) -> None:
        """The streams `leaving` finish their current tokens: the final readout of those
        a check did not read, their keys and values frozen for the later loops, and
        their next tokens."""
        pos = self.pos
        with part("once"):
            unread = leaving[~torch.isin(leaving, read)]
            if len(unread):
                out = self.read(unread)
                self.logits[unread, pos[unread]] = out
        with part("kv"):
            for cache in self.core:
                cache.freeze(leaving, self.loop[leaving] - 1, pos[leaving])
        with part("gather"):
            pos[leaving] += 1
            self.loop[leaving] = 0


@torch.no_grad()
def generate(model: LoopedModel, tokens: torch.Tensor, policy: Policy, cap: int,
             h0: torch.Tensor | None = None) -> GenerateRun:
    """Decode S streams token by token, teacher-forced on tokens (S, T), each token
    running its own number of loops (module doc). Every step, each stream still
    decoding runs one loop of its current token, whatever loop that is, in one
    batched core call; a stream whose token exits reads it out and starts its next
    token in the following step."""
    s, t = tokens.shape
    dev = tokens.device
    dec = Decoder(model, tokens, ExitControl(policy, cap, (s, t), dev),
                  [LoopKV(s, 1, t) for _ in range(model.prelude_blocks)],
                  [LoopKV(s, cap, t) for _ in range(model.kv_blocks)],
                  [LoopKV(s, 1, t) for _ in range(model.coda_blocks)],
                  torch.zeros(s, dtype=torch.long, device=dev),  # each stream's token
                  torch.zeros(s, dtype=torch.long, device=dev))  # the loops it has run
    control, pos, loop = dec.control, dec.pos, dec.loop
    steps = 0
    while bool((pos < t).any()):
        steps += 1
        with part("gather"):
            live = (pos < t).nonzero().squeeze(1)
            start = live[loop[live] == 0]
        if len(start):  # a new token: its embedding through the prelude, then H_0
            with part("once"):
                dec.start(start, h0)
        with part("gather"):
            _point(dec.core, live, loop[live], pos[live])
            x, inject = dec.h[live][:, None], dec.e[live][:, None]
            first = (loop[live] == 0)[:, None]
        with part("loop"):  # H_0 at loop 1
            out = model.step(model.carry(x, first=first), inject, dec.core, k=loop[live] + 1,
                             positions=pos[live][:, None])[:, 0]
        with part("gather"):
            dec.h[live] = out
            loop[live] += 1
            checking = live[torch.tensor([control.checks_at(int(i)) for i in loop[live]],
                                         dtype=torch.bool, device=dev)]
            leaving = live[loop[live] == cap]
            read = torch.zeros(0, dtype=torch.long, device=dev)
        if len(checking):
            with part("check"):
                out = dec.read(checking) if control.needs_logits else None
                exits = control.check(checking * t + pos[checking], loop[checking],
                                      dec.h[checking], out)
                exits = exits // t  # the streams whose tokens exit
            with part("gather"):
                if out is not None:
                    mine = torch.isin(checking, exits)
                    dec.logits[exits, pos[exits]] = out[mine]
                    read = exits
                leaving = torch.cat([leaving, exits])
        if len(leaving):
            dec.leave(leaving, read)
    return GenerateRun(dec.logits, control.exit_loop, control.checks, steps)
