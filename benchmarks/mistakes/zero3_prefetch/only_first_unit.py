"""Honest: prefetches only self.blocks[i + 1][0] (the block's first unit), forgetting a block has one unit per kind of parameter: the other units wait from scratch."""

from simlib.parallel.zero_prefetch import Zero3Prefetch, issue_gather


class MyPrefetch(Zero3Prefetch):
    def on_forward(self, i):
        if i + 1 < len(self.blocks):
            issue_gather(self.blocks[i + 1][0])

    def on_backward(self, i):
        if i - 1 >= 0:
            issue_gather(self.blocks[i - 1][0])


ANSWER = MyPrefetch
KIND = "honest"
PROVE = {"world_size": 2, "blocks": 3}
