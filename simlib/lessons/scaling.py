"""Scaling sweeps: the same data-parallel training step over several world sizes, measured.

``scaling()`` runs, for each world size, fresh processes that train the built-in MLP with data
parallelism through the one training loop, ``simlib.train`` (forward, backward with the gradients all-reduced
in buckets while it runs, as DDP does, optimizer step; ``dp_variant="flat"``: one all-reduce after backward), records every span with :class:`simlib.timeline.Timeline`, and returns one row per world size: step time (median and
spread), throughput, speedup, efficiency and communication fraction.

Strong scaling keeps the global batch fixed (each rank gets ``global_batch / world_size`` samples);
weak scaling keeps the per-rank batch fixed (the global batch grows with the world). The reference is one
process with the same threads per worker as each worker of the sweep (one by default), so speedup
measures what more *processes* buy. Beside it the table has the honest rival: one process using every
core (``baseline`` row), which on a 2-core laptop is usually the fastest set-up of all.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import env
from ..launch import OversubscribedWarning, launch
from ..timeline import step_times, summarize

MODES = ("strong", "weak")
DEVICES = ("auto", "cpu", "gpu-shared", "gpus")


@dataclass(frozen=True)
class Placement:
    """Where every world size of one sweep runs: the same kind of device for all of them, so that a speedup
    divides times measured alike. ``launch_kwargs`` go to ``simlib.launch``/``simlib.Cluster``; ``note`` (empty
    when there is nothing to say) goes on the table and the plot."""

    world_sizes: tuple
    kind: str  # "cpu" (Gloo), "gpus" (a GPU per rank, NCCL) or "gpu-shared" (one GPU, Gloo + CUDA tensors)
    backend: str
    device: str
    note: str = ""
    dropped: tuple = ()

    @property
    def launch_kwargs(self) -> dict:
        return {"backend": self.backend, "device": self.device}


def placement(world_sizes, devices: str = "auto", gpus: int | None = None) -> Placement:
    """Decide where a sweep over ``world_sizes`` runs, one rule for every world size of it.

    ``devices``: ``"cpu"`` (every rank on the CPU over Gloo), ``"gpus"`` (one GPU per rank over NCCL; the sweep
    stops at the GPU count and says why), ``"gpu-shared"`` (every rank on ``cuda:0``, sharing it over Gloo with
    CUDA tensors), or ``"auto"``: the CPU without a GPU, ``"gpus"`` when there is a GPU for every rank of the
    largest world, else ``"gpu-shared"``. Left to itself, each world would pick its own (NCCL on the GPU for a
    world of 1, CPU ranks for worlds larger than the GPU count), and a speedup would divide a CPU time by a
    GPU time: on one H200, 0.37x "at 2 ranks". ``gpus``: the GPU count (default: what torch sees).
    """
    if devices not in DEVICES:
        raise ValueError(f"devices must be one of {DEVICES}, got {devices!r}")
    sizes = tuple(sorted({int(w) for w in world_sizes}))
    gpus = env.gpu_count() if gpus is None else int(gpus)
    if devices == "auto":
        devices = "cpu" if gpus == 0 else "gpus" if gpus >= sizes[-1] else "gpu-shared"
    if devices == "cpu":
        note = f"every rank on the CPU over Gloo ({gpus} GPU(s) here left unused, as asked)" if gpus else ""
        return Placement(sizes, "cpu", "gloo", "cpu", note)
    if gpus == 0:
        raise ValueError(f"devices={devices!r} needs a GPU and torch sees none: use devices='cpu' (or 'auto')")
    if devices == "gpus":
        keep = tuple(w for w in sizes if w <= gpus)
        dropped = tuple(w for w in sizes if w > gpus)
        note = (
            f"stopped at {gpus} rank(s): this machine has {gpus} GPU(s), NCCL needs one per rank, and a "
            f"speedup divides times measured on the same kind of device (left out: {list(dropped)})"
            if dropped
            else ""
        )
        return Placement(keep, "gpus", "auto", "auto", note, dropped)
    return Placement(
        sizes,
        "gpu-shared",
        "gloo",
        "cuda:0",
        f"every rank shares cuda:0 over Gloo with CUDA tensors ({gpus} GPU(s) for up to {sizes[-1]} "
        "ranks): the speedup measures ranks sharing one GPU, not more GPUs",
    )


def dp_train(
    width: int = 1024,
    depth: int = 4,
    local_batch: int = 256,
    steps: int = 20,
    warmup: int = 3,
    lr: float = 1e-3,
    seed: int = 0,
    dp_variant: str = "bucket",
):
    """One rank of a data-parallel run through the one training loop; returns the gathered timeline (on rank
    0) and the final loss.

    ``simlib.train.train`` on the lessons' MLP regression task with ``Plan(dp=world_size, dp_variant=dp_variant)``:
    every rank starts from the same weights, trains on its shard of the global batch, and averages the
    gradients (``"bucket"``: in buckets overlapped with backward; ``"flat"``: one all-reduce of a flat buffer after
    it; ``"ddp"``: torch's DDP), so the ranks stay identical step after step.
    """
    from ..tasks import RegressionTask
    from ..train import OptimConfig, Plan, train

    ctx = env.init()
    global_batch = local_batch * ctx.world_size
    task = RegressionTask(
        width=width, depth=depth, global_batch=global_batch, num_samples=global_batch, eval_samples=1, seed=seed
    )
    record = train(
        task,
        Plan(dp=ctx.world_size, dp_variant=dp_variant),
        steps=warmup + steps,
        optim=OptimConfig(name="sgd", lr=lr, schedule="constant"),
        log_every=warmup + steps,
        warmup=warmup,
        measure_memory=False,
        verbose=False,
    )
    return {"timeline": record.timeline if ctx.is_main else None, "loss": record.rows[-1]["loss"]}


def measure(
    world_size: int,
    threads: int | None = 1,
    timeout: float = 120.0,
    backend: str = "auto",
    device: str = "auto",
    **train_kwargs,
):
    """Run :func:`dp_train` on ``world_size`` fresh processes (``backend``/``device``: as ``simlib.launch``, from
    :func:`placement`); return (summary dict, timeline table)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OversubscribedWarning)  # the table marks it instead
        out = launch(
            dp_train, world_size, threads=threads, call_timeout=timeout, backend=backend, device=device, **train_kwargs
        )
    timeline = out[0]["timeline"]
    return summarize(timeline), timeline


