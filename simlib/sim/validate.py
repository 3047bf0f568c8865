"""Predicted against measured: data-parallel MLP runs on this machine, beside the cost model's prediction.

One source of truth for notebook 06 and ``benchmarks/sim_accuracy.py``: both call :func:`validation_table`.
Each configuration is run for real on the first ``world_size`` ranks of one warm cluster (a sub-group), one
torch thread per process (world 4 on 2 cores is oversubscribed, and so is the calibration it is predicted with).
Gradients are synced bucket by bucket (``simlib.parallel.data.make_buckets``, DDP's reverse-order rule), each
bucket packed flat, all-reduced, divided and unpacked (as ``DataParallelFlat`` does for one bucket), after
backward of the last micro-batch (accumulation syncs once per step, like ``no_sync``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RunConfig:
    """One measured configuration: ``world_size`` ranks, each with ``accumulation`` micro-batches."""

    world_size: int
    micro_batch: int  # samples per micro-batch per rank
    accumulation: int = 1
    bucket_mb: float = 1000.0  # bucket cap in MiB (1000: one bucket for the whole MLP)
    width: int = 1024
    depth: int = 4
    pipeline: str | None = None  # "1f1b" or "gpipe": world_size pipeline stages, accumulation = micro-batches

    @property
    def label(self) -> str:
        if self.pipeline:
            return (
                f"pp{self.world_size} {self.pipeline} {self.depth}x{self.width} "
                f"{self.accumulation} x mb{self.micro_batch}"
            )
        bucket = "one bucket" if self.bucket_mb >= 1000 else f"{self.bucket_mb:g} MB buckets"
        acc = f", accumulate {self.accumulation}" if self.accumulation > 1 else ""
        return f"w{self.world_size} {self.depth}x{self.width} mb{self.micro_batch}{acc}, {bucket}"

    def strategy(self):
        from .strategy import Strategy

        return Strategy(
            dp=self.world_size,
            micro_batch=self.micro_batch,
            num_micro_batches=self.accumulation,
            bucket_bytes=self.bucket_mb * 2**20,
            dtype="fp32",
            optimizer="sgd",
            threads=1,
        )


def default_configs(quick: bool = False) -> list[RunConfig]:
    """Fourteen configurations: DP at 1/2/4, accumulation, bucket sizes, two widths, 2-stage pipelines."""
    mb = 128 if quick else 256
    configs = [
        RunConfig(1, mb),
        RunConfig(2, mb // 2),
        RunConfig(4, mb // 4),  # strong scaling
        RunConfig(2, mb),
        RunConfig(4, mb),  # weak scaling
        RunConfig(2, mb // 4, accumulation=4),
        RunConfig(2, mb // 2, accumulation=2),
        RunConfig(2, mb // 2, bucket_mb=1),
        RunConfig(2, mb // 2, bucket_mb=4),
        RunConfig(4, mb // 4, bucket_mb=1),
        RunConfig(1, mb, width=512),
        RunConfig(2, mb // 2, width=512),
        RunConfig(2, mb // 4, accumulation=4, pipeline="1f1b"),
        RunConfig(2, mb // 4, accumulation=4, pipeline="gpipe"),
    ]
    return configs


def dp_workload(config: RunConfig, steps: int, warmup: int, seed: int = 0):
    """Run on every rank of a cluster; ranks < world_size train and return their timeline records."""
    import torch
    import torch.distributed as dist

    from ..env import device
    from ..models import MLP, make_regression
    from ..parallel.data import all_reduce_mean_flat, make_buckets
    from ..timeline import Timeline
    from .calibrate import subgroup

    w = config.world_size
    group = subgroup(w)
    rank = dist.get_rank()
    if rank >= w:
        return None
    if config.pipeline:
        return _pipeline_workload(config, steps, warmup, seed, group)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dev = device()
        torch.manual_seed(seed)
        model = MLP(config.width, config.depth).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x, y = (
            t.to(dev)
            for t in make_regression(config.micro_batch * config.accumulation, config.width, seed=seed + 1 + rank)
        )
        xs, ys = x.chunk(config.accumulation), y.chunk(config.accumulation)
        buckets = make_buckets(model.parameters(), config.bucket_mb)
        tl = Timeline(rank=rank, warmup=warmup, device=dev)
        if w > 1:
            dist.barrier(group=group)
        for step in range(warmup + steps):
            with tl.step(step):
                opt.zero_grad(set_to_none=False)
                for xb, yb in zip(xs, ys):
                    with tl.span("forward"):
                        loss = torch.nn.functional.mse_loss(model(xb), yb)
                    with tl.span("backward"):
                        loss.backward()
                if w > 1:
                    for i, bucket in enumerate(buckets):
                        with tl.span("comm", name=f"bucket {i}"):
                            all_reduce_mean_flat([p.grad for p in bucket], group=group)
                with tl.span("optimizer"):
                    opt.step()
        return tl.records()
    finally:
        torch.set_num_threads(old_threads)


def _pipeline_stages(config, rank, device="cpu"):
    from ..models import MLP
    from ..parallel.pipeline import build_stages

    return build_stages(MLP(config.width, config.depth).to(device).net, rank, config.world_size)


def _pipeline_workload(config, steps, warmup, seed, group):
    """Pipeline-parallel MLP: ``simlib.parallel.pipeline.run_schedule`` of a ``schedules`` value, then SGD."""
    import torch
    import torch.distributed as dist

    from ..env import device
    from ..models import make_regression
    from ..parallel import schedules
    from ..parallel.pipeline import run_schedule
    from ..timeline import Timeline

    rank, m = dist.get_rank(group), config.accumulation
    old_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        dev = device()
        stages = _pipeline_stages(config, rank, dev)
        opt = torch.optim.SGD([p for s in stages for p in s.parameters()], lr=1e-3)
        x, y = (t.to(dev) for t in make_regression(config.micro_batch * m, config.width, seed=seed + 1))
        actions = getattr(schedules, {"1f1b": "one_f_one_b", "gpipe": "gpipe"}[config.pipeline])(config.world_size, m)[
            rank
        ]
        tl = Timeline(rank=dist.get_global_rank(group, rank) if group is not None else rank, warmup=warmup, device=dev)
        dist.barrier(group=group)
        for step in range(warmup + steps):
            with tl.step(step):
                opt.zero_grad(set_to_none=False)
                run_schedule(
                    actions,
                    stages,
                    list(x.chunk(m)),
                    list(y.chunk(m)),
                    activation_shape=(config.micro_batch, config.width),
                    group=group,
                    timeline=tl,
                )
                with tl.span("optimizer"):
                    opt.step()
        return tl.records()
    finally:
        torch.set_num_threads(old_threads)


def predict_pipeline(config: RunConfig, hardware, steps: int = 1):
    """Replay the measured schedule value with each stage's predicted forward/backward time."""
    from ..parallel import schedules
    from .cost import accumulate_grad_time, gemms_time, p2p
    from .grad_sync import optimizer_time
    from .model import from_module
    from .replay import replay_pipeline
    from .strategy import Strategy

    p, mb = config.world_size, config.micro_batch
    t_f, t_b, t_opt = [], [], []
    for stage in range(p):
        spec = from_module(_pipeline_stages(config, stage)[0], name=f"stage {stage}")
        fwd = spec.forward_gemms(mb)
        bwd = [(k, m, n, c) for m, k, n, c in fwd] + [(m, n, k, c) for m, k, n, c in fwd[(1 if stage == 0 else 0) :]]
        elementwise = spec.elementwise_bytes(mb) / hardware.mem_rate(p)
        straggle = hardware.straggler(p)
        acc = accumulate_grad_time(spec.params, hardware, Strategy(dtype="fp32"), p)
        layer = hardware.layer_factor(p, 1)
        t_f.append((layer * gemms_time(fwd, hardware, "fp32", p, 1) + 2 / 5 * elementwise) * straggle)
        t_b.append((layer * gemms_time(bwd, hardware, "fp32", p, 1) + 3 / 5 * elementwise + acc) * straggle)
        t_opt.append(optimizer_time(spec, hardware, Strategy(dtype="fp32", optimizer="sgd"), p))
    make = {"1f1b": schedules.one_f_one_b, "gpipe": schedules.gpipe}[config.pipeline]
    link = hardware.p2p_link() or hardware.intra.at(p)  # a measured isend/recv ping-pong where calibrated
    tl = replay_pipeline(make(p, config.accumulation), t_f, t_b, p2p(mb * config.width * 4, link), steps=steps)
    return float(tl[tl.kind == "step"].end.max()) / steps + max(t_opt), tl


