"""Honest: on_backward(i) gathers block i itself, whose backward is about to start: the gather is issued and waited for at once, nothing is hidden in backward."""

from simlib.parallel.zero_prefetch import Zero3Prefetch, issue_gather


class MyPrefetch(Zero3Prefetch):
    def on_forward(self, i):
        if i + 1 < len(self.blocks):
            for unit in self.blocks[i + 1]:
                issue_gather(unit)

    def on_backward(self, i):
        if 0 <= i < len(self.blocks):
            for unit in self.blocks[i]:
                issue_gather(unit)


ANSWER = MyPrefetch
KIND = "honest"
PROVE = {"world_size": 2, "blocks": 3}
