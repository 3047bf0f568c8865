"""Measured runs for lesson 09 (long context and mixture of experts) and its benchmarks.

Functions whose name ends in ``_run`` run on every rank inside ``simlib.launch`` / ``Cluster.run``; the others
run in the caller. The code they measure is ``simlib.parallel.context`` and ``simlib.parallel.experts``.
"""

from __future__ import annotations

import statistics
import time


def _qkv(batch, heads, seq, head_dim, seed=0, dtype=None):
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, seq, head_dim, generator=g, dtype=dtype or torch.float32) for _ in range(3)]


# ── the causal imbalance of the plain split: two formulas, one per kind of kernel ─────────────────────────────
def causal_imbalance(cp: int, skips: str = "blocks") -> float:
    """Slowest rank's attention work over the mean under the plain (contiguous) causal split, as ``cp`` grows large.

    ``skips="blocks"``: a kernel that skips the blocks wholly above the diagonal but computes each diagonal block
    whole (masked entries included) — **the course's ring attention** (``simlib.parallel.context``): rank r computes
    r + 1 blocks of (S/cp)², the last cp, the mean (cp + 1)/2, so ``2·cp/(cp + 1)`` (1.33x at cp = 2), exactly.
    ``skips="entries"``: a kernel that computes only the unmasked entries (FlashAttention's causal kernel skips the
    masked tiles inside the diagonal block too; in the limit of small tiles): the last rank (cp − ½)·c², the mean
    cp·c²/2, so ``(2·cp − 1)/cp`` (1.5x at cp = 2) as the chunk c grows; :func:`unmasked_work` counts it exactly.
    """
    if cp < 1:
        raise ValueError(f"cp must be at least 1, got {cp}")
    if skips == "blocks":
        return 2 * cp / (cp + 1)
    if skips == "entries":
        return (2 * cp - 1) / cp
    raise ValueError(f"skips must be 'blocks' or 'entries', got {skips!r}")


def unmasked_work(seq_len: int, cp: int) -> list[int]:
    """Unmasked score entries (a query and a key at or before it) of each rank's queries, plain split: what a kernel
    that skips every masked entry computes. Rank r holds queries [r·c, (r + 1)·c), c = S/cp; query i sees i + 1 keys."""
    if seq_len % cp:
        raise ValueError(f"seq_len {seq_len} is not divisible by cp {cp}")
    c = seq_len // cp
    return [sum(i + 1 for i in range(r * c, (r + 1) * c)) for r in range(cp)]


