"""Run ``simlib.train.train`` on N local ranks and bring back the run record and rank 0's trained weights.

    record, state = train_on(2, DigitsTask(), Plan(dp=2, sync_batchnorm=True), steps=100, eval_every=25)

``cluster``: a warm ``simlib.Cluster`` of that size (later runs then cost no launch); else a fresh
``simlib.launch``. World size 1 with ``threads`` runs in the calling process's own thread count.
"""
from __future__ import annotations

__all__ = ["train_on", "load_state"]


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


def train_on(world_size: int, task, plan, cluster=None, threads: int | None = None, **train_kwargs):
    """``train(task, plan, **train_kwargs)`` on ``world_size`` ranks -> (rank 0's RunRecord, its state_dict)."""
    from ..launch import launch

    if plan.world_size != world_size:
        raise ValueError(f"plan {plan.label!r} needs {plan.world_size} ranks, not {world_size}")
    if cluster is not None:
        if cluster.world_size != world_size:
            raise ValueError(f"the cluster has {cluster.world_size} ranks; this run needs {world_size}")
        outs = cluster.run(_train_worker, task, plan, train_kwargs, threads)
    else:
        kw = {"threads": threads} if threads else {}
        outs = launch(_train_worker, world_size, task, plan, train_kwargs, None, **kw)
    return outs[0]


def load_state(task, state):
    """A fresh model of ``task`` holding ``state`` (what :func:`train_on` brought back), ready to evaluate."""
    model = task.build_model()
    model.load_state_dict({k.replace("module.", "", 1) if k.startswith("module.") else k: v for k, v in state.items()})
    return model
