# exercise: zero3_prefetch
# kind: fool
# mistake: at the root hook (i = -1 forward, i = len backward) starts the all-gather of EVERY block: everything arrives prefetched, but all blocks' full parameters are resident at once (ZeRO-3's memory saving gone).
from simlib.parallel.zero_prefetch import Zero3Prefetch, issue_gather


class MyPrefetch(Zero3Prefetch):
    def on_forward(self, i):
        for block in self.blocks[i + 1 :]:
            for unit in block:
                issue_gather(unit)

    def on_backward(self, i):
        for block in self.blocks[:i]:
            for unit in block:
                issue_gather(unit)


ANSWER = MyPrefetch