def scaling_row(summary, timeline, world_size, threads, global_batch, local_batch, baseline=None):
    times = step_times(timeline).to_numpy()
    return dict(
        world_size=world_size,
        threads=threads,
        global_batch=global_batch,
        local_batch=local_batch,
        step_time=summary["step_time"],
        step_time_p25=float(np.percentile(times, 25)),
        step_time_p75=float(np.percentile(times, 75)),
        step_time_iqr=summary["step_time_iqr"],
        steps=summary["steps"],
        forward_time=summary["forward_time"],
        backward_time=summary["backward_time"],
        comm_time=summary["comm_time"],
        optimizer_time=summary["optimizer_time"],
        comm_fraction=summary["comm_fraction"],
        exposed_comm_fraction=summary["exposed_comm_fraction"],
        throughput=global_batch / summary["step_time"],
        baseline=baseline,
    )


def scaling(
    world_sizes=(1, 2, 4),
    mode: str = "strong",
    global_batch: int = 1024,
    batch_per_rank: int | None = None,
    width: int = 1024,
    depth: int = 4,
    steps: int = 20,
    warmup: int = 3,
    threads_per_worker: int = 1,
    all_cores_baseline: bool = True,
    progress: bool = True,
    keep_timelines: bool = False,
    dp_variant: str = "bucket",
    devices: str = "auto",
):
    """Measure data-parallel training over ``world_sizes``; one row per world size (+ a baseline row).

    Columns: world_size, threads, global_batch, local_batch, step_time (median s), step_time_p25/p75,
    throughput (samples/s), speedup (with speedup_lo/hi from the step-time quartiles), efficiency
    (speedup per core used: processes x threads),
    comm_fraction, per-kind times, oversubscribed, and ``baseline`` (None for the sweep; a label for the
    one-process-all-cores row). ``table.attrs`` holds cores, mode and the configuration.
    With ``keep_timelines=True`` returns ``(table, {world_size: timeline})``. ``dp_variant``: how gradients are
    averaged (:data:`simlib.parallel.data.MODES`; ``"bucket"``, overlapped with backward as DDP, by default).
    ``devices``: where the ranks run, the same for every world size (:func:`placement`); ``table.attrs`` holds
    ``placement`` and ``placement_note`` (on the plot), and world sizes it left out are not in the table.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    world_sizes = sorted({int(w) for w in world_sizes})
    if not world_sizes or world_sizes[0] < 1:
        raise ValueError(f"world_sizes must be positive ints, got {world_sizes!r}")
    if 1 not in world_sizes:
        world_sizes = [1] + world_sizes  # speedup needs the one-process reference
    if mode == "weak" and batch_per_rank is None:
        batch_per_rank = max(1, global_batch // max(world_sizes))
    if mode == "strong":
        bad = [w for w in world_sizes if global_batch % w]
        if bad:
            raise ValueError(f"global_batch={global_batch} does not split evenly over world sizes {bad}")
    where = placement(world_sizes, devices)
    world_sizes = list(where.world_sizes)
    if where.note:
        print(f"scaling: {where.note}", flush=True)
    cores = env.cpu_count()
    from tqdm.auto import tqdm

    jobs = [(w, threads_per_worker, None) for w in world_sizes]
    if all_cores_baseline and cores > threads_per_worker and where.kind == "cpu":
        jobs.append((1, cores, f"1 process x {cores} threads"))
    rows, timelines = [], {}
    for world_size, threads, baseline in tqdm(jobs, desc=f"{mode} scaling", disable=not progress):
        local_batch = global_batch // world_size if mode == "strong" else batch_per_rank
        gb = local_batch * world_size
        summary, timeline = measure(
            world_size,
            threads=threads,
            width=width,
            depth=depth,
            local_batch=local_batch,
            steps=steps,
            warmup=warmup,
            dp_variant=dp_variant,
            **where.launch_kwargs,
        )
        rows.append(scaling_row(summary, timeline, world_size, threads, gb, local_batch, baseline))
        if baseline is None:
            timelines[world_size] = timeline
    for row in rows:
        row["device"] = where.kind
    table = speedup_table(rows, mode, cores)
    table.attrs.update(
        width=width,
        depth=depth,
        steps=steps,
        warmup=warmup,
        dp_variant=dp_variant,
        device="cpu" if where.kind == "cpu" else "cuda",
        placement=where.kind,
        placement_note=where.note,
    )
    return (table, timelines) if keep_timelines else table


def speedup_table(rows, mode: str = "strong", cores: int | None = None) -> pd.DataFrame:
    """Speedup (with quartile band), efficiency and oversubscription for rows of measured step times.

    Each row: ``world_size``, ``threads``, ``step_time`` (median), ``step_time_p25``/``_p75``, ``throughput`` and
    ``baseline`` (None for the sweep, a label for the one-process-all-cores rival); the reference is the row with
    ``world_size == 1`` and no baseline. What :func:`scaling` returns, and what lesson 02 builds from its own runs.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    cores = cores or env.cpu_count()
    table = pd.DataFrame(rows).reset_index(drop=True)
    kinds = sorted(set(table["device"].dropna())) if "device" in table else []
    if len(kinds) > 1:
        raise ValueError(
            f"these rows ran on {' and '.join(kinds)}: a speedup divides times measured on the same "
            "kind of device; measure every world size alike (simlib.lessons.scaling.placement)"
        )
    refs = table[(table["world_size"] == 1) & table["baseline"].isna()]
    if refs.empty:
        raise ValueError("speedup needs the one-process reference: a row with world_size 1 and no baseline")
    ref = refs.iloc[0]
    if mode == "strong":  # same work: speedup = t1 / tN
        table["speedup"] = ref["step_time"] / table["step_time"]
        table["speedup_lo"] = ref["step_time"] / table["step_time_p75"]
        table["speedup_hi"] = ref["step_time"] / table["step_time_p25"]
    else:  # N times the work: speedup = throughput_N / throughput_1 ("scaled speedup")
        table["speedup"] = table["throughput"] / ref["throughput"]
        table["speedup_lo"] = table["speedup"] * table["step_time"] / table["step_time_p75"]
        table["speedup_hi"] = table["speedup"] * table["step_time"] / table["step_time_p25"]
    # efficiency = speedup / the cores a setup uses (processes x threads, against the reference's threads), so
    # "1 process x 2 threads" is judged on 2 cores, not on 1 process
    table["efficiency"] = table["speedup"] * ref["threads"] / (table["world_size"] * table["threads"])
    table["oversubscribed"] = table["world_size"] * table["threads"] > cores
    table.attrs.update(cores=cores, mode=mode)
    return table
