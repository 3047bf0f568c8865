"""Projects 2 and 3 through the one training loop: 2 and 4 ranks equal one process for the first steps.

The reference is a bare one-process loop (no simlib) on the whole global batch. Vision: with
``sync_batchnorm`` the BatchNorm statistics cover the global batch, so the runs agree to float rounding
(rtol 1e-4); with per-rank BatchNorm they do not (each rank normalises by its own shard), and the test checks
that this difference is visible. Finance: the paths of a step are the same whatever the world size (seeded
per block), so DP and DP + accumulation agree.
"""

import sys

import cloudpickle
import pytest
import torch

from simlib.train import OptimConfig, Plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])

STEPS = 3
SGD = OptimConfig(name="sgd", lr=0.05, momentum=0.9, schedule="constant")
ADAM = OptimConfig(name="adamw", lr=3e-3, schedule="constant")
TOL = dict(rtol=1e-4, atol=1e-5)


def _vision():
    from simlib.projects.vision import DigitsTask

    return DigitsTask(global_batch=32, image_size=12, width=8)


def _finance():
    from simlib.projects.finance import HedgingTask

    return HedgingTask(global_batch=128, block=16, days=10, hidden=16)


def bare_reference(make, optim):
    task = make()
    model = task.build_model()
    if optim.name == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=optim.lr, momentum=optim.momentum)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=optim.lr, betas=optim.betas, weight_decay=0.0)
    losses = []
    for step in range(STEPS):
        x, y = task.batch(step)
        opt.zero_grad()
        loss = task.loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def run_plan(make, plan, optim):
    from simlib.train import train

    record = train(make(), plan, steps=STEPS, optim=optim, log_every=1, verbose=False, measure_memory=False)
    return [r["loss"] for r in record.rows]


@pytest.mark.parametrize("world", [2, 4])
def test_vision_sync_batchnorm_equals_one_process(request, world):
    cluster = request.getfixturevalue(f"cluster{world}")
    ref = bare_reference(_vision, SGD)
    synced, per_rank = (
        cluster.call(run_plan, (_vision, Plan(dp=world, sync_batchnorm=True), SGD), timeout=120),
        cluster.call(run_plan, (_vision, Plan(dp=world), SGD), timeout=120),
    )
    for losses in synced:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), **TOL)
    # per-rank statistics change the step: the first loss is a mean of shard losses under other normalisations
    assert max(abs(a - b) for a, b in zip(per_rank[0], ref)) > 1e-3


@pytest.mark.parametrize(
    "world, plan", [(2, Plan(dp=2)), (2, Plan(dp=2, accumulation=2)), (4, Plan(dp=4))], ids=["dp2", "dp2 acc2", "dp4"]
)
def test_finance_equals_one_process(request, world, plan):
    cluster = request.getfixturevalue(f"cluster{world}")
    ref = bare_reference(_finance, ADAM)
    for losses in cluster.call(run_plan, (_finance, plan, ADAM), timeout=120):
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), **TOL)


def test_sync_batchnorm_gradients_match_batchnorm(cluster2):
    """The layer alone: forward, input and parameter gradients on 2 ranks equal BatchNorm2d on the whole batch."""

    def harness():
        import torch
        import torch.distributed as dist
        from torch import nn

        from simlib.parallel.batchnorm import convert_sync_batchnorm

        torch.manual_seed(0)
        x = torch.randn(8, 3, 5, 5) * 2 + 1
        w = torch.randn(8, 3, 5, 5)
        ref = nn.BatchNorm2d(3)
        xr = x.clone().requires_grad_()
        yr = ref(xr)
        (yr * w).sum().backward()
        r = dist.get_rank()
        bn = convert_sync_batchnorm(nn.BatchNorm2d(3))
        xs = x[r * 4 : (r + 1) * 4].clone().requires_grad_()
        y = bn(xs)
        (y * w[r * 4 : (r + 1) * 4]).sum().backward()
        g = bn.weight.grad.clone()
        dist.all_reduce(g)  # the layer leaves parameter gradients local (the DP wrapper reduces them)
        return [
            float((a - b).abs().max())
            for a, b in (
                (y, yr[r * 4 : (r + 1) * 4]),
                (xs.grad, xr.grad[r * 4 : (r + 1) * 4]),
                (g, ref.weight.grad),
                (bn.running_var, ref.running_var),
            )
        ]

    for errors in cluster2.run(harness):
        assert max(errors) < 1e-4, errors


def test_plan_rejects_a_batch_that_does_not_split():
    with pytest.raises(ValueError, match="does not split"):
        Plan(dp=4, accumulation=3).validate(4, _vision())
