"""The rank grid, and combined runs (data x pipeline, data x tensor) equal to one process."""

import pytest
import torch

from simlib.parallel.mesh import Mesh


def test_grid_and_groups():
    mesh = Mesh(dp=2, pp=2)
    assert mesh.world_size == 4
    assert mesh.grid.tolist() == [[[[0]], [[1]]], [[[2]], [[3]]]]  # (dp, pp, cp, tp)
    assert mesh.groups_of("pp") == [[0, 1], [2, 3]]
    assert mesh.groups_of("dp") == [[0, 2], [1, 3]]
    assert mesh.groups_of("tp") == [[0], [1], [2], [3]]
    assert mesh.coords(3) == dict(dp=1, pp=1, cp=0, tp=0, ep=0)
    m3 = Mesh(dp=2, pp=2, tp=2)
    assert m3.groups_of("tp")[:2] == [[0, 1], [2, 3]]  # tensor-parallel neighbours are consecutive
    assert m3.groups_of("dp")[0] == [0, 4]
    assert sorted(r for g in m3.groups_of("pp") for r in g) == list(range(8))


def test_context_and_expert_groups():
    m = Mesh(dp=2, cp=2, tp=2, ep=2)  # 8 ranks: cp between pp and tp, as picotron's view(dp, pp, cp, tp)
    assert m.groups_of("tp")[:2] == [[0, 1], [2, 3]] and m.groups_of("cp")[:2] == [[0, 2], [1, 3]]
    assert m.groups_of("dp_cp") == [[0, 2, 4, 6], [1, 3, 5, 7]]  # the ranks that average gradients
    assert m.groups_of("ep") == [[0, 2], [4, 6], [1, 3], [5, 7]]  # consecutive blocks of dp x cp
    assert m.groups_of("expert_dp") == [[0, 4], [2, 6], [1, 5], [3, 7]]  # the ranks holding the same experts
    assert m.coords(6) == dict(dp=1, pp=0, cp=1, tp=0, ep=1)
    with pytest.raises(ValueError, match="ep=3 does not divide the dp x cp = 4 ranks"):
        Mesh(dp=2, cp=2, ep=3)


@pytest.mark.parametrize("bad", [dict(dp=0), dict(pp=-1), dict(tp=1.5), dict(dp=True)])
def test_mesh_validates(bad):
    with pytest.raises(ValueError):
        Mesh(**bad)


def test_mesh_checks_world():
    with pytest.raises(ValueError, match="needs 4 ranks"):
        Mesh(dp=2, tp=2).check_world(2)
    with pytest.raises(ValueError):
        Mesh(dp=2).coords(2)


def _dp_pp(width=16, depth=3, batch=8, num_microbatches=2, seed=0):
    import torch
    import torch.distributed as dist

    from simlib.models import MLP, make_regression, shard
    from simlib.parallel import pipeline, schedules
    from simlib.parallel.mesh import Mesh

    groups = Mesh(dp=2, pp=2).build()
    torch.manual_seed(seed)
    model = MLP(width=width, depth=depth, in_features=8, out_features=2)
    x, y = make_regression(batch, 8, 2, seed=seed)
    x, y = shard(x, groups.dp_rank, 2), shard(y, groups.dp_rank, 2)
    stages = pipeline.build_stages(model.net, groups.pp_rank, 2)
    out = pipeline.pipeline_step(
        schedules.one_f_one_b(2, num_microbatches),
        stages,
        x,
        y,
        num_microbatches=num_microbatches,
        activation_width=width,
        group=groups.pp_group,
    )
    grads = {}
    for n, p in model.named_parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=groups.dp_group)
            grads[n] = p.grad / 2
    return dict(grads=grads, loss=out["loss"], groups=repr(groups))


def _dp_tp(hidden=16, batch=4, seq=3, seed=0):
    import torch
    import torch.distributed as dist

    from simlib.models import FeedForward, shard
    from simlib.parallel import tensor
    from simlib.parallel.mesh import Mesh

    groups = Mesh(dp=2, tp=2).build()
    torch.manual_seed(seed)
    dense = FeedForward(hidden)
    x, target = torch.randn(batch, seq, hidden), torch.randn(batch, seq, hidden)
    tp = tensor.TensorParallelMLP.from_dense(dense, group=groups.tp_group)
    loss = torch.nn.functional.mse_loss(tp(shard(x, groups.dp_rank, 2)), shard(target, groups.dp_rank, 2))
    loss.backward()
    for p in tp.parameters():
        dist.all_reduce(p.grad, group=groups.dp_group)
        p.grad /= 2
    return dict(grads={n: p.grad for n, p in tp.named_parameters()}, tp_rank=groups.tp_rank)


def test_data_x_pipeline_4_ranks(cluster4):
    from simlib.models import MLP, make_regression

    results = cluster4.call(_dp_pp, timeout=90)
    torch.manual_seed(0)
    model = MLP(width=16, depth=3, in_features=8, out_features=2)
    x, y = make_regression(8, 8, 2, seed=0)
    torch.nn.functional.mse_loss(model(x), y).backward()
    for r in results:
        for name, g in r["grads"].items():
            torch.testing.assert_close(g, dict(model.named_parameters())[name].grad, rtol=1e-5, atol=1e-6)
    assert results[0]["grads"].keys() | results[1]["grads"].keys() == dict(model.named_parameters()).keys()
    assert results[3]["groups"] == "MeshGroups(rank=3, dp_rank=1, pp_rank=1, tp_rank=0)"


def test_data_x_tensor_4_ranks(cluster4):
    from simlib.models import FeedForward

    results = cluster4.call(_dp_tp, timeout=90)
    torch.manual_seed(0)
    dense = FeedForward(16)
    x, target = torch.randn(4, 3, 16), torch.randn(4, 3, 16)
    torch.nn.functional.mse_loss(dense(x), target).backward()
    n = dense.fc1.out_features // 2
    for r in results:
        rows = slice(r["tp_rank"] * n, (r["tp_rank"] + 1) * n)
        torch.testing.assert_close(r["grads"]["fc1.weight"], dense.fc1.weight.grad[rows], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r["grads"]["fc2.weight"], dense.fc2.weight.grad[:, rows], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r["grads"]["fc2.bias"], dense.fc2.bias.grad, rtol=1e-5, atol=1e-6)