def measure(cluster, config: RunConfig, steps: int = 10, warmup: int = 3, timeout: float = 120.0):
    """Run ``config`` for real; returns its timeline table (all ranks, one clock)."""
    from ..timeline import to_frame

    if cluster.world_size < config.world_size:
        raise ValueError(f"config needs {config.world_size} ranks; the cluster has {cluster.world_size}")
    out = cluster.call(dp_workload, (config, steps, warmup), timeout=timeout)
    return to_frame([row for rows in out if rows for row in rows])


def predict_config(config: RunConfig, hardware):
    from ..models import MLP
    from .cost import predict
    from .model import from_module

    model = from_module(MLP(config.width, config.depth))
    return predict(model, hardware, config.strategy(), processes=config.world_size)


def validation_table(cluster, hardware, configs=None, steps: int | None = None, warmup: int = 2, repeats: int = 1):
    """Predict and measure every config; one row each with the relative error of the prediction.

    ``repeats``: measure the whole set that many times, interleaved, and keep each config's median (the box is
    shared and noisy: interleaving spreads load spikes over all configs instead of one).
    """
    import pandas as pd

    from .. import env
    from ..timeline import summarize

    configs = configs or default_configs(env.quick())
    steps = steps or (4 if env.quick() else 12)
    measured = {i: [] for i in range(len(configs))}
    spreads = {i: [] for i in range(len(configs))}
    for _ in range(repeats):
        for i, config in enumerate(configs):
            summary = summarize(measure(cluster, config, steps, warmup))
            measured[i].append(summary["step_time"])
            spreads[i].append(summary["step_time_iqr"])
    rows = []
    for i, config in enumerate(configs):
        m = float(np.median(measured[i]))
        if config.pipeline:
            step, _ = predict_pipeline(config, hardware)
            rows.append(
                dict(
                    config=config.label,
                    world_size=config.world_size,
                    micro_batch=config.micro_batch,
                    accumulation=config.accumulation,
                    bucket_mb=None,
                    width=config.width,
                    predicted=step,
                    measured=m,
                    measured_iqr=float(np.median(spreads[i])),
                    predicted_compute=None,
                    predicted_comm=None,
                    predicted_optimizer=None,
                    error=step / m - 1,
                )
            )
            continue
        p = predict_config(config, hardware)
        rows.append(
            dict(
                config=config.label,
                world_size=config.world_size,
                micro_batch=config.micro_batch,
                accumulation=config.accumulation,
                bucket_mb=config.bucket_mb,
                width=config.width,
                predicted=p.step_time,
                measured=m,
                measured_iqr=float(np.median(spreads[i])),
                predicted_compute=p.compute,
                predicted_comm=p.exposed_comm,
                predicted_optimizer=p.optimizer,
                error=p.step_time / m - 1,
            )
        )
    table = pd.DataFrame(rows)
    table["abs_error"] = table["error"].abs()
    return table


def median_abs_error(table) -> float:
    return float(table["abs_error"].median())
