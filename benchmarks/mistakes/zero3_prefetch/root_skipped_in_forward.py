"""Honest: returns early for i = -1 ('the root is not a block'): the root's hook is the one that should start block 0's gather, so block 0 waits from scratch."""

from simlib.parallel.zero_prefetch import Zero3Prefetch, issue_gather


class MyPrefetch(Zero3Prefetch):
    def on_forward(self, i):
        if i < 0:
            return
        if i + 1 < len(self.blocks):
            for unit in self.blocks[i + 1]:
                issue_gather(unit)

    def on_backward(self, i):
        if i - 1 >= 0:
            for unit in self.blocks[i - 1]:
                issue_gather(unit)


ANSWER = MyPrefetch
KIND = "honest"
PROVE = {"world_size": 2, "blocks": 3}
