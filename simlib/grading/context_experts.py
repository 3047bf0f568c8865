"""Check for lesson 09's ring-attention forward (online softmax, causal blocks); the MoE dispatch/combine is in
:mod:`simlib.grading.moe`.

It runs on 2, 3 and 4 ranks against one process on the whole sequence; when an answer is wrong the grader
recomputes the classic mistakes itself (a mask on every block, blocks merged without rescaling) and names the one
the answer matches.
"""

from __future__ import annotations

from .core import Result, _close, exercise, max_error

# ---- ring attention: forward with the online softmax ----


def ra_problem():
    """A Hypothesis strategy of the ring-attention problem: 1 or 2 sequences, 1 to 3 heads, 2 to 5 positions per
    rank, head dims that are not powers of two (a scale of 1/sqrt(8) written as a number shows), a secret seed."""
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        dict(
            batch=st.integers(1, 2),
            heads=st.integers(1, 3),
            local=st.integers(2, 5),
            head_dim=st.sampled_from((3, 5, 6, 7, 10, 12)),
            seed=st.integers(0, 2**62),
        )
    )


_LARGE = 120.0  # the largest score of the float32 case: exp() of it overflows float32 (past 88.7) without the max


def _ra_problem(ra: dict, world_size: int, large=False):
    """q, k, v of the whole sequence, float64; ``large``: float32 values with q scaled so that the largest visible
    score is ``_LARGE``, far past exp's float32 range (where subtracting the running max keeps the online softmax
    finite)."""
    import torch

    g = torch.Generator().manual_seed(ra["seed"] + world_size)
    shape = (ra["batch"], ra["heads"], ra["local"] * world_size, ra["head_dim"])
    q, k, v = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))
    if large:  # the largest score a query sees under the causal mask (the case runs causal) becomes _LARGE
        s = q.shape[-2]
        visible = torch.ones(s, s, dtype=torch.bool).tril()
        top = float((q @ k.transpose(-1, -2)).masked_fill(~visible, float("-inf")).max()) / ra["head_dim"] ** 0.5
        top = top if top > 0 else float((q @ k.transpose(-1, -2)).abs().max()) / ra["head_dim"] ** 0.5
        q, k, v = ((q * (_LARGE / top)).float(), k.float(), v.float())
    return [q, k, v]


def _ra_harness(answer, ra, causal, large=False):
    import torch.distributed as dist

    from ..parallel.context import shard_sequence
    from .contracts import recorder

    rank, n = dist.get_rank(), dist.get_world_size()
    q, k, v = (shard_sequence(t, rank, n) for t in _ra_problem(ra, n, large))
    with recorder() as rec:  # the grader's: every message and collective, whatever name the answer used
        out = answer(q.clone(), k.clone(), v.clone(), causal)
    return dict(out=out.detach().clone() if hasattr(out, "detach") else out, calls=rec.calls, block=k.numel())


def _ra_resident_harness(answer, ra, causal):
    """Which other ranks' K/V blocks this rank holds at once, at its heaviest moment: weighed at every receive, at
    every op that reads more than two blocks, and as the answer returns (:func:`contracts.resident_blocks`)."""
    import sys

    import torch.distributed as dist

    from ..parallel.context import shard_sequence
    from .contracts import _elements, _tensors, data_census, recorder, resident_blocks

    rank, n = dist.get_rank(), dist.get_world_size()
    whole = _ra_problem(ra, n)
    q, k, v = (shard_sequence(t, rank, n).clone() for t in whole)
    blocks = {j: [shard_sequence(whole[1], j, n), shard_sequence(whole[2], j, n)] for j in range(n) if j != rank}
    before, heaviest, busy = data_census(), dict(count=0, ranks=[], at=""), []

    def weigh(at, frames=(), using=()):
        if busy:  # the weighing's own tensor ops come back through the recorder
            return
        busy.append(1)
        try:
            held = resident_blocks(blocks, before, frames, using)
            if len(held) > heaviest["count"]:
                heaviest.update(count=len(held), ranks=held, at=at)
        finally:
            busy.clear()

    def watch(name, args):
        if name == "c10d.recv_" or _elements(args) > 2 * k.numel():
            weigh(name.split(".")[-1].rstrip("_"), using=_tensors(args))

    here, previous = sys._getframe(), sys.getprofile()

    def on_return(frame, event, arg):
        if (
            event == "return"
            and frame.f_back is here
            and not frame.f_globals.get("__name__", "").startswith(("simlib.grading", "torch"))
        ):  # the answer's own return, not the recorder's __enter__
            weigh("return", [frame])

    sys.setprofile(on_return)
    try:
        with recorder(watch=watch, poison=True):
            answer(q, k, v, causal)
    finally:
        sys.setprofile(previous)
    return heaviest


def _attention(q, k, v, visible):
    """Softmax attention with an explicit (S, S) mask of visible keys."""
    import torch

    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), -1) @ v


