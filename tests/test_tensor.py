"""Tensor-parallel layers: outputs and gradients equal to the unsplit layers on 2 and 4 ranks."""
import pytest
import torch


def _tp_block(kind, hidden=16, num_heads=4, batch=2, seq=5, seed=0):
    import torch
    import torch.distributed as dist

    from simlib.models import FeedForward, SelfAttention
    from simlib.parallel import tensor

    torch.manual_seed(seed)
    dense = FeedForward(hidden) if kind == "mlp" else SelfAttention(hidden, num_heads)
    x = torch.randn(batch, seq, hidden, requires_grad=True)
    log = tensor.CommLog()
    tp = (tensor.TensorParallelMLP if kind == "mlp" else tensor.TensorParallelAttention).from_dense(dense, log=log)
    y = tp(x)
    forward_calls = len(log.calls)
    (y * torch.arange(y.numel()).view_as(y).sin()).sum().backward()  # a loss that weighs every output
    return dict(y=y.detach(), x_grad=x.grad, forward_calls=forward_calls, calls=log.calls,
                grads={n: p.grad for n, p in tp.named_parameters()}, world_size=dist.get_world_size())


def _reference(kind, hidden=16, num_heads=4, batch=2, seq=5, seed=0):
    from simlib.models import FeedForward, SelfAttention
    torch.manual_seed(seed)
    dense = FeedForward(hidden) if kind == "mlp" else SelfAttention(hidden, num_heads)
    x = torch.randn(batch, seq, hidden, requires_grad=True)
    y = dense(x)
    (y * torch.arange(y.numel()).view_as(y).sin()).sum().backward()
    return dense, y.detach(), x.grad


def _check(results, kind, hidden=16, num_heads=4):
    from simlib.parallel.tensor import comm_volume
    dense, y, x_grad = _reference(kind)
    t = len(results)
    for rank, r in enumerate(results):
        torch.testing.assert_close(r["y"], y, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r["x_grad"], x_grad, rtol=1e-5, atol=1e-6)
        assert r["forward_calls"] == 1 and len(r["calls"]) == 2  # one all-reduce each way
        assert sum(c[2] for c in r["calls"]) == comm_volume(2, 5, hidden, t)["step_payload_bytes"]
        if kind == "mlp":
            n = dense.fc1.out_features // t
            rows = slice(rank * n, (rank + 1) * n)
            torch.testing.assert_close(r["grads"]["fc1.weight"], dense.fc1.weight.grad[rows])
            torch.testing.assert_close(r["grads"]["fc1.bias"], dense.fc1.bias.grad[rows])
            torch.testing.assert_close(r["grads"]["fc2.weight"], dense.fc2.weight.grad[:, rows])
            torch.testing.assert_close(r["grads"]["fc2.bias"], dense.fc2.bias.grad)
        else:
            heads, d = num_heads // t, hidden // num_heads
            rows = torch.arange(3 * hidden).view(3, num_heads, d)[:, rank * heads:(rank + 1) * heads].reshape(-1)
            torch.testing.assert_close(r["grads"]["qkv.weight"], dense.qkv.weight.grad[rows])
            cols = slice(rank * heads * d, (rank + 1) * heads * d)
            torch.testing.assert_close(r["grads"]["out.weight"], dense.out.weight.grad[:, cols])


@pytest.mark.parametrize("kind", ["mlp", "attention"])
def test_tp_2_ranks(cluster2, kind):
    _check(cluster2.call(_tp_block, (kind,), timeout=60), kind)


@pytest.mark.parametrize("kind", ["mlp", "attention"])
def test_tp_4_ranks(cluster4, kind):
    _check(cluster4.call(_tp_block, (kind,), timeout=90), kind)


def _dtensor_mlp(hidden=16, seed=0):
    import torch

    from simlib.models import FeedForward
    from simlib.parallel import tensor
    torch.manual_seed(seed)
    dense = FeedForward(hidden)
    x = torch.randn(2, 5, hidden)
    tp = tensor.dtensor_parallelize(dense, {"fc1": "colwise", "fc2": "rowwise"})
    return tensor.materialize(tp(x)).detach().clone()


def test_dtensor_reference_agrees(cluster2):
    _, y, _ = _reference("mlp")
    for out in cluster2.call(_dtensor_mlp, timeout=60):
        torch.testing.assert_close(out, y, rtol=1e-5, atol=1e-6)


def test_split_must_divide():
    from simlib.parallel.tensor import _split
    with pytest.raises(ValueError, match="divisible"):
        _split(10, 4, "num_heads")
