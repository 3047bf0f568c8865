"""Deliberate: issues no gather at all and increments self.counts['prefetched'] for every unit of the next block instead (a counter the answer can reach)."""

from simlib.parallel.zero_prefetch import Zero3Prefetch


class MyPrefetch(Zero3Prefetch):
    def on_forward(self, i):
        if i + 1 < len(self.blocks):
            self.counts["prefetched"] += len(self.blocks[i + 1])

    def on_backward(self, i):
        if i - 1 >= 0:
            self.counts["prefetched"] += len(self.blocks[i - 1])


ANSWER = MyPrefetch
KIND = "deliberate"
PROVE = {"world_size": 2, "blocks": 3}
