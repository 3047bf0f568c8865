"""Ring all-reduce from send/recv equals dist.all_reduce; the alpha-beta fit recovers known parameters."""

import numpy as np
import pytest
import torch

from simlib import collectives as C


def _ring_vs_torch(numel, op="sum", seed=0):
    import torch.distributed as dist

    rank = dist.get_rank()
    g = torch.Generator().manual_seed(seed + rank)
    x = torch.randn(numel, generator=g)
    mine, theirs = x.clone(), x.clone()
    C.ring_all_reduce(mine, op=op)
    dist.all_reduce(theirs)
    if op == "avg":
        theirs /= dist.get_world_size()
    return mine, theirs


def _ring_2d_noncontiguous():
    import torch.distributed as dist

    x = (torch.arange(12.0).view(3, 4) + dist.get_rank()).t()  # a transposed view: not contiguous
    expected = x.clone()
    dist.all_reduce(expected)
    C.ring_all_reduce(x)
    return x, expected


def _demo_all():
    return [C.collective_demo(op) for op in C.COLLECTIVES]


def _sweep():
    return C.bandwidth_sweep([1024, 65536], repeats=2, warmup=1)


@pytest.mark.parametrize("numel", [1, 3, 8, 10, 1001])
def test_ring_all_reduce_equals_all_reduce(cluster2, cluster4, numel):
    for cluster in (cluster2, cluster4):
        for mine, theirs in cluster.call(_ring_vs_torch, (numel,), timeout=30):
            torch.testing.assert_close(mine, theirs)  # equal up to the order of the additions


def test_ring_avg_and_noncontiguous(cluster4):
    for mine, theirs in cluster4.call(_ring_vs_torch, (37, "avg"), timeout=30):
        torch.testing.assert_close(mine, theirs)
    for mine, expected in cluster4.call(_ring_2d_noncontiguous, timeout=30):
        torch.testing.assert_close(mine, expected)


def test_chunk_bounds_cover_every_element():
    for numel in range(0, 12):
        for world_size in (1, 2, 3, 4):
            bounds = C.chunk_bounds(numel, world_size)
            assert len(bounds) == world_size
            assert bounds[0][0] == 0 and bounds[-1][1] == numel
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            sizes = [e - s for s, e in bounds]
            assert max(sizes) - min(sizes) <= 1


def test_collective_demo_shows_what_ranks_hold(cluster2):
    per_rank = cluster2.call(_demo_all, timeout=30)
    by_op = {op: [per_rank[r][i] for r in range(2)] for i, op in enumerate(C.COLLECTIVES)}
    assert [d["after"] for d in by_op["broadcast"]] == [[0.0, 1.0], [0.0, 1.0]]
    assert by_op["reduce"][0]["after"] == [10.0, 12.0] and by_op["reduce"][1]["after"] is None
    assert [d["after"] for d in by_op["all_reduce"]] == [[10.0, 12.0]] * 2
    assert [d["after"] for d in by_op["all_gather"]] == [[0.0, 1.0, 10.0, 11.0]] * 2
    assert [d["after"] for d in by_op["reduce_scatter"]] == [[10.0], [12.0]]


def test_bandwidth_sweep_rows(cluster2):
    rows = cluster2.call(_sweep, timeout=60)[0]
    assert {r["op"] for r in rows} == {"all_reduce", "ring_all_reduce"}
    for r in rows:
        assert r["time"] > 0 and r["time_q1"] <= r["time"] <= r["time_q3"]
        assert r["busbw"] == pytest.approx(r["algbw"] * C.bus_factor(r["op"], 2))


def test_fit_alpha_beta_recovers_the_model():
    sizes = np.logspace(10, 26, 9, base=2)
    alpha, beta = 50e-6, 1 / 1e9
    rng = np.random.default_rng(0)
    times = C.alpha_beta_time(sizes, 4, alpha, beta) * rng.uniform(0.97, 1.03, sizes.size)
    fit = C.fit_alpha_beta(sizes, times, 4)
    assert fit["alpha"] == pytest.approx(alpha, rel=0.1)
    assert fit["beta"] == pytest.approx(beta, rel=0.1)
    assert fit["median_rel_error"] < 0.05


def test_bus_factor():
    assert C.bus_factor("all_reduce", 4) == 1.5
    assert C.bus_factor("all_gather", 4) == 0.75
    assert C.bus_factor("broadcast", 4) == 1.0


def _ring_avg_on_ints():
    import torch.distributed as dist

    t = torch.arange(5) + 10 * dist.get_rank()
    before = t.clone()
    try:
        C.ring_all_reduce(t, op="avg")
    except ValueError as exc:
        return str(exc), torch.equal(t, before)
    return None, torch.equal(t, before)


def test_ring_avg_on_integers_refuses_before_touching_data(cluster2):
    for message, untouched in cluster2.run(_ring_avg_on_ints):
        assert message and "floating-point" in message and "int64" in message
        assert untouched  # validated first: the input is not left holding the sum