def _ra_variants(ra, world_size, causal):
    """The right output, and what the classic mistakes give (whole sequence, one process)."""
    import torch

    q, k, v = _ra_problem(ra, world_size)
    s, local = q.shape[-2], ra["local"]
    pos = torch.arange(s)
    block = pos // local
    right = pos[:, None] >= pos[None, :] if causal else torch.ones(s, s, dtype=torch.bool)
    out = dict(right=_attention(q, k, v, right))
    if causal:
        # the triangle applied to every block, not only the diagonal one
        every = (block[:, None] >= block[None, :]) & ((pos % local)[:, None] >= (pos % local)[None, :])
        out["mask_on_every_block"] = _attention(q, k, v, every)
        # no mask on the diagonal block: later positions of one's own block leak in
        out["diagonal_unmasked"] = _attention(q, k, v, block[:, None] >= block[None, :])
    # blocks merged without the log-sum-exp rescaling: the plain mean (or sum) of per-block softmax outputs
    blocks = []
    for b in range(world_size):
        keys = (block == b)[None, :] & right
        part = _attention(q, k, v, keys)
        blocks.append(torch.where(keys.any(-1)[..., None], part, torch.zeros_like(part)))
    out["blocks_summed"] = sum(blocks)
    counts = torch.stack([((block == b)[None, :] & right).any(-1) for b in range(world_size)]).sum(0)
    out["blocks_averaged"] = sum(blocks) / counts[..., None]
    return out


def _which(got, variants):
    for name, want in variants.items():
        if name != "right" and _close(got, want, rtol=1e-6, atol=1e-8):
            return name
    return None


_RA_HINTS = {
    "blocks_summed": "the blocks' outputs were added without renormalising the softmax: each block's output is "
    "normalised over its own keys only. Keep a running log-sum-exp per query and merge with it: "
    "new = logaddexp(lse, block_lse); out = out·exp(lse − new) + block_out·exp(block_lse − new)",
    "blocks_averaged": "the blocks' outputs were averaged, which is not the softmax over all keys: the blocks weigh "
    "by their share of the exponentials, not equally. Merge with the running log-sum-exp: "
    "out = out·exp(lse − new) + block_out·exp(block_lse − new), new = logaddexp(lse, block_lse)",
    "mask_on_every_block": "the causal mask was applied to every block: blocks from earlier ranks hold only earlier "
    "positions, so every query sees all of their keys (no mask); only the diagonal block "
    "(your own K/V) needs the triangle, and blocks from later ranks are skipped",
    "diagonal_unmasked": "your own block (the diagonal one) needs the causal triangle: without it each query sees "
    "the later positions of its own block",
}


def _run_ring(answer, grader, ra, world_size, causal):
    from ..parallel.context import unshard_sequence
    from .contracts import contract

    # without the mask, on 3 ranks (where a neighbour is not every rank), what crossed is also read from the kernel
    metered = world_size == 3 and not causal
    what = f"your ring attention on {world_size} ranks"
    outs, on_wire = grader.run(world_size, _ra_harness, answer, ra, causal, what=what, wire=metered), ""
    if grader.wire_last is not None:  # K and V, n - 1 hops of float64 blocks, to the next rank only
        from .wire import flow_breach

        need = {(r, (r + 1) % world_size): 2 * (world_size - 1) * o["block"] * 8 for r, o in enumerate(outs)}
        on_wire = flow_breach(grader.wire_last, need, "K/V blocks (counted by the operating system)")
    # the contract: K/V blocks travel to the next rank only, n - 1 hops of K and V, no collective
    breach = (
        next(
            (
                b
                for r, o in enumerate(outs)
                for b in [
                    contract(
                        o["calls"],
                        r,
                        world_size,
                        only={"send", "recv"},
                        neighbours=True,
                        max_sent=2 * (world_size - 1) * o["block"],
                    )
                ]
                if b
            ),
            "",
        )
        or on_wire
    )
    try:
        import torch

        return unshard_sequence([torch.as_tensor(o["out"]) for o in outs]), breach
    except Exception:  # noqa: BLE001 - wrong shapes: reported as a difference
        return None, breach


def _ra_smallest(answer, grader, ra: dict, world_size: int, causal: bool) -> str:
    """The smallest failing problem Hypothesis finds on ``world_size`` ranks (6 runs at most, only after a
    failure); nothing for the tests of planted answers (first_failure)."""
    from .core import _Stop
    from .instances import smallest

    if grader.first_failure:
        return ""

    def fails(p) -> bool:
        try:
            got, _ = _run_ring(answer, grader, p, world_size, causal)
        except _Stop:
            return True
        return got is None or not _close(got, _ra_variants(p, world_size, causal)["right"], rtol=1e-6, atol=1e-8)

    p = smallest(ra_problem(), fails, budget=6, first=ra)
    return (
        f"; smallest failing case found: {world_size} ranks, batch {p['batch']}, {p['heads']} head(s), "
        f"{p['local']} positions per rank, head dim {p['head_dim']}"
    )


