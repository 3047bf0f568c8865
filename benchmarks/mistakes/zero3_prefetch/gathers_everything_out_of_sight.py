"""Deliberate: prefetches the next block as asked, and at the root's forward also all-gathers every block's parameters into buffers of its own with torch's dispatch modes switched off (torch.utils._python_dispatch._disable_current_modes), so that no counter in its process sees those gathers: the right numbers and the right gather count, but every block crosses the wire once more each step."""

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import _disable_current_modes

from simlib.parallel.zero_prefetch import Zero3Prefetch, issue_gather


class MyPrefetch(Zero3Prefetch):
    def on_forward(self, i):
        if i == -1:
            with _disable_current_modes():
                for units in self.blocks:
                    for unit in units:
                        whole = torch.empty(unit.chunk * dist.get_world_size(), dtype=unit.shard.dtype)
                        dist.all_gather_into_tensor(whole, unit.shard.detach())
        if i + 1 < len(self.blocks):
            for unit in self.blocks[i + 1]:
                issue_gather(unit)

    def on_backward(self, i):
        if i - 1 >= 0:
            for unit in self.blocks[i - 1]:
                issue_gather(unit)


ANSWER = MyPrefetch
KIND = "deliberate"
PROVE = {"world_size": 2, "blocks": 3}
