"""Honest: returns early for i = len(self.blocks) ('not a real block'): the root's backward hook is what prefetches the last block, so its backward gather is exposed."""

from simlib.parallel.zero_prefetch import Zero3Prefetch, issue_gather


class MyPrefetch(Zero3Prefetch):
    def on_forward(self, i):
        if i + 1 < len(self.blocks):
            for unit in self.blocks[i + 1]:
                issue_gather(unit)

    def on_backward(self, i):
        if i >= len(self.blocks):
            return
        if i - 1 >= 0:
            for unit in self.blocks[i - 1]:
                issue_gather(unit)


ANSWER = MyPrefetch
KIND = "honest"
PROVE = {"world_size": 2, "blocks": 3}
