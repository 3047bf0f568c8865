"""Every data-parallel variant equals the single-process run on the global batch, on 2 and 4 ranks."""

import pytest
import torch

from simlib.lessons import data_parallel as L
from simlib.parallel import data as D

CONFIG = dict(steps=3, global_batch=48, width=32, depth=3, lr=0.05)
TOL = dict(rtol=1e-5, atol=1e-6)  # float32 sums in a different order: equal to ~1e-7, not bit-equal


@pytest.fixture(scope="module")
def reference():
    return L.reference_run(**CONFIG)


@pytest.mark.parametrize("mode", D.MODES)
@pytest.mark.parametrize("world", [2, 4])
def test_matches_single_process(request, reference, mode, world):
    cluster = request.getfixturevalue(f"cluster{world}")
    # a tiny bucket cap gives several buckets, so the hook/bucket bookkeeping is exercised
    outs = cluster.call(L.run_data_parallel, (mode,), dict(CONFIG, bucket_cap_mb=0.004), timeout=60)
    for out in outs:
        assert out["state"].keys() == reference["state"].keys()
        for name, value in reference["state"].items():
            torch.testing.assert_close(out["state"][name], value, **TOL, msg=f"{mode} {name}")
    # the first loss is the mean over the shard, so ranks differ; the replicas' weights do not
    for out in outs[1:]:
        for name in reference["state"]:
            torch.testing.assert_close(out["state"][name], outs[0]["state"][name], rtol=0, atol=0)


def test_bucket_overlaps_and_counts(cluster2):
    out = cluster2.call(L.run_data_parallel, ("bucket",), dict(CONFIG, bucket_cap_mb=0.004, timeline=True), timeout=60)[
        0
    ]
    df = out["timeline"]
    rank0 = df[(df["rank"] == 0) & (df["step"] == 1)]
    comm = rank0[rank0["kind"] == "comm"]
    backward_end = rank0.loc[rank0["kind"] == "backward", "end"].max()  # pieces: each bucket's issue is cut out
    assert len(comm) > 1  # several buckets
    assert comm["start"].min() < backward_end  # the first bucket left before backward finished
    after = rank0[(rank0["kind"] == "backward") & (rank0["start"] > comm["start"].min())]
    assert len(after) >= 1  # backward went on computing after the first bucket was issued


def test_make_buckets_reverse_and_capped():
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 10))
    params = list(model.parameters())
    buckets = D.make_buckets(params, bucket_cap_mb=440 / 2**20)  # 440 bytes = one weight + one bias
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
    L.train_steps(dp, opt, shard(x, groups.dp_rank, 2), shard(y, groups.dp_rank, 2), steps)
    return groups.tp_rank, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("mode", D.MODES)
def test_group_aware_inside_a_mesh(cluster4, mode):
    from simlib.models import MLP, make_regression

    outs = cluster4.call(_dp_in_mesh, (mode,), timeout=60)
    for tp_rank, state in outs:
        torch.manual_seed(10 + tp_rank)
        model = MLP(8, 2)
        x, y = make_regression(12, 8, seed=1)
        L.train_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), x, y, 2)
        for name, value in model.state_dict().items():
            torch.testing.assert_close(state[name], value, **TOL, msg=f"{mode} tp_rank {tp_rank} {name}")


# ───────────── inputs nobody planned for: right answer or a clear error (issue 8) ─────────────


