"""Run ``simlib.train.train`` on N local ranks and bring back the run record and rank 0's trained weights.

    record, state = train_on(2, DigitsTask(), Plan(dp=2, sync_batchnorm=True), steps=100, eval_every=25)

``cluster``: a warm ``simlib.Cluster`` of that size (later runs then cost no launch); else a fresh
``simlib.launch``. World size 1 with ``threads`` runs in the calling process's own thread count.
"""

from __future__ import annotations

from .registry import PROJECTS, get

__all__ = ["train_on", "load_state", "run_project", "PROJECTS"]


def _train_worker(task, plan, kwargs, threads, train_fn=None):
    import torch

    from ..train import train

    if threads:
        torch.set_num_threads(threads)
    record = (train_fn or train)(task, plan, **kwargs)
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    state = record.__dict__.pop("unsplit_state", None)  # a project whose ranks hold parts (TP): the whole model's
    if rank == 0 and state is None:
        state = {k: v.detach().cpu().clone() for k, v in record.model.module.state_dict().items()}
    return record, state


def train_on(
    world_size: int,
    task,
    plan,
    cluster=None,
    threads: int | None = None,
    timeout: float | None = None,
    train_fn=None,
    **train_kwargs,
):
    """``train(task, plan, **train_kwargs)`` on ``world_size`` ranks -> (rank 0's RunRecord, its state_dict).
    ``timeout``: seconds a collective may wait for a peer on fresh workers (default simlib.launch's);
    ``train_fn``: what each rank runs in place of ``train`` (a project's ``train_rank``), same arguments."""
    from ..launch import launch

    plan.validate(world_size, task)  # the trainer's own check, here before any process starts (then remembered)
    if cluster is not None:
        if cluster.world_size != world_size:
            raise ValueError(f"the cluster has {cluster.world_size} ranks; this run needs {world_size}")
        outs = cluster.run(_train_worker, task, plan, train_kwargs, threads, train_fn)
    else:
        kw = {"threads": threads} if threads else {}
        if timeout is not None:
            kw["timeout"] = timeout
        outs = launch(_train_worker, world_size, task, plan, train_kwargs, None, train_fn, **kw)
    return outs[0]


def _train_here(train_fn, task, plan, threads, **train_kwargs):
    """One rank, in this process: with ``threads``, then everything as it was. The one-process group (and the
    RANK/WORLD_SIZE/MASTER_* variables that made it) goes when it was made here, so that a later ``simlib train``
    in this process does not take itself for a rank of a launcher's world."""
    import os

    import torch
    import torch.distributed as dist

    from .. import env

    keys = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
    saved, had_group = {k: os.environ.get(k) for k in keys}, dist.is_initialized()
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        record = train_fn(task, plan, **train_kwargs)
    finally:
        torch.set_num_threads(previous)
        if not had_group:
            env.shutdown()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    # on the CPU, as train_on's: a caller loads it into a CPU model whatever device trained it
    return record, {k: v.detach().cpu().clone() for k, v in record.model.module.state_dict().items()}


def load_state(task, state):
    """A fresh model of ``task`` holding ``state`` (what :func:`train_on` brought back), ready to evaluate."""
    model = task.build_model()
    model.load_state_dict({k.replace("module.", "", 1) if k.startswith("module.") else k: v for k, v in state.items()})
    return model


# ---- the projects' standard runs: registered once, in simlib.projects.registry ----
def gpt_run(quick: bool = False) -> dict:
    """The GPT project's standard run (``PROJECTS["gpt"](quick)``)."""
    return PROJECTS["gpt"](quick)


def vision_run(quick: bool = False) -> dict:
    """The vision project's standard run (``PROJECTS["vision"](quick)``)."""
    return PROJECTS["vision"](quick)


def finance_run(quick: bool = False) -> dict:
    """The finance project's standard run (``PROJECTS["finance"](quick)``)."""
    return PROJECTS["finance"](quick)


def project_settings(name: str, size: str = "full", world_size: int = 1) -> dict:
    """The standard run of project ``name`` at ``size``: "quick", "full" (the CPU sizes) or "gpu" (its dict adds
    ``plan``: the Plan fields that size needs, e.g. bf16); see :meth:`registry.Project.size`."""
    return get(name).size(size, world_size)


def run_project(
    name: str,
    world_size: int = 1,
    quick: bool = False,
    out_dir=None,
    threads: int | None = None,
    cluster=None,
    verbose: bool = True,
    timeout: float | None = None,
    size: str | None = None,
    **overrides,
):
    """The standard run of project ``name`` on ``world_size`` ranks (the plan: DP, with the project's
    ``plan_defaults``, e.g. SyncBatchNorm for vision), each rank running the project's ``train_rank``.
    ``size``: "quick", "full" or "gpu" (default: "quick" if ``quick`` else "full").
    ``overrides``: ``plan``, ``task``, ``optim`` or budget keywords in place of the standard run's; ``pieces``:
    the learner's code at the project's slots (:mod:`simlib.pieces`, the project's ``PIECES``)."""
    from ..plan import Plan

    project = get(name)
    defaults = project_settings(name, size or ("quick" if quick else "full"), world_size)
    fields = defaults.pop("plan", None) or {}
    defaults.pop("note", None)
    spec = {**defaults, **overrides}
    if "pieces" in spec:  # the learner's code at the project's slots: names checked here, before any process starts
        from ..pieces import check_pieces

        spec["pieces"] = check_pieces(spec["pieces"], project.pieces)
    task = spec.pop("task")
    plan = spec.pop("plan", None) or Plan(
        dp=world_size, **{**project.plan_defaults({"dp": world_size, **fields}), **fields}
    )
    train_fn = project.train_rank()
    if world_size == 1 and cluster is None:
        return _train_here(train_fn, task, plan, threads, out_dir=out_dir, verbose=verbose, **spec)
    return train_on(
        world_size,
        task,
        plan,
        cluster=cluster,
        threads=threads,
        out_dir=out_dir,
        verbose=verbose,
        timeout=timeout,
        train_fn=train_fn,
        **spec,
    )
