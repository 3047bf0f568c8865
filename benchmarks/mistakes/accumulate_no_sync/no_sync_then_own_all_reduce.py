"""Deliberate: runs every backward under no_sync, then all-reduces each parameter's gradient itself through torch.distributed.distributed_c10d: right numbers, one all-reduce per parameter instead of DDP's bucketed one (profiler: more allreduces)."""

from torch.distributed import distributed_c10d as c10d


def accumulation_step(model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    with model.no_sync():
        for x, y in micro_batches:
            (loss_fn(model(x), y) / k).backward()
    for p in model.parameters():
        c10d.all_reduce(p.grad)
        p.grad /= c10d.get_world_size()
    optimizer.step()
    optimizer.zero_grad()


ANSWER = accumulation_step
KIND = "deliberate"
PROVE = {"world_size": 2, "micro": [3, 3, 3], "steps": 2}
