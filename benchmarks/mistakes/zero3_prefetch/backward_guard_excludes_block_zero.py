"""Honest: guards with i - 1 > 0: block 0 is never prefetched in backward and its gather is exposed."""

from simlib.parallel.zero_prefetch import Zero3Prefetch, issue_gather


class MyPrefetch(Zero3Prefetch):
    def on_forward(self, i):
        if i + 1 < len(self.blocks):
            for unit in self.blocks[i + 1]:
                issue_gather(unit)

    def on_backward(self, i):
        if i - 1 > 0:
            for unit in self.blocks[i - 1]:
                issue_gather(unit)


ANSWER = MyPrefetch
KIND = "honest"
PROVE = {"world_size": 2, "blocks": 3}
