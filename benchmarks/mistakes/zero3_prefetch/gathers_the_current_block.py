"""Honest: on_forward(i) and on_backward(i) gather block i, which is already there (the hook runs once its parameters arrived): nothing is ever prefetched."""

from simlib.parallel.zero_prefetch import Zero3Prefetch, issue_gather


class MyPrefetch(Zero3Prefetch):
    def on_forward(self, i):
        if 0 <= i < len(self.blocks):
            for unit in self.blocks[i]:
                issue_gather(unit)

    def on_backward(self, i):
        if 0 <= i < len(self.blocks):
            for unit in self.blocks[i]:
                issue_gather(unit)


ANSWER = MyPrefetch
KIND = "honest"
PROVE = {"world_size": 2, "blocks": 3}
