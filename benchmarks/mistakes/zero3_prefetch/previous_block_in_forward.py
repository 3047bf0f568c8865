"""Honest: on_forward(i) gathers block i - 1 (the block just used, 'keep it around'): forward prefetches nothing useful and gathers a finished block again."""

from simlib.parallel.zero_prefetch import Zero3Prefetch, issue_gather


class MyPrefetch(Zero3Prefetch):
    def on_forward(self, i):
        if i - 1 >= 0:
            for unit in self.blocks[i - 1]:
                issue_gather(unit)

    def on_backward(self, i):
        if i - 1 >= 0:
            for unit in self.blocks[i - 1]:
                issue_gather(unit)


ANSWER = MyPrefetch
KIND = "honest"
PROVE = {"world_size": 2, "blocks": 3}
