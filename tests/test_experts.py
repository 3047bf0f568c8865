"""Expert parallelism: the MoE layer on 2, 3 and 4 ranks equals the one-process layer, drops included.

Outputs, the auxiliary loss, dL/dx, the router's and every expert's gradients, the tokens each expert took,
and the bytes the all-to-alls sent (against the counts).
"""

import pytest
import torch

TOKENS, HIDDEN, EXPERTS = 24, 8, 12  # 24 tokens and 12 experts split over 2, 3 and 4 ranks
ALPHA = 0.1  # weight of the auxiliary loss


def _problem(top_k, capacity_factor, seed=0):
    from simlib.parallel.experts import MoE

    torch.manual_seed(seed)
    moe = MoE(HIDDEN, EXPERTS, top_k, capacity_factor, ffn=16).double()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(TOKENS, HIDDEN, generator=g, dtype=torch.float64)
    weights = torch.randn(TOKENS, HIDDEN, generator=g, dtype=torch.float64)
    return moe, x, weights


def _reference(top_k, capacity_factor):
    moe, x, weights = _problem(top_k, capacity_factor)
    x.requires_grad_()
    y, aux, stats = moe(x)
    ((y * weights).sum() + ALPHA * aux).backward()
    return dict(
        y=y.detach(),
        aux=float(aux.detach()),
        x_grad=x.grad,
        stats=stats,
        grads={n: p.grad for n, p in moe.named_parameters() if p.grad is not None},
    )


def _ep_harness(top_k, capacity_factor, engine="native"):
    import torch.distributed as dist

    from simlib.models import shard
    from simlib.parallel.comm_log import CommLog
    from simlib.parallel.experts import ExpertParallelMoE

    rank, n = dist.get_rank(), dist.get_world_size()
    moe, x, weights = _problem(top_k, capacity_factor)
    log = CommLog()
    layer = ExpertParallelMoE.from_dense(moe, log=log, engine=engine)
    x = shard(x, rank, n).clone().requires_grad_()
    y, aux, stats = layer(x)
    ((y * shard(weights, rank, n)).sum() + ALPHA * aux).backward()
    dist.all_reduce(layer.router.weight.grad)  # the router is replicated: data-parallel sum
    total_aux = aux.detach().clone()
    dist.all_reduce(total_aux)
    local = EXPERTS // n
    return dict(
        y=y.detach(),
        x_grad=x.grad,
        aux=float(total_aux),
        stats=stats,
        router=layer.router.weight.grad,
        experts={
            f"experts.{rank * local + i}.{name}": p.grad
            for i, e in enumerate(layer.experts)
            for name, p in e.named_parameters()
            if p.grad is not None
        },
        bytes={
            name: log.bytes_by_name().get(name, 0)
            for name in ("dispatch", "combine", "dispatch (backward)", "combine (backward)")
        },
    )


def _check(outs, top_k, capacity_factor):
    from simlib.parallel.experts import a2a_bytes_from_counts

    ref = _reference(top_k, capacity_factor)
    torch.testing.assert_close(torch.cat([o["y"] for o in outs]), ref["y"])
    torch.testing.assert_close(torch.cat([o["x_grad"] for o in outs]), ref["x_grad"])
    for o in outs:
        assert o["aux"] == pytest.approx(ref["aux"], rel=1e-12)
        torch.testing.assert_close(o["router"], ref["grads"]["router.weight"])
        for name, g in o["experts"].items():
            # an expert no token reached: no gradient in one process, zeros on its rank
            torch.testing.assert_close(g, ref["grads"].get(name, torch.zeros_like(g)))
    assert sum(len(o["experts"]) for o in outs) == 4 * EXPERTS  # every expert's fc1/fc2 weight and bias
    load = [t for o in outs for t in o["stats"]["tokens_per_expert"]]
    assert load == ref["stats"]["tokens_per_expert"]
    assert sum(o["stats"]["dropped"] for o in outs) == ref["stats"]["dropped"]
    for rank, o in enumerate(outs):
        sent = a2a_bytes_from_counts(o["stats"]["sent_rows"], rank, HIDDEN, 8)
        assert o["bytes"] == {
            "dispatch": sent,
            "combine (backward)": sent,
            "combine": a2a_bytes_from_counts(o["stats"]["received_rows"], rank, HIDDEN, 8),
            "dispatch (backward)": a2a_bytes_from_counts(o["stats"]["received_rows"], rank, HIDDEN, 8),
        }
    return ref


def test_two_ranks_top2_with_drops(cluster2):
    ref = _check(cluster2.call(_ep_harness, (2, 1.0), timeout=90), 2, 1.0)
    assert ref["stats"]["dropped"] > 0  # the capacity bites at this size: drops are part of what is compared


def test_two_ranks_send_recv_engine(cluster2):
    _check(cluster2.call(_ep_harness, (1, 1.25, "p2p"), timeout=90), 1, 1.25)


def test_three_ranks_top1(cluster3):
    _check(cluster3.call(_ep_harness, (1, 1.0), timeout=120), 1, 1.0)


def test_four_ranks_top2(cluster4):
    _check(cluster4.call(_ep_harness, (2, 1.5), timeout=120), 2, 1.5)


def test_capacity_and_errors():
    from simlib.parallel import experts

    assert experts.capacity(24, 12, 2, 1.0) == 4 and experts.capacity(10, 4, 1, 1.25) == 4
    with pytest.raises(ValueError, match="top_k"):
        experts.MoE(8, 4, top_k=5)
    with pytest.raises(ValueError, match="capacity_factor"):
        experts.MoE(8, 4, capacity_factor=0)
    with pytest.raises(ValueError, match=r"12 experts do not split evenly over 5 .* ep in \[1, 2, 3, 4, 6, 12\]"):
        experts._check(12, 1, 1.0, 5, 0)


def test_uniform_router_balanced_loss_is_one():
    from simlib.parallel.experts import load_balancing_loss

    probs = torch.full((8, 4), 0.25)
    totals = torch.tensor([[2, 2, 2, 2]])
    assert float(load_balancing_loss(probs, totals, 8)) == pytest.approx(1.0)
