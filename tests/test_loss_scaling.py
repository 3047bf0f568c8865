"""fp16's dynamic loss scaling in the one loop, checked without a GPU.

``Plan(mixed_precision="fp16")`` turns on ``simlib.parallel.precision.LossScaler`` in ``simlib.train``; the same
path runs in fp32 with ``Plan(loss_scaling=True)``, where a power-of-two scale is exact (the equality with one
process is in ``tests/test_train.py``). Here: the scaler's own rules, a step with an overflow skipped (weights
unchanged, scale halved) instead of poisoning the weights, and the skip agreed by every rank.
"""

import sys

import cloudpickle
import pytest
import torch

from simlib.parallel.precision import LossScaler
from simlib.train import Plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_scaler_backs_off_after_an_overflow_and_grows_after_good_steps():
    p = torch.nn.Parameter(torch.ones(3))
    scaler = LossScaler(init_scale=8.0, growth_interval=2)
    p.grad = torch.full((3,), 8.0)
    assert scaler.unscale_([p]) and torch.equal(p.grad, torch.ones(3))  # back to the true gradient
    scaler.update()
    p.grad = torch.tensor([1.0, float("inf"), 0.0])
    assert not scaler.unscale_([p])
    scaler.update()
    assert scaler.scale == 4.0 and scaler.skipped == 1 and scaler.good_steps == 0
    for _ in range(2):
        p.grad = torch.ones(3)
        assert scaler.unscale_([p])
        scaler.update()
    assert scaler.scale == 8.0  # doubled after growth_interval good steps
    state = scaler.state_dict()
    other = LossScaler()
    other.load_state_dict(state)
    assert other.scale == 8.0 and other.skipped == 1
    with pytest.raises(ValueError, match="backoff_factor"):
        LossScaler(backoff_factor=2.0)


def test_plan_turns_scaling_on_for_fp16_only():
    assert Plan(mixed_precision="fp16").scales_loss and not Plan(mixed_precision="bf16").scales_loss
    assert Plan(loss_scaling=True).scales_loss and not Plan(mixed_precision="fp16", loss_scaling=False).scales_loss
    with pytest.raises(ValueError, match="loss_scaling"):
        Plan(loss_scaling="yes")


def _overflow_at_step_1():
    """dp=2 with loss scaling; rank 0's shard of step 1's batch holds an inf: that step must be skipped everywhere."""
    import torch.distributed as dist

    from simlib.tasks import RegressionTask
    from simlib.train import train

    class Overflow(RegressionTask):
        def batch(self, step):
            x, y = super().batch(step)
            if step == 1:
                x = x.clone()
                x[0, 0] = float("inf")  # sample 0: rank 0's shard only
            return x, y

    task = Overflow(width=16, depth=2, global_batch=16, num_samples=256)
    record = train(task, Plan(dp=2, loss_scaling=True), steps=3, log_every=1, verbose=False, measure_memory=False)
    finite = all(bool(torch.isfinite(v).all()) for v in record.model.module.state_dict().values())
    return dist.get_rank(), [(r["loss_scale"], r["skipped_steps"]) for r in record.rows], finite


def test_an_overflow_is_skipped_on_every_rank(cluster2):
    for rank, rows, finite in cluster2.call(_overflow_at_step_1, timeout=120):
        scale0 = rows[0][0]
        assert [s for _, s in rows] == [0, 1, 1], f"rank {rank}: skipped steps {rows}"
        assert rows[1][0] == scale0 / 2 and rows[2][0] == scale0 / 2, f"rank {rank}: scales {rows}"
        assert finite, f"rank {rank}: the overflow reached the weights"


def _one_rank_overflows():
    import torch.distributed as dist

    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.tensor([float("inf"), 1.0]) if dist.get_rank() == 0 else torch.ones(2)
    return LossScaler().unscale_([p])


def test_the_skip_is_agreed_when_ranks_hold_different_gradients(cluster2):
    """Under TP, PP or ZeRO-2/3 ranks hold different gradients: one rank's overflow must stop every rank's step."""
    assert cluster2.call(_one_rank_overflows, timeout=60) == [False, False]


def _overflow_then_resume(folder):
    """Run 1: 2 steps, step 1 overflows (scale halved), checkpoint at step 2. Run 2 resumes to step 4."""
    import torch.distributed as dist

    from simlib.tasks import RegressionTask
    from simlib.train import OptimConfig, train

    class Overflow(RegressionTask):
        def batch(self, step):
            x, y = super().batch(step)
            if step == 1:
                x = x.clone()
                x[0, 0] = float("inf")
            return x, y

    task = Overflow(width=16, depth=2, global_batch=16, num_samples=256)
    plan = Plan(dp=2, loss_scaling=True, checkpoint_dir=folder, checkpoint_every=2)
    optim = OptimConfig(lr=1e-2, decay_steps=4)  # one schedule for both runs: the second continues the first
    first = train(task, plan, steps=2, optim=optim, log_every=1, verbose=False, measure_memory=False)
    resumed = train(task, plan, steps=4, optim=optim, log_every=1, verbose=False, measure_memory=False)
    return dist.get_rank(), [(r["step"], r["loss_scale"], r["skipped_steps"]) for r in first.rows + resumed.rows]


def test_a_resumed_run_keeps_the_loss_scale(cluster2, tmp_path):
    """The scaler's state is in the checkpoint: after a resume the halved scale and the skip count carry on
    (a fresh scaler would start again at 2**16 and overflow again on a real fp16 run)."""
    for rank, rows in cluster2.call(_overflow_then_resume, (str(tmp_path / "ckpt"),), timeout=120):
        scale0 = rows[0][1]
        resumed = [r for r in rows[2:]]
        assert resumed and all(scale == scale0 / 2 and skipped == 1 for _, scale, skipped in resumed), (
            f"rank {rank}: after the resume {rows}"
        )