class _Experts(torch.nn.Module):
    """Two branches; which ones a rank uses is up to the test (a mixture of experts, a branch taken on one rank)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.shared = torch.nn.Linear(4, 4)
        self.expert = torch.nn.Linear(4, 1)
        self.other = torch.nn.Linear(4, 1)

    def forward(self, x, use_expert=True):
        h = self.shared(x)
        return self.expert(h) if use_expert else self.other(h)


def _data(rank, n=6):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)


def _grads(model):
    return {n: (p.grad.clone() if p.grad is not None else None) for n, p in model.named_parameters()}


def _expected_mean(world, fn):
    """The mean over ranks of what ``fn(model, rank)`` leaves in the gradients, computed in one process."""
    total = {}
    for rank in range(world):
        model = _Experts()
        fn(model, rank)
        for name, g in _grads(model).items():
            if g is not None:
                total[name] = total.get(name, 0) + g / world
    return total


def _two_backwards(model, rank):
    for part in range(2):
        x, y = _data(10 * rank + part)
        torch.nn.functional.mse_loss(model(x), y).backward()


def _two_backwards_then_finish(mode):
    import torch.distributed as dist

    model = _Experts()
    dp = D.wrap(model, mode, bucket_cap_mb=1e-9, find_unused_parameters=True)  # "other" is never used
    _two_backwards(dp, dist.get_rank())
    dp.finish_gradient_synchronization()
    return _grads(model)


def _synced_then_no_sync_backward(mode):
    import torch.distributed as dist

    model = _Experts()
    dp = D.wrap(model, mode, bucket_cap_mb=1e-9, find_unused_parameters=True)
    x, y = _data(10 * dist.get_rank())
    torch.nn.functional.mse_loss(dp(x), y).backward()  # synced: the buckets go out ...
    with dp.no_sync():  # ... then more gradient arrives after they left
        x, y = _data(10 * dist.get_rank() + 1)
        torch.nn.functional.mse_loss(dp(x), y).backward()
    dp.finish_gradient_synchronization()
    return _grads(model)


@pytest.mark.parametrize("worker", [_two_backwards_then_finish, _synced_then_no_sync_backward])
@pytest.mark.parametrize("mode", ["naive", "flat", "bucket"])
def test_two_backwards_before_finish_accumulate(cluster2, mode, worker):
    """Item 1: backward twice, finish once = the mean of the summed gradients, on every rank, every run."""
    expected = _expected_mean(2, _two_backwards)
    for _ in range(2):  # it used to change from run to run
        outs = cluster2.call(worker, (mode,), timeout=30)
        for rank, grads in enumerate(outs):
            assert grads["other.weight"] is None  # used on no rank: left alone
            for name, value in expected.items():
                torch.testing.assert_close(grads[name], value, **TOL, msg=f"{mode} rank {rank} {name}")


def _expert_on_rank0_only(mode, find_unused):
    import torch.distributed as dist

    rank = dist.get_rank()
    model = _Experts()
    dp = D.wrap(model, mode, bucket_cap_mb=1e-9, find_unused_parameters=find_unused)
    x, y = _data(rank)
    # rank 0 takes the expert, rank 1 the other branch: each branch's gradient is None on one rank
    torch.nn.functional.mse_loss(dp(x, use_expert=rank == 0), y).backward()
    try:
        getattr(dp, "finish_gradient_synchronization", lambda: None)()  # DDP finishes inside backward
    except RuntimeError as exc:
        return str(exc)
    return _grads(model)


@pytest.mark.parametrize("mode", ["naive", "flat", "bucket"])
def test_gradient_on_some_ranks_only_raises_naming_ranks_and_parameters(cluster2, mode):
    """Items 2 and 4: without find_unused_parameters, a clear error on every rank (no mixing, no Gloo abort)."""
    for message in cluster2.call(_expert_on_rank0_only, (mode, False), timeout=30):
        assert isinstance(message, str), f"{mode}: no error"
        assert "expert.weight" in message and "rank(s) [1]" in message and "rank(s) [0]" in message
        assert "find_unused_parameters=True" in message
    # the process group is still in step: the next call works
    assert cluster2.call(_expert_on_rank0_only, (mode, True), timeout=30)[0] is not None


@pytest.mark.parametrize("mode", D.MODES)
def test_find_unused_parameters_takes_a_zero(cluster2, mode):
    """Items 2 and 4 with find_unused_parameters=True: the mean with a zero where a rank has no gradient (as DDP)."""

    def fn(model, rank):
        x, y = _data(rank)
        torch.nn.functional.mse_loss(model(x, use_expert=rank == 0), y).backward()

    expected = _expected_mean(2, fn)
    for rank, grads in enumerate(cluster2.call(_expert_on_rank0_only, (mode, True), timeout=30)):
        assert not isinstance(grads, str), grads
        for name, value in expected.items():
            torch.testing.assert_close(grads[name], value, **TOL, msg=f"{mode} rank {rank} {name}")


def _unused_everywhere(mode):
    model = _Experts()
    dp = D.wrap(model, mode, bucket_cap_mb=1e-9)
    x, y = _data(0)
    torch.nn.functional.mse_loss(dp(x), y).backward()  # "other" unused on every rank
    try:
        dp.finish_gradient_synchronization()
    except RuntimeError as exc:
        return str(exc)
    return None


def test_bucket_never_filled_names_parameters_and_remedy(cluster2):
    for message in cluster2.call(_unused_everywhere, ("bucket",), timeout=30):
        assert message and "never filled" in message and "other.weight" in message
        assert "find_unused_parameters=True" in message


class _Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w32 = torch.nn.Parameter(torch.ones(3))
        self.w16 = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))

    def forward(self, x):
        return (self.w32 * x).sum() + (self.w16.float() * x).sum()


def _mixed_dtypes(mode):
    import torch.distributed as dist

    model = _Mixed()
    dp = D.wrap(model, mode, bucket_cap_mb=25.0)
    # gradients bf16 cannot hold: 1000.1 rounds to 1000 in bf16; 70000 would overflow fp16
    dp(torch.tensor([1000.1, 70000.0, 1.001]) * (dist.get_rank() + 1)).backward()
    dp.finish_gradient_synchronization()
    return model.w32.grad.clone(), model.w16.grad.clone()


@pytest.mark.parametrize("mode", ["flat", "bucket"])
def test_mixed_dtypes_keep_fp32_gradients_exact(cluster2, mode):
    """Item 3: buckets per dtype; the fp32 gradient is not rounded to bf16."""
    expected = torch.tensor([1000.1, 70000.0, 1.001]) * 1.5
    for g32, g16 in cluster2.call(_mixed_dtypes, (mode,), timeout=30):
        assert g32.dtype == torch.float32 and g16.dtype == torch.bfloat16
        torch.testing.assert_close(g32, expected, rtol=1e-6, atol=0)
        torch.testing.assert_close(g16, expected.bfloat16(), rtol=1e-2, atol=0)


def test_make_buckets_one_dtype_per_bucket():
    params = list(_Mixed().parameters())
    buckets = D.make_buckets(params, 25.0)
    assert len(buckets) == 2 and all(len({p.dtype for p in b}) == 1 for b in buckets)