# ── context parallelism ────────────────────────────────────────────────────────────────────────────────────
def attention_equal_run(kind="ring", layout="contiguous", causal=True, batch=2, heads=4, seq=64, head_dim=16):
    """Attention forward and backward on this rank's positions; max differences to one process (rank 0 computes)."""
    import torch
    import torch.distributed as dist

    from ..parallel import context
    from ..parallel.comm_log import CommLog

    rank, n = dist.get_rank(), dist.get_world_size()
    full = _qkv(batch, heads, seq, head_dim, dtype=torch.float64)
    weights = torch.randn(batch, heads, seq, head_dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    q, k, v = (context.shard_sequence(t, rank, n, layout).requires_grad_() for t in full)
    log, stats = CommLog(), {}
    fn = context.ring_attention if kind == "ring" else context.ulysses_attention
    out = fn(q, k, v, causal, layout, log=log, stats=stats) if kind == "ring" else fn(q, k, v, causal, log=log)
    forward_bytes = log.bytes
    (out * context.shard_sequence(weights, rank, n, layout)).sum().backward()
    pieces = [None] * n
    dist.all_gather_object(pieces, dict(out=out.detach(), dq=q.grad, dk=k.grad, dv=v.grad))
    errors = None
    if rank == 0:
        for t in full:
            t.requires_grad_()
        ref = torch.nn.functional.scaled_dot_product_attention(*full, is_causal=causal)
        (ref * weights).sum().backward()
        want = dict(out=ref.detach(), dq=full[0].grad, dk=full[1].grad, dv=full[2].grad)
        errors = {
            name: float((context.unshard_sequence([p[name] for p in pieces], layout) - want[name]).abs().max())
            for name in want
        }
    return dict(
        rank=rank,
        errors=errors,
        work=stats.get("work"),
        forward_bytes=forward_bytes,
        backward_bytes=log.bytes - forward_bytes,
        formula=context.comm_volume(batch, heads, seq, head_dim, n, kind, bytes_per_element=8),
    )


def work_run(layout="contiguous", batch=2, heads=4, seq=1024, head_dim=32, repeats=5):
    """Causal ring-attention forward: score entries and the compute seconds of each rank (median of repeats)."""
    import torch
    import torch.distributed as dist

    from ..parallel import context

    rank, n = dist.get_rank(), dist.get_world_size()
    q, k, v = (context.shard_sequence(t, rank, n, layout) for t in _qkv(batch, heads, seq, head_dim))
    times, waits, work = [], [], None
    with torch.no_grad():
        for i in range(repeats + 1):
            stats = {}
            dist.barrier()
            context.ring_attention(q, k, v, True, layout, stats=stats)
            t1 = time.perf_counter()
            dist.barrier()  # the step ends when the slowest rank is done
            if i:  # the first is warm-up
                times.append(stats["compute_s"])
                waits.append(time.perf_counter() - t1)
            work = stats["work"]
    return dict(
        rank=rank,
        layout=layout,
        work=work,
        compute_s=statistics.median(times),
        idle_s=statistics.median(waits),
        formula=context.causal_work(seq, n, layout)[rank],
    )


_SOLO: dict = {}


def memory_run(seq=1024, batch=1, heads=4, head_dim=32, layout="contiguous", group=None, solo=False):
    """Peak bytes of one ring-attention forward on this rank, against the formula.

    Counted exactly by :func:`simlib.lessons.memory.tensor_peak_bytes` (torch's ``MemTracker``: every tensor
    the forward allocates, from the op that makes it to its free, K/V blocks received included), above the
    rank's q, k, v. The process's resident high-water mark, used before, read one score block too many now
    and then on a loaded machine (late frees) and once missed the K/V blocks in flight."""
    import torch

    from ..parallel import context
    from ..parallel.all_to_all import group_rank_size
    from .memory import tensor_peak_bytes

    if solo:  # cp = 1 on rank 0 of a cluster (a group of its own), in a worker like the cp > 1 runs
        import torch.distributed as dist

        if "group" not in _SOLO:  # every rank must take part in making a group
            _SOLO["group"] = dist.new_group([0])
        if dist.get_rank() != 0:
            return None
        group = _SOLO["group"]
    rank, n = group_rank_size(group)
    q, k, v = (context.shard_sequence(t, rank, n, layout) for t in _qkv(batch, heads, seq, head_dim))
    with torch.no_grad():
        peak = tensor_peak_bytes(lambda: context.ring_attention(q, k, v, True, layout, group=group), q, k, v)
    formula = context.memory_per_rank(batch, heads, seq, head_dim, n, layout)
    return dict(
        rank=rank, cp=n, seq=seq, layout=layout, measured=peak, formula=formula["total"], scores=formula["scores"]
    )


def memory_sweep(clusters: dict, seqs, **sizes) -> list[dict]:
    """Per-rank peak attention memory for each sequence length and cp (``clusters``: {cp: Cluster}; cp = 1 runs
    on rank 0 of the smallest cluster, alone). One row per (cp, seq): the worst rank's measurement and the formula."""
    rows = []
    smallest = clusters[min(clusters)]
    for cp in sorted({1, *clusters}):
        for seq in seqs:
            outs = (
                [smallest.run(memory_run, seq, solo=True, **sizes)[0]]
                if cp == 1
                else clusters[cp].run(memory_run, seq, **sizes)
            )
            worst = max(outs, key=lambda o: o["measured"])
            rows.append(
                dict(
                    cp=cp,
                    seq=seq,
                    measured_MB=worst["measured"] / 2**20,
                    formula_MB=worst["formula"] / 2**20,
                    scores_MB=worst["scores"] / 2**20,
                    ratio=worst["measured"] / worst["formula"],
                )
            )
    return rows


def ring_vs_ulysses_run(batch=2, heads=8, seq=1024, head_dim=32, repeats=5, engine="native"):
    """Forward + backward time of ring (zig-zag) and Ulysses attention, and the bytes each sent, on this rank."""
    import torch.distributed as dist

    from ..parallel import context
    from ..parallel.comm_log import CommLog

    rank, n = dist.get_rank(), dist.get_world_size()
    out = dict(rank=rank)
    for kind, layout in (("ring", "zigzag"), ("ulysses", "contiguous")):
        full = _qkv(batch, heads, seq, head_dim)
        q, k, v = (context.shard_sequence(t, rank, n, layout).requires_grad_() for t in full)
        times, log = [], CommLog()
        for i in range(repeats + 1):
            log.clear()
            dist.barrier()
            t0 = time.perf_counter()
            y = (
                context.ring_attention(q, k, v, True, layout, log=log)
                if kind == "ring"
                else context.ulysses_attention(q, k, v, True, log=log, engine=engine)
            )
            y.sum().backward()
            if i:
                times.append(time.perf_counter() - t0)
        out[kind] = dict(
            seconds=statistics.median(times),
            bytes=log.bytes,
            comm_s=log.seconds,
            formula=context.comm_volume(batch, heads, seq, head_dim, n, kind)["total"],
        )
    return out


# ── expert parallelism ─────────────────────────────────────────────────────────────────────────────────────
def _moe_problem(tokens, hidden, num_experts, top_k, capacity_factor, seed=0, skew=0.0, dtype=None):
    import torch

    from ..parallel.experts import MoE

    torch.manual_seed(seed)
    moe = MoE(hidden, num_experts, top_k, capacity_factor)
    if dtype is not None:
        moe = moe.to(dtype)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(tokens, hidden, generator=g, dtype=dtype or torch.float32)
    if skew:  # a router that prefers expert 0: tokens pile up there and overflow its capacity
        with torch.no_grad():
            moe.router.weight[0] += skew * x.mean(0) / x.mean(0).norm()
            x += skew * x.mean(0) / x.mean(0).norm()
    return moe, x


def moe_equal_run(tokens=48, hidden=16, num_experts=8, top_k=2, capacity_factor=1.25, alpha=0.01):
    """The expert-parallel layer on this rank's tokens; rank 0 compares with the one-process layer."""
    import torch
    import torch.distributed as dist

    from ..models import shard
    from ..parallel.comm_log import CommLog
    from ..parallel.experts import ExpertParallelMoE

    rank, n = dist.get_rank(), dist.get_world_size()
    moe, x = _moe_problem(tokens, hidden, num_experts, top_k, capacity_factor, dtype=torch.float64)
    log = CommLog()
    layer = ExpertParallelMoE.from_dense(moe, log=log)
    xl = shard(x, rank, n).clone().requires_grad_()
    y, aux, stats = layer(xl)
    (y.square().sum() + alpha * aux).backward()
    dist.all_reduce(layer.router.weight.grad)
    local = num_experts // n
    mine = dict(
        y=y.detach(),
        x_grad=xl.grad,
        aux=aux.detach(),
        router=layer.router.weight.grad,
        experts={
            f"experts.{rank * local + i}.{name}": p.grad
            for i, e in enumerate(layer.experts)
            for name, p in e.named_parameters()
        },
        stats=stats,
        bytes=log.bytes_of("dispatch"),
    )
    every = [None] * n
    dist.all_gather_object(every, mine)
    if rank:
        return dict(rank=rank, stats=stats)
    ref_moe, ref_x = _moe_problem(tokens, hidden, num_experts, top_k, capacity_factor, dtype=torch.float64)
    ref_x.requires_grad_()
    ry, raux, rstats = ref_moe(ref_x)
    (ry.square().sum() + alpha * raux).backward()
    grads = {name: p.grad for name, p in ref_moe.named_parameters()}
    errors = dict(
        y=float((torch.cat([e["y"] for e in every]) - ry.detach()).abs().max()),
        x_grad=float((torch.cat([e["x_grad"] for e in every]) - ref_x.grad).abs().max()),
        aux=abs(float(sum(e["aux"] for e in every) - raux.detach())),
        router=max(float((e["router"] - grads["router.weight"]).abs().max()) for e in every),
        experts=max(float((g - grads[name]).abs().max()) for e in every for name, g in e["experts"].items()),
    )
    return dict(
        rank=0,
        stats=stats,
        errors=errors,
        reference=rstats,
        load=[t for e in every for t in e["stats"]["tokens_per_expert"]],
    )


def moe_load_run(
    tokens=256, hidden=64, num_experts=8, top_k=1, capacity_factor=1.25, skew=0.0, engine="native", repeats=5
):
    """Forward + backward of the EP layer: load per expert and rank, drops, aux loss, bytes and all-to-all time."""
    import torch.distributed as dist

    from ..models import shard
    from ..parallel.comm_log import CommLog
    from ..parallel.experts import ExpertParallelMoE, a2a_bytes_from_counts, a2a_volume

    rank, n = dist.get_rank(), dist.get_world_size()
    moe, x = _moe_problem(tokens, hidden, num_experts, top_k, capacity_factor, skew=skew)
    log = CommLog()
    layer = ExpertParallelMoE.from_dense(moe, log=log, engine=engine)
    xl = shard(x, rank, n)
    times, a2a = [], []
    for i in range(repeats + 1):
        log.clear()
        dist.barrier()
        t0 = time.perf_counter()
        y, aux, stats = layer(xl)
        (y.square().mean() + 0.01 * aux).backward()
        if i:
            times.append(time.perf_counter() - t0)
            a2a.append(log.seconds)
    aux_total = aux.detach().clone()
    dist.all_reduce(aux_total)
    kept = 1 - stats["dropped"] / stats["assignments"]
    return dict(
        rank=rank,
        ep=n,
        engine=engine,
        tokens_per_expert=stats["tokens_per_expert"],
        dropped=stats["dropped"],
        assignments=stats["assignments"],
        capacity=stats["capacity"],
        aux=float(aux_total),
        seconds=statistics.median(times),
        a2a_s=statistics.median(a2a),
        dispatch_bytes=log.bytes_of("dispatch"),
        dispatch_formula=a2a_bytes_from_counts(stats["sent_rows"], rank, hidden),
        uniform_formula=a2a_volume(tokens // n, hidden, top_k, n, kept=kept)["dispatch"],
    )


def a2a_engines_run(nbytes=1 << 20, repeats=10):
    """Seconds of one even all-to-all of ``nbytes`` per rank: Gloo's all_to_all_single and send/recv."""
    import torch
    import torch.distributed as dist

    from ..parallel.all_to_all import all_to_all

    n = dist.get_world_size()
    x = torch.randn(n, max(1, nbytes // 4 // n))
    out = {}
    for engine in ("native", "p2p"):
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            t0 = time.perf_counter()
            all_to_all(x, [1] * n, [1] * n, engine=engine)
            if i:
                times.append(time.perf_counter() - t0)
        out[engine] = statistics.median(times)
    return dict(rank=dist.get_rank(), bytes=x.numel() * 4, **out)
