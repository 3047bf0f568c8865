"""Context parallelism: attention over a sequence split across the ranks of a group.

Each rank holds ``S / cp`` positions of q, k and v, shaped ``(batch, heads, S_local, head_dim)``. Two ways to
attend over the whole sequence:

- **Ring attention** (Liu et al. 2023, "Ring attention with blockwise transformers"): the K/V blocks travel
  around the ring of ranks, one hop a step, while each rank attends its queries to the block it holds and
  merges the partial results with the online softmax (Milakov & Gimelshein 2018; FlashAttention's
  log-sum-exp rescaling). Backward goes around the ring again, carrying each block's dK/dV with it.
  With a causal mask a block from a later position is skipped; with the plain (contiguous) split the last
  rank then does ``cp`` blocks of work and the first one, so the **zig-zag** split (Llama 3, picotron) gives
  rank i chunks i and 2cp-1-i of 2cp equal chunks: every rank does the same work.
- **Ulysses** (Jacobs et al. 2023, DeepSpeed-Ulysses): one all-to-all re-shards q, k, v from "my positions,
  all heads" to "all positions, my heads", each rank runs ordinary attention on its heads, and a second
  all-to-all shards the output back by sequence. Needs ``heads % cp == 0``.

Both equal ``F.scaled_dot_product_attention`` over the whole sequence in one process, forward and backward
(``tests/test_context.py``). :func:`causal_work`, :func:`memory_per_rank` and :func:`comm_volume` are the
formulas lesson 09 and ``benchmarks/context_parallel.py`` measure against.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from .all_to_all import AllToAll, group_rank_size, peer
from .comm_log import CommLog

LAYOUTS = ("contiguous", "zigzag")


# ── how the sequence is split ─────────────────────────────────────────────────────────────────────────────
def chunks_of(rank: int, cp: int, seq_len: int, layout: str = "contiguous") -> list[tuple[int, int]]:
    """Global (start, stop) position ranges rank ``rank`` holds, in the order they sit in its local tensor."""
    check_split(seq_len, cp, layout)
    if layout == "contiguous":
        n = seq_len // cp
        return [(rank * n, (rank + 1) * n)]
    c = seq_len // (2 * cp)
    return [(rank * c, (rank + 1) * c), ((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)]


def check_split(seq_len: int, cp: int, layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ValueError(f"the context-parallel degree cp must be an int >= 1, got {cp!r}")
    pieces = cp if layout == "contiguous" else 2 * cp
    if seq_len % pieces:
        fits = [s for s in (seq_len - seq_len % pieces, seq_len - seq_len % pieces + pieces) if s > 0]
        raise ValueError(
            f"sequence length {seq_len} does not split into {pieces} equal chunks (cp = {cp}, "
            f"{layout} split needs a multiple of {pieces}): pad or cut the sequence to "
            f"{' or '.join(map(str, fits))}, or choose a cp that divides it"
        )


def shard_sequence(x: torch.Tensor, rank: int, cp: int, layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """This rank's positions of ``x`` along ``dim`` (the sequence dimension)."""
    return torch.cat([x.narrow(dim, a, b - a) for a, b in chunks_of(rank, cp, x.shape[dim], layout)], dim)


