"""Measured pipeline runs for lesson 04 and its benchmarks: step timelines, bubble, torch's own pipelining.

Every function named ``*_steps`` runs inside ``simlib.launch`` / ``Cluster.run`` (one call per rank) and
returns the gathered timeline table (a pandas DataFrame, the same on every rank) plus per-rank numbers.

The model is :class:`simlib.models.MLP` with ``in_features = width``, split into equal stages
(:func:`simlib.parallel.pipeline.build_stages`); the micro-batch size is fixed, so a forward costs the same
whatever the number of micro-batches and the bubble formula (p - 1) / (m + p - 1) applies.
"""

from __future__ import annotations

import numpy as np


def _setup(width, depth, micro_batch, num_microbatches, num_chunks, seed):
    import torch
    import torch.distributed as dist

    from ..env import device
    from ..models import MLP, make_regression
    from ..parallel.pipeline import build_stages

    rank, world_size, dev = dist.get_rank(), dist.get_world_size(), device()
    torch.manual_seed(seed)
    model = MLP(width=width, depth=depth, in_features=width, out_features=1).to(dev)
    x, y = (t.to(dev) for t in make_regression(micro_batch * num_microbatches, width, 1, seed=seed))
    return rank, world_size, model, build_stages(model.net, rank, world_size, num_chunks), x, y


def make_schedule(name: str, num_stages: int, num_microbatches: int, num_chunks: int = 1):
    from ..parallel import schedules

    if name == "interleaved_1f1b":
        return schedules.interleaved_1f1b(num_stages, num_microbatches, num_chunks)
    return schedules.SCHEDULES[name](num_stages, num_microbatches)


def simlib_steps(
    schedule_name="1f1b",
    num_microbatches=4,
    micro_batch=32,
    width=256,
    depth=8,
    steps=6,
    warmup=2,
    num_chunks=1,
    seed=0,
) -> dict:
    """Run ``steps`` training steps with simlib's executor; returns the timeline and memory numbers."""
    import torch.distributed as dist

    from ..parallel.pipeline import pipeline_step
    from ..timeline import Timeline

    rank, world_size, model, stages, x, y = _setup(width, depth, micro_batch, num_microbatches, num_chunks, seed)
    schedule = make_schedule(schedule_name, world_size, num_microbatches, num_chunks)
    tl = Timeline(warmup=warmup, device=x.device)
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        dist.barrier()
        with tl.step(step):
            out = pipeline_step(
                schedule, stages, x, y, num_microbatches=num_microbatches, activation_width=width, timeline=tl
            )
    return dict(
        table=tl.gather(),
        rank=rank,
        loss=out["loss"],
        peak_in_flight=out["peak_in_flight"],
        peak_activation_bytes=out["peak_activation_bytes"],
    )


def torch_steps(
    schedule_name="1f1b", num_microbatches=4, micro_batch=32, width=256, depth=8, steps=6, warmup=2, seed=0
) -> dict:
    """The same model and batch with ``torch.distributed.pipelining`` (PipelineStage + ScheduleGPipe/1F1B)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from ..timeline import Timeline

    rank, world_size, model, stages, x, y = _setup(width, depth, micro_batch, num_microbatches, 1, seed)
    stage = PipelineStage(stages[0], rank, world_size, device=torch.device("cpu"))
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name]
    schedule = kind(stage, n_microbatches=num_microbatches, loss_fn=torch.nn.functional.mse_loss)
    tl = Timeline(warmup=warmup)
    loss = None
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        dist.barrier()
        with tl.step(step):
            if rank == 0:
                schedule.step(x)
            elif rank == world_size - 1:
                losses = []
                schedule.step(target=y, losses=losses)
                loss = torch.stack(losses).mean().item()
            else:
                schedule.step()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return dict(table=tl.gather(), rank=rank, loss=loss, grads=grads)


def bubble(table) -> dict:
    """Measured idle share per step: 1 - (forward + backward time of a rank) / step time, mean over ranks.

    Returns the median over measured steps and its spread (interquartile range), and the step time's median and
    interquartile range.
    """
    body = table[~table["warmup"].astype(bool)]
    steps = body[body["kind"] == "step"].groupby("step")
    step_time = steps["end"].max() - steps["start"].min()
    busy = body[body["kind"].isin(["forward", "backward"])].groupby(["step", "rank"])["duration"].sum()
    frac = (1 - busy.div(step_time, level="step")).groupby("step").mean().to_numpy()
    q1, q3 = np.percentile(frac, [25, 75])
    t1, t3 = np.percentile(step_time.to_numpy(), [25, 75])
    return dict(
        bubble=float(np.median(frac)),
        bubble_iqr=float(q3 - q1),
        step_time=float(step_time.median()),
        step_time_iqr=float(t3 - t1),
    )


def compute_times(table) -> dict:
    """Median forward and backward time of one micro-batch on one stage (measured steps)."""
    body = table[~table["warmup"].astype(bool)]
    med = body.groupby("kind")["duration"].median()
    return dict(forward=float(med.get("forward", 0.0)), backward=float(med.get("backward", 0.0)))
