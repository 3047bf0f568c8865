"""Context parallelism: ring attention (plain and zig-zag) and Ulysses equal one process's attention.

Forward and backward against ``F.scaled_dot_product_attention`` over the whole sequence, on 2, 3 and 4 Gloo
ranks; per-rank work, bytes sent and errors for splits that do not work.
"""

import pytest
import torch

B, H, S, D = 2, 6, 24, 8  # 24 splits into 2·cp chunks for cp = 2, 3, 4; 6 heads divide by 2 and 3, not 4


def _problem(seed=0, seq=S, heads=H):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, heads, seq, D, generator=g, dtype=torch.float64) for _ in range(3))
    weights = torch.randn(B, heads, seq, D, generator=g, dtype=torch.float64)
    return q, k, v, weights


def _reference(causal, seq=S, heads=H):
    q, k, v, weights = _problem(seq=seq, heads=heads)
    for t in (q, k, v):
        t.requires_grad_()
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    (out * weights).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


def _cp_harness(kind, layout, causal, seq=S, heads=H):
    import torch.distributed as dist

    from simlib.parallel import context
    from simlib.parallel.comm_log import CommLog

    rank, n = dist.get_rank(), dist.get_world_size()
    q, k, v, weights = (context.shard_sequence(t, rank, n, layout) for t in _problem(seq=seq, heads=heads))
    for t in (q, k, v):
        t.requires_grad_()
    log, stats = CommLog(), {}
    if kind == "ring":
        out = context.ring_attention(q, k, v, causal, layout, log=log, stats=stats)
    else:
        out = context.ulysses_attention(q, k, v, causal, log=log)
    forward_bytes = log.bytes
    (out * weights).sum().backward()
    return dict(
        out=out.detach(),
        dq=q.grad,
        dk=k.grad,
        dv=v.grad,
        work=stats.get("work"),
        forward_bytes=forward_bytes,
        backward_bytes=log.bytes - forward_bytes,
    )


def _check(outs, kind, layout, causal, seq=S, heads=H):
    from simlib.parallel import context

    n = len(outs)
    ref = _reference(causal, seq, heads)
    for got, want in zip(("out", "dq", "dk", "dv"), ref):
        full = context.unshard_sequence([o[got] for o in outs], layout)
        torch.testing.assert_close(full, want, rtol=1e-9, atol=1e-10, msg=f"{got} differs")
    vol = context.comm_volume(B, heads, seq, D, n, kind, bytes_per_element=8)
    assert {o["forward_bytes"] for o in outs} == {vol["forward"]}
    assert {o["backward_bytes"] for o in outs} == {vol["backward"]}
    if kind == "ring":
        assert [o["work"] for o in outs] == context.causal_work(seq, n, layout, causal)


@pytest.mark.parametrize(
    "kind,layout,causal",
    [
        ("ring", "contiguous", True),
        ("ring", "zigzag", True),
        ("ring", "contiguous", False),
        ("ulysses", "contiguous", True),
    ],
)
def test_two_ranks(cluster2, kind, layout, causal):
    _check(cluster2.call(_cp_harness, (kind, layout, causal), timeout=90), kind, layout, causal)


@pytest.mark.parametrize("kind,layout", [("ring", "contiguous"), ("ring", "zigzag"), ("ulysses", "contiguous")])
def test_three_ranks(cluster3, kind, layout):
    _check(cluster3.call(_cp_harness, (kind, layout, True), timeout=120), kind, layout, True)


@pytest.mark.parametrize("kind,layout", [("ring", "zigzag")])
def test_four_ranks(cluster4, kind, layout):
    _check(cluster4.call(_cp_harness, (kind, layout, True), timeout=120), kind, layout, True)


def test_four_ranks_ulysses_with_eight_heads(cluster4):
    _check(
        cluster4.call(_cp_harness, ("ulysses", "contiguous", True, S, 8), timeout=120),
        "ulysses",
        "contiguous",
        True,
        S,
        8,
    )


def _ulysses_bad_heads():
    from simlib.parallel import context

    q = torch.randn(1, 6, 6, 4)
    try:
        context.ulysses_attention(q, q, q)
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_ulysses_refuses_heads_that_do_not_divide(cluster4):
    for message in cluster4.call(_ulysses_bad_heads, timeout=60):
        assert "heads (6) must be divisible by the context-parallel degree (4)" in message and "ring" in message


def test_split_errors_and_one_process():
    from simlib.parallel import context

    with pytest.raises(ValueError, match=r"sequence length 25 does not split into 4 equal chunks .* 24 or 28"):
        context.shard_sequence(torch.zeros(1, 1, 25, 2), 0, 2, "zigzag")
    with pytest.raises(ValueError, match="layout"):
        context.chunks_of(0, 2, 8, "striped")
    # one process: the same code is plain attention
    q, k, v, _ = _problem()
    out = context.ring_attention(q, k, v, causal=True)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_zigzag_balances_causal_work():
    from simlib.parallel import context

    for cp in (2, 3, 4, 8):
        plain, zigzag = context.causal_work(960, cp, "contiguous"), context.causal_work(960, cp, "zigzag")
        assert context.imbalance(zigzag) == 1.0
        assert context.imbalance(plain) == pytest.approx(2 * cp / (cp + 1))
        assert plain[0] < plain[-1]


def test_unshard_inverts_shard():
    from simlib.parallel import context

    x = torch.arange(2 * 24.0).view(1, 2, 24, 1)
    for layout in context.LAYOUTS:
        for cp in (1, 2, 3, 4):
            pieces = [context.shard_sequence(x, r, cp, layout) for r in range(cp)]
            assert torch.equal(context.unshard_sequence(pieces, layout), x)


def test_tensor_peak_bytes_counts_live_tensors_exactly():
    """Lesson 09's memory measure (torch's MemTracker): the most bytes alive at once, inputs left out."""
    import torch

    from simlib.lessons.memory import tensor_peak_bytes

    x = torch.ones(1 << 18)  # 1 MiB the function reads: not counted

    def fn():
        a = torch.ones(1 << 18) + x  # 1 MiB
        b = torch.ones(1 << 19)  # 2 MiB: 3 MiB alive here
        del a
        c = torch.ones(1 << 18)  # a's MiB is back: still 3 MiB
        return b.sum() + c.sum()  # and three 4-byte scalars

    assert tensor_peak_bytes(fn, x) == (3 << 20) + 12
    assert tensor_peak_bytes(lambda: None) == 0
