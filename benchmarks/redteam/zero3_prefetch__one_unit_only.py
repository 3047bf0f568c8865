# exercise: zero3_prefetch
# kind: honest
# mistake: prefetches only the first unit of the next block (self.blocks[i+1][0]) instead of all its units: the other kinds of parameters are still gathered on demand, exposed.
from simlib.parallel.zero_prefetch import Zero3Prefetch, issue_gather


class MyPrefetch(Zero3Prefetch):
    def on_forward(self, i):
        if i + 1 < len(self.blocks):
            issue_gather(self.blocks[i + 1][0])

    def on_backward(self, i):
        if i - 1 >= 0:
            issue_gather(self.blocks[i - 1][0])


ANSWER = MyPrefetch
