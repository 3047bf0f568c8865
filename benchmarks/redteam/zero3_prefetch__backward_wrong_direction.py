# exercise: zero3_prefetch
# kind: honest
# mistake: backward prefetches block i + 1 (forward's direction) instead of i - 1: in backward nothing useful is prefetched, every backward all-gather is exposed.
from simlib.parallel.zero_prefetch import Zero3Prefetch, issue_gather


class MyPrefetch(Zero3Prefetch):
    def on_forward(self, i):
        if i + 1 < len(self.blocks):
            for unit in self.blocks[i + 1]:
                issue_gather(unit)

    def on_backward(self, i):
        if i + 1 < len(self.blocks):
            for unit in self.blocks[i + 1]:
                issue_gather(unit)


ANSWER = MyPrefetch