def unshard_sequence(pieces: list[torch.Tensor], layout: str = "contiguous", dim: int = -2) -> torch.Tensor:
    """The whole sequence from every rank's local piece (``pieces[r]`` from rank ``r``)."""
    cp = len(pieces)
    seq_len = pieces[0].shape[dim] * cp
    full = [None] * (1 if layout == "contiguous" else 2) * cp
    for r, piece in enumerate(pieces):
        offset = 0
        for a, b in chunks_of(r, cp, seq_len, layout):
            full[a // (b - a)] = piece.narrow(dim, offset, b - a)
            offset += b - a
    return torch.cat(full, dim)


# ── the formulas ──────────────────────────────────────────────────────────────────────────────────────────
def _pairs(rank, src, cp, seq_len, layout, causal):
    """(q chunk, k chunk, 'full' | 'diagonal') pairs that rank ``rank`` computes with ``src``'s K/V block."""
    out = []
    for qi, (qa, qb) in enumerate(chunks_of(rank, cp, seq_len, layout)):
        for ki, (ka, kb) in enumerate(chunks_of(src, cp, seq_len, layout)):
            if not causal or qa >= kb:
                out.append((qi, ki, "full"))
            elif (qa, qb) == (ka, kb):
                out.append((qi, ki, "diagonal"))
            # else: every key comes after every query: nothing to compute
    return out


def causal_work(seq_len: int, cp: int, layout: str = "contiguous", causal: bool = True) -> list[int]:
    """Score entries (query x key pairs) each rank computes per batch row and head, masked blocks skipped."""
    check_split(seq_len, cp, layout)
    c = seq_len // cp if layout == "contiguous" else seq_len // (2 * cp)
    return [c * c * sum(len(_pairs(r, s, cp, seq_len, layout, causal)) for s in range(cp)) for r in range(cp)]


def imbalance(work: list) -> float:
    """Slowest rank's work over the mean: 1 is balanced; the step waits for the slowest rank."""
    return max(work) / (sum(work) / len(work))


def memory_per_rank(
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    cp: int,
    layout: str = "contiguous",
    causal: bool = True,
    bytes_per_element: int = 4,
) -> dict:
    """Peak bytes :func:`ring_attention`'s forward allocates on one rank, above its q, k, v.

    Held through the pass: the output and log-sum-exp accumulators. Per block (:func:`block_attention`): the
    score matrix (B·H·c·c, the term that grows with the square of the sequence), the row maxima and sums
    (B·H·c each) and the block's output (B·H·c·D). Besides, which step is the peak: at step 0 a rank attends
    its own K/V (the causal mask on its diagonal blocks, 1 byte an entry, no B·H) while the first block
    arrives (one K/V pair in flight); from step 1 it holds the block it received and, from cp = 3, the next
    one arriving (two pairs), with no mask. FlashAttention-style kernels never hold a whole score block; this
    teaching code does, one block at a time. ``kv_in_flight`` and ``mask`` are those of the peak step.
    """
    check_split(seq_len, cp, layout)
    b = bytes_per_element
    s_local = seq_len // cp
    c = s_local if layout == "contiguous" else s_local // 2
    x = batch * heads * s_local * head_dim * b
    accumulators = x + batch * heads * s_local * b
    scores = batch * heads * c * c * b
    block_out = batch * heads * c * head_dim * b
    row_stats = 2 * batch * heads * c * b
    first = (0 if cp == 1 else 2 * x, c * c if causal else 0)  # step 0: (K/V in flight, mask)
    later = (2 * x if cp == 2 else 4 * x, 0) if cp > 1 else first  # steps 1.. (no diagonal block)
    kv_in_flight, mask = max(first, later, key=sum)
    return dict(
        accumulators=accumulators,
        kv_in_flight=kv_in_flight,
        scores=scores,
        mask=mask,
        block_out=block_out + row_stats,
        total=accumulators + kv_in_flight + mask + scores + block_out + row_stats,
    )


def comm_volume(
    batch: int, heads: int, seq_len: int, head_dim: int, cp: int, kind: str = "ring", bytes_per_element: int = 4
) -> dict:
    """Bytes one rank sends in one attention forward and backward.

    ring: forward passes its K/V block on cp-1 times (2·B·H·S/cp·D values each); backward passes K/V cp-1
    times and the dK/dV accumulators cp times (the last hop brings them home). Ulysses: four all-to-alls each
    way (q, k, v in and the output back; dO in and dq, dk, dv back), each rank sending (cp-1)/cp of a
    B·H·S/cp·D tensor in each.
    """
    x = batch * heads * (seq_len // cp) * head_dim * bytes_per_element
    if kind == "ring":
        forward, backward = 2 * x * (cp - 1), 2 * x * (cp - 1) + 2 * x * cp if cp > 1 else 0
    elif kind == "ulysses":
        forward = backward = 4 * x * (cp - 1) // cp
    else:
        raise ValueError(f"kind must be 'ring' or 'ulysses', got {kind!r}")
    return dict(forward=forward, backward=backward, total=forward + backward)


# ── ring attention ────────────────────────────────────────────────────────────────────────────────────────
def _mask(rows, kind, device):
    """True where a key comes after its query (masked); only diagonal blocks need one."""
    return torch.ones(rows, rows, dtype=torch.bool, device=device).triu_(1) if kind == "diagonal" else None


def block_attention(q, k, v, scale, mask=None):
    """Softmax attention of ``q`` over one K/V block: (output, log-sum-exp of each query's scores)."""
    s = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    if mask is not None:
        s.masked_fill_(mask, float("-inf"))
    m = s.amax(-1, keepdim=True)
    s.sub_(m).exp_()
    total = s.sum(-1, keepdim=True)
    out = torch.matmul(s, v).div_(total)
    return out, (m + total.log()).squeeze(-1)


def merge(out, lse, block_out, block_lse):
    """Online softmax: fold one block's (output, log-sum-exp) into the running ones, in place."""
    new = torch.logaddexp(lse, block_lse)
    out.mul_(torch.exp(lse - new).unsqueeze(-1)).add_(block_out.mul_(torch.exp(block_lse - new).unsqueeze(-1)))
    lse.copy_(new)


def ring_pass(tensors, group, log, name, tag=0):
    """Start sending ``tensors`` to the next rank and receiving the previous rank's: (buffers, requests).

    ``tag`` keeps two passes in flight at once apart (K/V and dK/dV have the same shapes)."""
    rank, n = group_rank_size(group)
    nxt, prv = peer(group, (rank + 1) % n), peer(group, (rank - 1) % n)
    buffers = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t, nxt, group, tag) for t in tensors]
    ops += [dist.P2POp(dist.irecv, b, prv, group, tag) for b in buffers]
    if log is not None:
        log.add(name, sum(t.numel() * t.element_size() for t in tensors), 0.0)
    return buffers, dist.batch_isend_irecv(ops)