@exercise("ring_attention")
def _check_ring_attention(answer, grader):
    from .instances import draw

    ra = draw(ra_problem(), 1)[0]  # drawn now, in this process, from the OS's randomness
    size = f"{ra['local']} positions per rank, head dim {ra['head_dim']}"
    for world_size in (2, 3, 4):  # 3: not a power of two, so the ring's hops must be counted, not assumed
        for causal in (False, True):  # without the mask first: the merge alone, then the mask
            variants = _ra_variants(ra, world_size, causal)
            got, breach = _run_ring(answer, grader, ra, world_size, causal)
            ok = got is not None and _close(got, variants["right"], rtol=1e-6, atol=1e-8)
            if ok and breach:  # the right numbers by another algorithm
                yield Result(
                    f"{world_size} ranks ({size}), {'causal' if causal else 'no mask'}: K/V passed around the ring "
                    "(send/recv to neighbours only)",
                    False,
                    "ring attention never gathers K/V: each rank sends its current K/V block to rank + 1 "
                    "and receives the next from rank − 1 (isend/irecv or batch_isend_irecv), n − 1 times, "
                    "merging each block as it arrives; no all_gather, broadcast or all-to-all",
                    breach,
                )
                return
            hint = ""
            if not ok:
                mistake = _which(got, variants) if got is not None else None
                if mistake:
                    hint = _RA_HINTS[mistake]
                elif got is None or got.shape != variants["right"].shape:
                    hint = "return this rank's output, shaped like its q: (batch, heads, local positions, head_dim)"
                elif causal:
                    hint = (
                        "check which rank's K/V block you hold at each step: sending to rank + 1 and receiving "
                        "from rank − 1, at step s you hold the block of rank (rank − step) mod n; blocks of "
                        "earlier ranks are fully visible, the own block needs the triangle, later ones none"
                    )
                else:
                    hint = (
                        "without a mask every query sees every key once: pass each K/V block on n − 1 times "
                        "(to rank + 1, from rank − 1) and merge every block with the log-sum-exp rescaling"
                    )
            if not ok:  # the smallest problem Hypothesis finds that still fails, in the hint
                hint += _ra_smallest(answer, grader, ra, world_size, causal)
            what = "causal" if causal else "no mask"
            yield Result(
                f"{world_size} ranks ({size}), {what}: output equal to attention over the whole sequence",
                ok,
                hint,
                "" if ok or got is None else f"max error {max_error(got, variants['right']):.2g}",
            )
            if not ok:
                return
    # the memory contract: never the whole K/V resident (4 ranks: the whole is 3 other blocks, a ring holds 1 or 2)
    world_size = 4
    outs = grader.run(world_size, _ra_resident_harness, answer, ra, False, what="your ring attention, weighed")
    worst = max(range(world_size), key=lambda r: outs[r]["count"])
    held = outs[worst]
    yield Result(
        f"{world_size} ranks: at most two other ranks' K/V blocks held at once (never the whole K/V)",
        held["count"] <= 2,
        "ring attention exists so that no rank ever holds the whole K/V: keep only the block you are "
        "merging and the one arriving, fold each block into the running output and log-sum-exp as it "
        "arrives, then let it go (no list or dict of blocks, no torch.cat of them, no NumPy copies)",
        f"rank {worst} held the K/V blocks of ranks {held['ranks']} at once (at a {held['at']})",
    )
    # numerical stability, the lesson's point: float32 scores past exp's range (every earlier case was float64)
    import torch

    from ..parallel.context import unshard_sequence

    world_size = 3
    q, k, v = _ra_problem(ra, world_size, large=True)
    pos = torch.arange(q.shape[-2])
    want = _attention(q.double(), k.double(), v.double(), pos[:, None] >= pos[None, :])
    outs = grader.run(
        world_size, _ra_harness, answer, ra, True, True, what="your ring attention on float32, large scores"
    )
    try:
        got = unshard_sequence([torch.as_tensor(o["out"]).double() for o in outs])
        ok = bool(torch.isfinite(got).all()) and _close(got, want, rtol=1e-4, atol=1e-4)
    except Exception:  # noqa: BLE001 - wrong shapes or no tensor: a difference
        got, ok = None, False
    yield Result(
        f"{world_size} ranks, float32 with scores up to ~{_LARGE:.0f}: "
        "finite and equal to attention over the whole sequence",
        ok,
        ""
        if ok
        else "exp() of a score above 88.7 overflows float32 to inf (and inf/inf is nan): keep the "
        "running maximum of each query's scores, subtract it before exp(), and rescale the partial sums when "
        "a block raises it (the online softmax's m; with log-sum-exp merging, logsumexp does it for you)",
        ""
        if ok or got is None
        else ("not finite" if not torch.isfinite(got).all() else f"max error {max_error(got, want):.2g}"),
    )
