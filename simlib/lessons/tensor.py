"""Measured tensor-parallel runs for lesson 05 and its benchmark: a TP block against the unsplit block.

``tp_steps`` runs inside ``simlib.launch`` / ``Cluster.run``; ``dense_steps`` runs in any one process (the
notebook's kernel, or a worker) with however many threads that process has.
"""

from __future__ import annotations

import time

import numpy as np


def _block(kind, hidden, num_heads, seed):
    import torch

    from ..models import FeedForward, SelfAttention

    torch.manual_seed(seed)
    return FeedForward(hidden) if kind == "mlp" else SelfAttention(hidden, num_heads)


def _times(fn, steps, warmup):
    out = []
    for step in range(steps + warmup):
        start = time.perf_counter()
        fn()
        if step >= warmup:
            out.append(time.perf_counter() - start)
    q1, q3 = np.percentile(out, [25, 75])
    return dict(median=float(np.median(out)), iqr=float(q3 - q1), steps=steps)


def dense_steps(
    kind="mlp", hidden=512, batch=8, seq=128, num_heads=8, steps=10, warmup=2, seed=0, threads=None
) -> dict:
    """Forward + backward time of the unsplit block in this process (``threads``: torch threads to use)."""
    import torch

    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        block = _block(kind, hidden, num_heads, seed)
        x = torch.randn(batch, seq, hidden, requires_grad=True)  # as inside a model: dL/dx is needed

        def step():
            block.zero_grad(set_to_none=True)
            block(x).sum().backward()

        return dict(_times(step, steps, warmup), threads=torch.get_num_threads())
    finally:
        torch.set_num_threads(previous)


def tp_steps(kind="mlp", hidden=512, batch=8, seq=128, num_heads=8, steps=10, warmup=2, seed=0) -> dict:
    """Forward + backward time of the tensor-parallel block over the whole world, with its all-reduces."""
    import torch
    import torch.distributed as dist

    from ..env import device, synchronize
    from ..parallel import tensor

    dev = device()
    block = _block(kind, hidden, num_heads, seed).to(dev)
    log = tensor.CommLog()
    tp = (tensor.TensorParallelMLP if kind == "mlp" else tensor.TensorParallelAttention).from_dense(block, log=log)
    x = torch.randn(batch, seq, hidden, device=dev, requires_grad=True)  # as inside a model: dL/dx is needed

    def step():
        tp.zero_grad(set_to_none=True)
        tp(x).sum().backward()
        synchronize(dev)

    dist.barrier()
    timing = _times(step, steps, warmup)
    calls = log.calls[-2:]  # one step's all-reduces
    return dict(
        timing,
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        comm_seconds=float(np.median([c[3] for c in log.calls[2 * warmup :]]) * 2),
        step_bytes=sum(c[2] for c in calls),
        all_reduces_per_step=len(log.calls) // (steps + warmup),
        formula=tensor.comm_volume(batch, seq, hidden, dist.get_world_size()),
    )


def dtensor_steps(hidden=512, batch=8, seq=128, steps=10, warmup=2, seed=0) -> dict:
    """The same MLP split with DTensor's ``parallelize_module`` (ColwiseParallel, RowwiseParallel)."""
    import torch
    import torch.distributed as dist

    from ..parallel import tensor

    block = _block("mlp", hidden, 8, seed)
    reference_out = block(torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(1))).detach()
    tp = tensor.dtensor_parallelize(block, {"fc1": "colwise", "fc2": "rowwise"})
    x = torch.randn(batch, seq, hidden, generator=torch.Generator().manual_seed(1), requires_grad=True)
    same = bool(torch.allclose(tensor.materialize(tp(x)), reference_out, rtol=1e-5, atol=1e-6))

    def step():
        tp.zero_grad(set_to_none=True)
        tp(x).sum().backward()  # (an AsyncCollectiveTensor: autograd works on it, .wait() would cut the graph)

    dist.barrier()
    return dict(_times(step, steps, warmup), rank=dist.get_rank(), equal_to_unsplit=same)


def dense_on_rank0(kind="mlp", threads=1, **sizes):
    """:func:`dense_steps` on rank 0 of a cluster while the other ranks wait (same conditions as TP runs)."""
    import torch.distributed as dist

    out = dense_steps(kind, threads=threads, **sizes) if dist.get_rank() == 0 else None
    dist.barrier()
    return out


def compare(cluster, kind="mlp", rounds=3, **sizes) -> list[dict]:
    """Unsplit (1 and 2 threads) against simlib TP and DTensor TP, in alternating rounds on one cluster.

    Alternating rounds spread a busy machine's slow moments over every setup; each setup's figure is the
    median over rounds of its per-round median step time.
    """
    runs = {
        "unsplit, 1 process, 1 thread": [],
        "unsplit, 1 process, 2 threads": [],
        "simlib TP, 2 processes": [],
        "DTensor TP, 2 processes": [],
    }
    equal = True
    for _ in range(rounds):
        runs["unsplit, 1 process, 1 thread"].append(cluster.run(dense_on_rank0, kind, 1, **sizes)[0]["median"])
        runs["unsplit, 1 process, 2 threads"].append(cluster.run(dense_on_rank0, kind, 2, **sizes)[0]["median"])
        runs["simlib TP, 2 processes"].append(max(r["median"] for r in cluster.run(tp_steps, kind, **sizes)))
        if kind == "mlp":
            sizes_dt = {k: v for k, v in sizes.items() if k != "num_heads"}
            out = cluster.run(dtensor_steps, **sizes_dt)
            equal &= all(r["equal_to_unsplit"] for r in out)
            runs["DTensor TP, 2 processes"].append(max(r["median"] for r in out))
    rows = []
    for setup, times in runs.items():
        if times:
            q1, q3 = np.percentile(times, [25, 75])
            rows.append(
                dict(
                    setup=setup,
                    ms=1e3 * float(np.median(times)),
                    spread_ms=1e3 * float(q3 - q1),
                    rounds=len(times),
                    dtensor_equal=equal if "DTensor" in setup else None,
                )
            )
    return rows