def wait_ring(requests, log, start):
    for req in requests:
        req.wait()
    if log is not None:
        log.finish_last(start)


def _slices(rank, cp, seq_len, layout):
    """Local (start, stop) index ranges of this rank's chunks in its tensor."""
    out, offset = [], 0
    for a, b in chunks_of(rank, cp, seq_len, layout):
        out.append((offset, offset + b - a))
        offset += b - a
    return out


class RingAttention(torch.autograd.Function):
    """Ring attention with a ring backward; ``stats`` (a dict) receives the work and compute time per rank."""

    @staticmethod
    def forward(ctx, q, k, v, causal, layout, group, log, stats):
        rank, n = group_rank_size(group)
        seq_len, scale = q.shape[-2] * n, 1.0 / math.sqrt(q.shape[-1])
        mine = _slices(rank, n, seq_len, layout)
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        kv, src, work, compute = (k, v), rank, 0, 0.0
        for step in range(n):
            incoming = ring_pass(kv, group, log, "ring: K/V") if step < n - 1 else None
            t0 = time.perf_counter()
            theirs = _slices(src, n, seq_len, layout)
            for qi, ki, kind in _pairs(rank, src, n, seq_len, layout, causal):
                (qa, qb), (ka, kb) = mine[qi], theirs[ki]
                block_out, block_lse = block_attention(
                    q[..., qa:qb, :], kv[0][..., ka:kb, :], kv[1][..., ka:kb, :], scale, _mask(qb - qa, kind, q.device)
                )
                merge(out[..., qa:qb, :], lse[..., qa:qb], block_out, block_lse)
                del block_out, block_lse
                work += (qb - qa) * (kb - ka)
            compute += time.perf_counter() - t0
            if incoming is not None:
                t0 = time.perf_counter()
                buffers, requests = incoming
                wait_ring(requests, log, t0)
                kv, src = tuple(buffers), (src - 1) % n
                del incoming, buffers, requests  # the requests hold the sent block: let it go now
        if stats is not None:
            stats.update(rank=rank, work=work, compute_s=compute)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (causal, layout, group, log)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        causal, layout, group, log = ctx.args
        rank, n = group_rank_size(group)
        seq_len, scale = q.shape[-2] * n, 1.0 / math.sqrt(q.shape[-1])
        grad_out = grad_out.contiguous()
        delta = (grad_out * out).sum(-1)  # rowsum(dO ∘ O): the softmax backward's correction term
        dq = torch.zeros_like(q)
        mine = _slices(rank, n, seq_len, layout)
        kv, dkv, src = (k, v), (torch.zeros_like(k), torch.zeros_like(v)), rank
        for step in range(n):
            incoming = ring_pass(kv, group, log, "ring: K/V (backward)") if step < n - 1 else None
            theirs = _slices(src, n, seq_len, layout)
            for qi, ki, kind in _pairs(rank, src, n, seq_len, layout, causal):
                (qa, qb), (ka, kb) = mine[qi], theirs[ki]
                qc, kc, vc, go = q[..., qa:qb, :], kv[0][..., ka:kb, :], kv[1][..., ka:kb, :], grad_out[..., qa:qb, :]
                s = torch.matmul(qc, kc.transpose(-1, -2)).mul_(scale)
                mask = _mask(qb - qa, kind, q.device)
                if mask is not None:
                    s.masked_fill_(mask, float("-inf"))
                p = s.sub_(lse[..., qa:qb].unsqueeze(-1)).exp_()  # the softmax, from the saved log-sum-exp
                dkv[1][..., ka:kb, :] += torch.matmul(p.transpose(-1, -2), go)
                ds = p.mul_(torch.matmul(go, vc.transpose(-1, -2)).sub_(delta[..., qa:qb].unsqueeze(-1)))
                dq[..., qa:qb, :] += torch.matmul(ds, kc).mul_(scale)
                dkv[0][..., ka:kb, :] += torch.matmul(ds.transpose(-1, -2), qc).mul_(scale)
            if n > 1:  # this block's dK/dV travel on with it; after the last step they reach their owner
                t0 = time.perf_counter()
                buffers, requests = ring_pass(dkv, group, log, "ring: dK/dV (backward)", tag=1)
                wait_ring(requests, log, t0)
                dkv = tuple(buffers)
            if incoming is not None:
                t0 = time.perf_counter()
                buffers, requests = incoming
                wait_ring(requests, log, t0)
                kv, src = tuple(buffers), (src - 1) % n
                del incoming, buffers, requests
        return dq, dkv[0], dkv[1], None, None, None, None, None


