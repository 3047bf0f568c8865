"""Honest: guards with i + 1 <= len(self.blocks): at the last block it indexes self.blocks[len(blocks)], which does not exist (IndexError in forward)."""

from simlib.parallel.zero_prefetch import Zero3Prefetch, issue_gather


class MyPrefetch(Zero3Prefetch):
    def on_forward(self, i):
        if i + 1 <= len(self.blocks):
            for unit in self.blocks[i + 1]:
                issue_gather(unit)

    def on_backward(self, i):
        if i - 1 >= 0:
            for unit in self.blocks[i - 1]:
                issue_gather(unit)


ANSWER = MyPrefetch
KIND = "honest"
PROVE = {"world_size": 2, "blocks": 3}
