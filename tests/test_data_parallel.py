"""Every data-parallel variant equals the single-process run on the global batch, on 2 and 4 ranks."""
import pytest
import torch

from simlib.parallel import data as D

CONFIG = dict(steps=3, global_batch=48, width=32, depth=3, lr=0.05)
TOL = dict(rtol=1e-5, atol=1e-6)  # float32 sums in a different order: equal to ~1e-7, not bit-equal


@pytest.fixture(scope="module")
def reference():
    return D.reference_run(**CONFIG)


@pytest.mark.parametrize("mode", D.MODES)
@pytest.mark.parametrize("world", [2, 4])
def test_matches_single_process(request, reference, mode, world):
    cluster = request.getfixturevalue(f"cluster{world}")
    # a tiny bucket cap gives several buckets, so the hook/bucket bookkeeping is exercised
    outs = cluster.call(D.run_data_parallel, (mode,), dict(CONFIG, bucket_cap_mb=0.004), timeout=60)
    for out in outs:
        assert out["state"].keys() == reference["state"].keys()
        for name, value in reference["state"].items():
            torch.testing.assert_close(out["state"][name], value, **TOL, msg=f"{mode} {name}")
    # the first loss is the mean over the shard, so ranks differ; the replicas' weights do not
    for out in outs[1:]:
        for name in reference["state"]:
            torch.testing.assert_close(out["state"][name], outs[0]["state"][name], rtol=0, atol=0)


def test_bucket_overlaps_and_counts(cluster2):
    out = cluster2.call(D.run_data_parallel, ("bucket",), dict(CONFIG, bucket_cap_mb=0.004, timeline=True),
                        timeout=60)[0]
    df = out["timeline"]
    rank0 = df[(df["rank"] == 0) & (df["step"] == 1)]
    comm = rank0[rank0["kind"] == "comm"]
    backward = rank0[rank0["kind"] == "backward"].iloc[0]
    assert len(comm) > 1  # several buckets
    assert comm["start"].min() < backward["end"]  # the first bucket left before backward finished


def test_make_buckets_reverse_and_capped():
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 10))
    params = list(model.parameters())
    buckets = D.make_buckets(params, bucket_cap_mb=440 / 2 ** 20)  # 440 bytes = one weight + one bias
    assert buckets[0][0] is params[-1]  # last layer first: its gradients are ready first
    assert [len(b) for b in buckets] == [2, 2]
    assert sum(len(b) for b in D.make_buckets(params, 1e-9)) == 4  # each parameter alone when over the cap


def _unused_param_step():
    import torch.distributed as dist  # noqa: F401
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(4, 1), "unused": torch.nn.Linear(4, 1)})
    dp = D.DataParallelBucket(model, bucket_cap_mb=1e-9)
    model["used"](torch.ones(2, 4)).sum().backward()
    try:
        dp.finish_gradient_synchronization()
    except RuntimeError as exc:
        return str(exc)
    return None


def test_bucket_reports_unused_parameters(cluster2):
    messages = cluster2.call(_unused_param_step, timeout=30)
    assert all(m and "never filled" in m for m in messages)


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown mode"):
        D.wrap(torch.nn.Linear(2, 2), "magic")


def _dp_in_mesh(mode, width=8, batch=12, steps=2):
    """Data parallelism over the dp groups {0, 2} and {1, 3} of a dp=2 x tp=2 mesh (as when composed with TP)."""
    from simlib.models import MLP, make_regression, shard
    from simlib.parallel.mesh import Mesh
    groups = Mesh(dp=2, tp=2).build()
    # the group's first member holds the weights to keep; the other starts from junk that broadcast must replace
    torch.manual_seed(10 + groups.tp_rank if groups.dp_rank == 0 else 999)
    model = MLP(width, 2)
    x, y = make_regression(batch, width, seed=1)
    dp = D.wrap(model, mode, bucket_cap_mb=1e-9, group=groups.dp_group)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    D.train_steps(dp, opt, shard(x, groups.dp_rank, 2), shard(y, groups.dp_rank, 2), steps)
    return groups.tp_rank, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("mode", D.MODES)
def test_group_aware_inside_a_mesh(cluster4, mode):
    from simlib.models import MLP, make_regression
    outs = cluster4.call(_dp_in_mesh, (mode,), timeout=60)
    for tp_rank, state in outs:
        torch.manual_seed(10 + tp_rank)
        model = MLP(8, 2)
        x, y = make_regression(12, 8, seed=1)
        D.train_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), x, y, 2)
        for name, value in model.state_dict().items():
            torch.testing.assert_close(state[name], value, **TOL, msg=f"{mode} tp_rank {tp_rank} {name}")