def _check_qkv(q, k, v, rank):
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            f"rank {rank}: q, k and v must have one shape (batch, heads, local sequence, head_dim); "
            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )


def check_same_shape(q, group=None, what: str = "ring attention") -> None:
    """Raise on every rank of ``group`` if its ranks hold q of different shapes (one small all-gather).

    Blocks of other lengths would be sent around the ring into buffers of this rank's size: a wrong answer,
    a crash deep in the backend or a hang. Names every rank's local sequence length instead."""
    rank, n = group_rank_size(group)
    if n == 1:
        return
    shape = torch.tensor(q.shape, dtype=torch.int64, device=q.device)  # NCCL: on the GPU
    every = [torch.empty_like(shape) for _ in range(n)]
    dist.all_gather(every, shape, group=group)
    shapes = [tuple(int(d) for d in t) for t in every]
    if len(set(shapes)) == 1:
        return
    names = [f"rank {peer(group, r)}" for r in range(n)]
    lengths = {s[-2] for s in shapes}
    if len(lengths) > 1:
        held = ", ".join(f"{name}: {s[-2]}" for name, s in zip(names, shapes))
        raise ValueError(
            f"{what} needs the same local sequence length on every rank of its group, but the "
            f"ranks hold {held} positions: split each sequence into equal parts with "
            "shard_sequence (a length that is a multiple of cp, or of 2·cp for the zig-zag split; "
            "pad or cut it to one)"
        )
    held = ", ".join(f"{name}: {s}" for name, s in zip(names, shapes))
    raise ValueError(
        f"{what} needs q of one shape (batch, heads, local sequence, head_dim) on every rank of its "
        f"group, but the ranks hold {held}: give every rank the same batch rows and heads"
    )


def ring_attention(
    q,
    k,
    v,
    causal: bool = True,
    layout: str = "contiguous",
    group=None,
    log: CommLog | None = None,
    stats: dict | None = None,
) -> torch.Tensor:
    """Attention of this rank's queries over the whole sequence; q, k, v hold this rank's positions.

    ``layout``: how the sequence was split (:func:`shard_sequence`): ``"contiguous"`` or ``"zigzag"``.
    """
    rank, n = group_rank_size(group)
    _check_qkv(q, k, v, rank)
    check_same_shape(q, group)
    check_split(q.shape[-2] * n, n, layout)
    return RingAttention.apply(q, k, v, causal, layout, group, log, stats)


