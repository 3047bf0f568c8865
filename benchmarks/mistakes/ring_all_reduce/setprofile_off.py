"""Deliberate: turns off any profile/trace hook with sys.setprofile(None) and sys.settrace(None), then calls dist.all_reduce (the profiler, below Python, still sees an allreduce)."""

import sys

import torch.distributed as dist


def ring_all_reduce(tensor):
    sys.setprofile(None)
    sys.settrace(None)
    dist.all_reduce(tensor)
    return tensor


ANSWER = ring_all_reduce
KIND = "deliberate"
PROVE = {"world_size": 2, "shape": [6]}
