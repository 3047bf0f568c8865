"""CUDA and NCCL paths: run where a GPU is present (skipped on CPU-only machines, such as CI's).

On a single-GPU machine NCCL can run one rank (it refuses two ranks on one GPU); two ranks share the GPU over
Gloo with CUDA tensors. `python -m pytest tests/test_gpu.py -p no:nbval` is the check to run on a lent GPU.
"""

import pytest
import torch

import simlib

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _nccl_all_reduce():
    import torch.distributed as dist

    ctx = simlib.context()
    x = torch.full((1024,), float(ctx.rank + 1), device=ctx.device)
    dist.all_reduce(x)
    return ctx.backend, str(ctx.device), x[0].item()


def test_auto_backend_is_nccl_with_a_gpu_per_rank():
    n = torch.cuda.device_count()
    out = simlib.launch(_nccl_all_reduce, n)
    assert [o[0] for o in out] == ["nccl"] * n
    assert [o[1] for o in out] == [f"cuda:{r}" for r in range(n)]
    assert all(o[2] == n * (n + 1) / 2 for o in out)


def test_two_ranks_share_one_gpu_over_gloo():
    out = simlib.launch(_nccl_all_reduce, 2, backend="gloo", device="cuda:0")
    assert [o[0] for o in out] == ["gloo", "gloo"] and all(o[1] == "cuda:0" for o in out)
    assert [o[2] for o in out] == [3.0, 3.0]


def _timed_matmul():
    from simlib.timeline import Timeline, summarize

    ctx = simlib.context()
    a = torch.randn(2048, 2048, device=ctx.device)
    tl = Timeline(warmup=1, device=ctx.device)
    for step in range(4):
        with tl.step(step):
            with tl.span("forward"):
                for _ in range(10):
                    a = (a @ a).tanh()
    return summarize(tl.gather())


def test_timeline_times_gpu_work_with_cuda_events():
    summary = simlib.launch(_timed_matmul, 1)[0]
    # 10 matmuls of 2048^3 are ~0.17 TFLOP: on any GPU well over 10 us, well under 10 s
    assert 1e-5 < summary["forward_time"] < 10 and summary["steps"] == 3


def test_scaling_sweep_runs_on_gpus():
    from simlib.lessons import scaling as experiments

    sizes = [w for w in (1, 2, 4, 8) if w <= torch.cuda.device_count()]
    table = experiments.scaling(sizes, width=512, depth=2, global_batch=512, steps=5, warmup=2, progress=False)
    assert table.attrs["device"] == "cuda" and (table["step_time"] > 0).all()


def _fp16_gpt(steps=6):
    from simlib.projects.gpt import GPTTask
    from simlib.train import OptimConfig, Plan, train

    record = train(
        GPTTask.quick(),
        Plan(dp=2, mixed_precision="fp16"),
        steps=steps,
        log_every=1,
        verbose=False,
        optim=OptimConfig(lr=1e-3, grad_clip=1.0),
    )
    return [(r["loss"], r["loss_scale"], r["skipped_steps"]) for r in record.rows]


def test_fp16_trains_with_loss_scaling_in_the_loop():
    """Plan(mixed_precision="fp16") on a GPU: the loop scales the loss (the scale logged each step), the losses stay
    finite and fall, and both ranks (sharing the GPU over Gloo) log the same scale."""
    outs = simlib.launch(_fp16_gpt, 2, backend="gloo", device="cuda:0")
    for rows in outs:
        losses, scales, _ = zip(*rows)
        assert all(torch.isfinite(torch.tensor(losses))), rows
        assert losses[-1] < losses[0] and all(s > 0 for s in scales), rows
    assert [r[1:] for r in outs[0]] == [r[1:] for r in outs[1]]