# ── Ulysses: all-to-all from sequence-sharded to head-sharded and back ───────────────────────────────────────
def seq_to_heads(x, group=None, log=None, engine="native"):
    """(B, H, S/cp, D) sequence-sharded -> (B, H/cp, S, D) head-sharded, by one all-to-all."""
    rank, n = group_rank_size(group)
    b, h, s, d = x.shape
    send = x.reshape(b, n, h // n, s, d).transpose(0, 1).reshape(n, -1)  # row j: heads group j, for rank j
    recv = AllToAll.apply(send, [1] * n, [1] * n, group, log, "ulysses: sequence -> heads", engine)
    return recv.view(n, b, h // n, s, d).permute(1, 2, 0, 3, 4).reshape(b, h // n, n * s, d)


def heads_to_seq(x, group=None, log=None, engine="native"):
    """(B, H/cp, S, D) head-sharded -> (B, H, S/cp, D) sequence-sharded, by one all-to-all."""
    rank, n = group_rank_size(group)
    b, hl, s, d = x.shape
    send = x.reshape(b, hl, n, s // n, d).permute(2, 0, 1, 3, 4).reshape(n, -1)  # row j: positions of rank j
    recv = AllToAll.apply(send, [1] * n, [1] * n, group, log, "ulysses: heads -> sequence", engine)
    return recv.view(n, b, hl, s // n, d).transpose(0, 1).reshape(b, n * hl, s // n, d)


def ulysses_attention(
    q, k, v, causal: bool = True, group=None, log: CommLog | None = None, engine: str = "native"
) -> torch.Tensor:
    """Attention over the whole sequence by re-sharding heads (DeepSpeed-Ulysses); contiguous split only."""
    rank, n = group_rank_size(group)
    _check_qkv(q, k, v, rank)
    check_same_shape(q, group, "Ulysses attention")
    heads = q.shape[1]
    if heads % n:
        ok = [c for c in range(1, heads + 1) if heads % c == 0]
        raise ValueError(
            f"rank {rank}: Ulysses gives each rank whole heads, so the number of heads ({heads}) must "
            f"be divisible by the context-parallel degree ({n}): use cp in {ok}, or ring attention "
            f"(ring_attention), which splits the sequence and works for any number of heads"
        )
    qh, kh, vh = (seq_to_heads(t, group, log, engine) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
    return heads_to_seq(out, group, log, engine)


# ── in a model: the split of each step, and attention that follows it ────────────────────────────────────────
class ContextSplit:
    """Which positions of each sequence this rank holds among the ``cp`` ranks of ``group`` (zig-zag by default).

    The split is on only inside ``with split.on():`` (the trainer's step, which also cuts the batch with
    :meth:`shard`); outside it the model sees whole sequences (evaluation, generation). torch's own
    ``context_parallel`` is such a context manager too (torchtitan).
    """

    def __init__(self, group, layout: str = "zigzag"):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.group, self.layout = group, layout
        self.rank, self.cp = group_rank_size(group)
        self.active = False

    @contextmanager
    def on(self):
        self.active = True
        try:
            yield self
        finally:
            self.active = False

    def shard(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's positions of ``x`` along ``dim``."""
        return shard_sequence(x, self.rank, self.cp, self.layout, dim)

    def positions(self, local_len: int, device=None) -> torch.Tensor:
        """The global positions of this rank's ``local_len`` tokens, in the order of its local tensor."""
        chunks = chunks_of(self.rank, self.cp, local_len * self.cp, self.layout)
        return torch.cat([torch.arange(a, b, device=device) for a, b in chunks])


class ContextParallelAttention(nn.Module):
    """A fused-qkv self-attention (``simlib.models.SelfAttention``: its ``qkv`` and ``out``, shared) that runs
    as ring attention over ``split.group`` while ``split`` is on, and as the module itself otherwise."""

    def __init__(self, attn: nn.Module, split: ContextSplit, log: CommLog | None = None):
        super().__init__()
        self.qkv, self.out = attn.qkv, attn.out
        self.num_heads, self.causal = attn.num_heads, attn.causal
        self.split, self.log = split, log

    def forward(self, x):  # (B, S_local, hidden) -> (B, S_local, hidden)
        from ..models import attend

        if not self.split.active:
            return self.out(attend(self.qkv(x), self.num_heads, self.causal))
        b, s = x.shape[0], x.shape[1]
        q, k, v = (t.contiguous() for t in self.qkv(x).view(b, s, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4))
        y = ring_attention(q, k, v, self.causal, self.split.layout, self.split.group, self.log)  # (B, h, S_local, d)
        return self.out(y.transpose(1, 2).reshape(b, s, -1))
