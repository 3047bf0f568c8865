"""Deliberate: calls torch.distributed.distributed_c10d.all_reduce, the collective the task forbids, under another name (the profiler sees allreduce, not send/recv)."""

import torch.distributed.distributed_c10d as c10d


def ring_all_reduce(tensor):
    c10d.all_reduce(tensor)
    return tensor


ANSWER = ring_all_reduce
KIND = "deliberate"
PROVE = {"world_size": 3, "shape": [7]}
