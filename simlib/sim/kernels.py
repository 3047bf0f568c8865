"""Lesson 09's kernels, measured for the cost model of :mod:`simlib.sim.context_experts` (``calibrate(kernels=True)``).

Ring-attention blocks, SDPA and the MoE layer, each on one rank alone while the other ranks do the same, and
Gloo's all-to-all between them, timed the way lesson 09's runs (:mod:`simlib.lessons.context_experts`) time a
layer: one call right after a barrier, the median of several. Besides: one tiny eager op back to back, and the
wait a small blocking collective adds after a stretch of small ops.
"""

from __future__ import annotations

import time

import numpy as np

from .hardware import fit_p2p


def _median_time(fn, repeats: int, min_time: float = 0.0) -> float:
    """The median of at least ``repeats`` back-to-back calls (and ``min_time`` seconds), after a warm-up."""
    fn()  # warm-up
    times = []
    while len(times) < repeats or sum(times) < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) > 50 * repeats:
            break
    return float(np.median(times))


def _mean_time(fn, repeats: int, min_time: float = 0.0, blocks: int = 5) -> float:
    """Wall time per call as a throughput: the median over ``blocks`` blocks of (block time / calls in it).

    When processes outnumber cores (world 4 on 2 cores) or another job loads the box, the OS time-slices
    the cores every few ms. A GEMM shorter than a slice mostly runs whole once scheduled, so the *median*
    call shows the rate while running (~90 GFLOP/s per process at world 4 here: four processes "at" 360 on
    2 cores of ~100 each, impossible); the pauses between calls are what a training step pays too. Each
    block lasts at least ``max(min_time / blocks, 20 ms)`` (several slices), so its mean is the process's
    real share; the median over blocks keeps one load spike from another job out of it.
    """
    fn()  # warm-up
    block_time = max(min_time / blocks, 0.02)
    per_call = []
    for _ in range(blocks):
        count, t0 = 0, time.perf_counter()
        while count < max(1, repeats // blocks) or time.perf_counter() - t0 < block_time:
            fn()
            count += 1
        per_call.append((time.perf_counter() - t0) / count)
    return float(np.median(per_call))


_SINGLES: list = []
# lesson 09's attention kernels, timed at the block lengths its runs take (S/cp and S/2cp, S up to 1024 at
# cp = 2); batch·heads and head_dim fixed at its quick sizes' (B = 2, H = 4, D = 32)
KERNEL_HEADS, KERNEL_HEAD_DIM, KERNEL_LENGTHS = 8, 32, (64, 128, 256, 512)
# and at full size (S = 2048, head_dim 64): another head size, longer blocks, and SDPA over the whole sequence
KERNEL_HEAD_DIMS = (32, 64)
KERNEL_LENGTHS_OF = {
    "ring_full": KERNEL_LENGTHS + (1024,),
    "ring_diagonal": KERNEL_LENGTHS + (1024,),
    "ring_zigzag": KERNEL_LENGTHS,
    "sdpa": KERNEL_LENGTHS[1:] + (1024, 2048),
}


def kernel_key(name: str, head_dim: int) -> str:
    """The table entry of kernel ``name`` measured at ``head_dim`` (``name`` itself at :data:`KERNEL_HEAD_DIM`)."""
    return name if head_dim == KERNEL_HEAD_DIM else f"{name}/d{head_dim}"


def _singles():
    """One process group per rank holding that rank alone (made once): ring attention at cp = 1 on it."""
    import torch.distributed as dist

    if not _SINGLES:
        from .. import env

        _SINGLES.extend(dist.new_group([r], timeout=env.collective_timeout()) for r in range(dist.get_world_size()))
    return _SINGLES


def _kernels(single, min_time: float, sync=lambda: None, repeats: int | None = None) -> dict:
    """Seconds of the eager kernels lesson 09's layers run, ranks side by side, at the lengths lesson 09 takes
    (:data:`KERNEL_LENGTHS_OF`) for 8 heads of 32 and of 64 (entries ``name`` and ``name/d64``).

    - ``ring_full`` / ``ring_diagonal``: simlib's ring attention on a group of one (one block of L×L scores,
      non-causal / causal), forward and forward + backward. The causal (diagonal) block is
      its own entry: masking half the scores to -inf makes ``exp`` take its slow path on this CPU (about 10×
      per element), which no GEMM rate or bandwidth shows.
    - ``ring_zigzag``: the same, causal, on two chunks of L in the zig-zag layout: the step where a zig-zag rank
      attends its own chunks (two diagonal blocks and one full one, slices of one tensor). Measured, not
      summed: here the diagonal blocks' backward costs about twice what it costs alone.
    - ``sdpa``: ``F.scaled_dot_product_attention`` (causal), the kernel Ulysses runs on its heads.
    - ``op``: one eager autograd op on a tiny tensor (a chain of multiplies, forward + backward, per op):
      the dispatch cost that dominates layers made of many small ops (the MoE layer's routing).
    - ``moe``: simlib's expert-parallel MoE layer on a group of one (:data:`MOE_KERNEL`: tokens, hidden, experts,
      top-k; forward + backward): the eager ops a routed layer is made of, at their real sizes (gathers, sorts,
      index copies), which a 4×4 multiply does not show.
    Each is {"forward": [(L, s), ...], "backward": [(L, s), ...]} ("backward": forward + backward), except
    ``op`` (seconds) and ``moe`` (its sizes and seconds).

    Timed the way lesson 09 times its layers (:func:`_after_barrier_time`): ranks side by side, each call right
    after a barrier, the median of ``repeats``. Back to back, a kernel runs with warm caches and both ranks in
    step, 10–40 % faster than the same call made once after the ranks met.
    """
    import torch

    from ..parallel import context

    repeats = kernel_repeats(repeats)
    out = {}
    for name, head_dim in ((n, d) for n in KERNEL_LENGTHS_OF for d in KERNEL_HEAD_DIMS):
        key = kernel_key(name, head_dim)
        out[key] = {"forward": [], "backward": []}
        for length in KERNEL_LENGTHS_OF[name]:
            span = 2 * length if name == "ring_zigzag" else length  # zig-zag: two chunks of ``length``
            q, k, v = (torch.randn(1, KERNEL_HEADS, span, head_dim, requires_grad=True) for _ in range(3))
            if name == "sdpa":

                def fwd():
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:

                def fwd(causal=name != "ring_full", layout="zigzag" if name == "ring_zigzag" else "contiguous"):
                    return context.RingAttention.apply(q, k, v, causal, layout, single, None, None)

            def both():
                fwd().sum().backward()

            with torch.no_grad():
                out[key]["forward"].append((length, _after_barrier_time(fwd, sync, repeats)))
            out[key]["backward"].append((length, _after_barrier_time(both, sync, repeats)))
    out["op"] = small_op_time(min_time)
    out["moe"] = _moe_kernel(single, sync, repeats)
    return out


KERNEL_REPEATS = 7  # timed calls per kernel (after one warm-up), each after a barrier
QUICK_KERNEL_REPEATS = 3  # quick mode (CI: lesson 13's calibration, whose ranking is printed there, not asserted)


def kernel_repeats(repeats: int | None = None) -> int:
    """``repeats`` if given, else :data:`KERNEL_REPEATS` (:data:`QUICK_KERNEL_REPEATS` in quick mode)."""
    from .. import env

    return repeats or (QUICK_KERNEL_REPEATS if env.quick() else KERNEL_REPEATS)


MOE_KERNEL = dict(tokens=64, hidden=32, num_experts=4, top_k=2, capacity_factor=1.25)  # one rank alone (ep = 1)


def _after_barrier_time(fn, sync, repeats: int) -> float:
    """The median over ``repeats`` of one call of ``fn`` made right after ``sync()`` (a barrier of the ranks that
    measure together), after one warm-up call: how lesson 09's ``*_run`` functions time a layer."""
    fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _moe_kernel(single, sync, repeats: int) -> dict:
    """Seconds of one forward + backward of simlib's MoE layer at :data:`MOE_KERNEL`'s sizes on a group of one."""
    import torch

    from ..parallel.experts import ExpertParallelMoE, MoE

    torch.manual_seed(0)
    sizes = MOE_KERNEL
    layer = ExpertParallelMoE.from_dense(
        MoE(sizes["hidden"], sizes["num_experts"], sizes["top_k"], sizes["capacity_factor"]), group=single
    )
    x = torch.randn(sizes["tokens"], sizes["hidden"])

    def both():
        y, aux, _ = layer(x)
        (y.square().mean() + 0.01 * aux).backward()

    return dict(sizes, seconds=_after_barrier_time(both, sync, repeats))


A2A_SIZES = [4 << 10, 64 << 10, 1 << 20]  # bytes of one rank's all-to-all input


def _all_to_all_times(group, repeats: int):
    """[(bytes a rank's input holds, seconds)] of one even all-to-all through simlib's
    :func:`simlib.parallel.all_to_all.all_to_all` (Gloo's ``all_to_all_single``, an alltoallv, not the ring of
    the all-reduce the link is fitted to), each call right after a barrier, as lesson 09 times it."""
    import torch
    import torch.distributed as dist

    from ..parallel.all_to_all import all_to_all

    n = dist.get_world_size(group)
    out = []
    for size in A2A_SIZES:
        x = torch.zeros(n, size // 4 // n)
        out.append(
            (
                x.numel() * 4,
                _after_barrier_time(
                    lambda: all_to_all(x, [1] * n, [1] * n, group=group), lambda: dist.barrier(group=group), repeats
                ),
            )
        )
    return out


IN_SITU_SIZES = [16 << 10, 256 << 10, 1 << 20, 4 << 20]  # bytes a rank sends in one call (a K/V pair: both tensors)
IN_SITU_GEMM, IN_SITU_GEMMS = (128, 1024, 1024), 2  # the compute each call is made beside or after (~5 ms)


def in_situ_comm(group, repeats: int | None = None, kinds=("a2a", "hop", "hop_overlapped", "all_reduce")) -> dict:
    """Seconds a call adds to the compute it meets, ranks side by side: {kind: [(bytes, seconds), ...]}.

    - ``a2a``: an all-to-all through :func:`simlib.parallel.all_to_all.all_to_all` after the compute (Ulysses
      and the MoE layer: every rank waits for its peers);
    - ``hop``: a ring pass of a pair of tensors (:func:`simlib.parallel.context.ring_pass`) started and waited
      for after the compute (ring attention's dK/dV);
    - ``hop_overlapped``: the same pass started *before* the compute and waited for after it (ring attention's
      K/V). On a box whose cores the ranks share, the transfer's copies take the compute's core: overlapping
      it costs more than sending it after (measured here: about 3.6 ms against 1.4 ms for a pair of 256 KB).
    - ``all_reduce``: an all-reduce of the bytes after the compute (the course's tensor parallelism: one after
      each block's row-parallel GEMM).
    Each: the median over ``repeats`` (:func:`kernel_repeats`) of (compute with the call − compute alone), each timed
    after a barrier.
    ``kinds``: which to measure. On a sub-group whose peers outside it run the same at the same time (groups side
    by side, :func:`simlib.sim.calibrate.measure_here`), the calls wait for peers that share the cores with
    other groups' ranks.
    """
    import torch
    import torch.distributed as dist

    from ..parallel.all_to_all import all_to_all
    from ..parallel.context import ring_pass, wait_ring

    repeats = kernel_repeats(repeats)
    n = dist.get_world_size(group)
    m, k, n_ = IN_SITU_GEMM
    a, b = torch.randn(m, k), torch.randn(k, n_)

    def burst():
        for _ in range(IN_SITU_GEMMS):
            a @ b

    def timed(before, after):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        started = before()
        burst()
        after(started)
        return time.perf_counter() - t0

    none = lambda *_: None  # noqa: E731
    out = {}
    for size in IN_SITU_SIZES:
        x = torch.zeros(n, size // 4 // n)
        pair = (torch.zeros(size // 8), torch.zeros(size // 8))

        def pass_and_wait(*_):
            wait_ring(ring_pass(pair, group, None, "hop")[1], None, 0.0)

        flat = torch.zeros(size // 4)
        calls = {
            "a2a": (none, lambda _: all_to_all(x, [1] * n, [1] * n, group=group)),
            "hop": (none, pass_and_wait),
            "hop_overlapped": (
                lambda: ring_pass(pair, group, None, "hop")[1],
                lambda requests: wait_ring(requests, None, 0.0),
            ),
            "all_reduce": (none, lambda _: dist.all_reduce(flat, group=group)),
        }
        for kind in kinds:
            before, after = calls[kind]
            timed(before, after), timed(none, none)  # warm-up
            extra = []
            for _ in range(repeats):
                with_call = timed(before, after)
                extra.append(with_call - timed(none, none))
            out.setdefault(kind, []).append((size, max(float(np.median(extra)), 1e-6)))
    return out


SYNC_OPS, SYNC_CYCLES = 16, 40  # small ops between two small collectives, and cycles per timed block


def _small_sync(group, blocks: int = 5) -> float:
    """Seconds one small blocking collective adds after a stretch of small ops, ranks side by side.

    Cycles of :data:`SYNC_OPS` tiny multiplies then an all-to-all of 4 KB (as the MoE layer's routing and its
    dispatch: work, then a collective every rank must reach), minus the same ops without the collective.
    On a box whose cores the processes share, the collective waits for the peer to be scheduled again: far
    more than the back-to-back α. Fixed cycle counts on every rank (a collective must be called as often on
    each); the median over ``blocks`` blocks.
    """
    import torch
    import torch.distributed as dist

    x, send = torch.randn(4, 4), torch.zeros(1024)
    recv = torch.empty_like(send)

    def burst():
        y = x
        for _ in range(SYNC_OPS):
            y = y * 1.0

    def block(with_collective):
        t0 = time.perf_counter()
        for _ in range(SYNC_CYCLES):
            burst()
            if with_collective:
                dist.all_to_all_single(recv, send, group=group)
        return (time.perf_counter() - t0) / SYNC_CYCLES

    block(True)  # warm-up
    extra = []
    for _ in range(blocks):
        dist.barrier(group=group)
        with_c = block(True)
        extra.append(with_c - block(False))
    return max(float(np.median(extra)), 0.0)


def combine_kernels(results) -> dict:
    """Every rank's :func:`_kernels` -> the slowest rank's seconds of each (a layer waits for its slowest rank)."""
    res = [r["kernels"] for r in results if r is not None and r.get("kernels")]
    if not res:
        return None
    out = {name: max(r[name] for r in res) for name in ("op", "block_op", "sync") if name in res[0]}
    if "a2a" in res[0]:  # a collective: the slowest rank's time, fitted as α + bytes / B
        pts = [(size, max(r["a2a"][i][1] for r in res)) for i, (size, _) in enumerate(res[0]["a2a"])]
        out["a2a"] = fit_p2p([p[0] for p in pts], [p[1] for p in pts])
    if "in_situ" in res[0]:  # a call every rank waits on: the slowest rank's added time, fitted as α + bytes / B
        out["in_situ"] = _fit_in_situ([r["in_situ"] for r in res])
    if "in_situ_groups" in res[0]:  # the same, in groups of g ranks side by side: {g: {kind: (α, B)}}
        out["in_situ_groups"] = {
            g: _fit_in_situ([r["in_situ_groups"][g] for r in res]) for g in res[0]["in_situ_groups"]
        }
    if "moe" in res[0]:  # the same sizes on every rank: the slowest rank's seconds
        out["moe"] = dict(res[0]["moe"], seconds=max(r["moe"]["seconds"] for r in res))
    for name in res[0]:
        if name not in ("op", "block_op", "sync", "a2a", "moe", "in_situ", "in_situ_groups"):
            out[name] = {
                way: [(length, max(r[name][way][i][1] for r in res)) for i, (length, _) in enumerate(pts)]
                for way, pts in res[0][name].items()
            }
    return out


def _fit_in_situ(tables) -> dict:
    """Ranks' :func:`in_situ_comm` tables -> {kind: (α, B)} fitted to the slowest rank's added time per size."""
    out = {}
    for kind, points in tables[0].items():
        pts = [(size, max(t[kind][i][1] for t in tables)) for i, (size, _) in enumerate(points)]
        out[kind] = fit_p2p([p[0] for p in pts], [p[1] for p in pts])
    return out


def small_op_time(min_time: float) -> float:
    """Seconds of one eager autograd op on a tiny tensor, forward or backward: the host's dispatch cost per op
    (a chain of 32 multiplies and a sum forward, as many nodes backward and one AccumulateGrad: 68 ops, counted
    with TorchDispatchMode)."""
    import torch

    x = torch.randn(4, 4, requires_grad=True)

    def chain():
        y = x
        for _ in range(32):
            y = y * 1.0
        y.sum().backward()

    return _median_time(chain, 5, min_time=min_time) / 68


BLOCK_OP_SIZE = dict(hidden=32, num_heads=4, tokens=8)  # a GPT block whose GEMMs take well under a µs here


def block_op_time(min_time: float) -> float:
    """Seconds per eager op of simlib's GPT block itself, forward + backward, at a size where its arithmetic is
    negligible (:data:`BLOCK_OP_SIZE`): what a micro-batch's hundreds of ops cost the host where ranks run side by
    side. Timed as a throughput (:func:`_mean_time`, as calibrate times GEMMs), not as the median call: a block
    (~0.5 ms) mostly runs whole once scheduled, so its median call hides the pauses a rank sharing the cores pays
    between calls. Here, per op: 5.8 µs alone; 4 ranks on 2 cores 12–16 µs by the mean, 5.4–11 by the median;
    8 ranks 27–30 by the mean, 5–6.5 by the median (the median is what ``kernels["op"]`` reports)."""
    import torch

    from ..models import TransformerBlock
    from .host_ops import GPT_OPS_PER_LAYER

    size = BLOCK_OP_SIZE
    block = TransformerBlock(size["hidden"], size["num_heads"])
    x = torch.randn(1, size["tokens"], size["hidden"], requires_grad=True)

    def step():
        block(x).sum().backward()

    return _mean_time(step, 5, min_time=max(min_time, 0.1)) / sum(GPT_OPS_PER_LAYER)
