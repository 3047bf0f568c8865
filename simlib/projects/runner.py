"""Run ``simlib.train.train`` on N local ranks and bring back the run record and rank 0's trained weights.

    record, state = train_on(2, DigitsTask(), Plan(dp=2, sync_batchnorm=True), steps=100, eval_every=25)

``cluster``: a warm ``simlib.Cluster`` of that size (later runs then cost no launch); else a fresh
``simlib.launch``. World size 1 with ``threads`` runs in the calling process's own thread count.
"""
from __future__ import annotations

__all__ = ["train_on", "load_state", "run_project", "PROJECTS"]


def _train_worker(task, plan, kwargs, threads):
    import torch

    from ..train import train
    if threads:
        torch.set_num_threads(threads)
    record = train(task, plan, **kwargs)
    import torch.distributed as dist
    rank = dist.get_rank() if dist.is_initialized() else 0
    state = None
    if rank == 0:
        state = {k: v.detach().cpu().clone() for k, v in record.model.module.state_dict().items()}
    return record, state


def train_on(world_size: int, task, plan, cluster=None, threads: int | None = None, timeout: float | None = None,
             **train_kwargs):
    """``train(task, plan, **train_kwargs)`` on ``world_size`` ranks -> (rank 0's RunRecord, its state_dict).
    ``timeout``: seconds a collective may wait for a peer on fresh workers (default simlib.launch's)."""
    from ..launch import launch

    plan.validate(world_size, task)  # the trainer's own check, here before any process starts (then remembered)
    if cluster is not None:
        if cluster.world_size != world_size:
            raise ValueError(f"the cluster has {cluster.world_size} ranks; this run needs {world_size}")
        outs = cluster.run(_train_worker, task, plan, train_kwargs, threads)
    else:
        kw = {"threads": threads} if threads else {}
        if timeout is not None:
            kw["timeout"] = timeout
        outs = launch(_train_worker, world_size, task, plan, train_kwargs, None, **kw)
    return outs[0]


def load_state(task, state):
    """A fresh model of ``task`` holding ``state`` (what :func:`train_on` brought back), ready to evaluate."""
    model = task.build_model()
    model.load_state_dict({k.replace("module.", "", 1) if k.startswith("module.") else k: v for k, v in state.items()})
    return model


# ---- the projects' standard runs (``simlib train <name>``, the notebooks, the benchmarks, grading) ----
def gpt_run(quick: bool = False) -> dict:
    """Task, budget, optimizer and target of the GPT project's standard run (``simlib.projects.gpt.run``)."""
    from .gpt.run import settings
    return settings(quick)


def vision_run(quick: bool = False) -> dict:
    """Task, step budget, optimizer and target of the vision project's standard run."""
    from ..train import OptimConfig
    from .vision import DigitsTask
    if quick:
        task, steps, every, target = DigitsTask(global_batch=64, image_size=12, width=8), 100, 20, 0.92
    else:
        task, steps, every, target = DigitsTask(global_batch=128, image_size=16, width=16), 300, 25, 0.97
    optim = OptimConfig(name="sgd", lr=0.1, momentum=0.9, weight_decay=5e-4, warmup_steps=steps // 20)
    return dict(task=task, steps=steps, optim=optim, eval_every=every, target={"accuracy": target})


def finance_run(quick: bool = False) -> dict:
    """Task, budget, optimizer and target (beat the Black-Scholes delta's held-out loss) of the finance run."""
    from ..train import OptimConfig
    from .finance import HedgingTask
    if quick:
        task, steps, every = HedgingTask(global_batch=256, days=20, hidden=16), 120, 30
    else:
        task, steps, every = HedgingTask(global_batch=512), 400, 50
    bs = task.evaluate_baseline()
    return dict(task=task, steps=steps, optim=OptimConfig(name="adamw", lr=3e-3, warmup_steps=steps // 20),
                eval_every=every, target={"eval_loss": bs["bs_rmse_sim"] ** 2})


PROJECTS = {"gpt": gpt_run, "vision": vision_run, "finance": finance_run}  # the one registry of projects


def run_project(name: str, world_size: int = 1, quick: bool = False, out_dir=None, threads: int | None = None,
                cluster=None, verbose: bool = True, timeout: float | None = None, **overrides):
    """The standard run of project ``name`` on ``world_size`` ranks (DP; SyncBatchNorm for vision)."""
    from ..train import Plan
    if name not in PROJECTS:
        raise ValueError(f"unknown project {name!r}: choose one of {sorted(PROJECTS)}")
    spec = {**PROJECTS[name](quick), **overrides}
    task = spec.pop("task")
    plan = spec.pop("plan", None) or Plan(dp=world_size, sync_batchnorm=(name == "vision" and world_size > 1))
    if world_size == 1 and cluster is None:
        import torch

        from ..train import train
        previous = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        try:
            record = train(task, plan, out_dir=out_dir, verbose=verbose, **spec)
        finally:
            torch.set_num_threads(previous)
        return record, {k: v.detach().clone() for k, v in record.model.module.state_dict().items()}
    return train_on(world_size, task, plan, cluster=cluster, threads=threads, out_dir=out_dir, verbose=verbose,
                    timeout=timeout, **spec)
