"""Wrong answers to exercise 09b (ZeRO-3 prefetching)."""

from _common import answer

EXERCISE, NOTEBOOK = "zero3_prefetch", "09b_zero3_prefetch"


@answer("honest")
def gathers_the_current_block():
    """Honest: on_forward(i) gathers block i (already there) and on_backward(i) block i: nothing is prefetched."""
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

    return MyPrefetch


@answer("honest")
def backward_prefetches_the_forward_neighbour():
    """Honest: on_backward(i) gathers block i + 1, as in forward, though backward runs the blocks in reverse."""
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

    return MyPrefetch


@answer("honest")
def two_blocks_ahead():
    """Honest: prefetches two blocks ahead in both directions, thinking more prefetch hides more (one more block alive)."""
    from simlib.parallel.zero_prefetch import Zero3Prefetch, issue_gather

    class MyPrefetch(Zero3Prefetch):
        def on_forward(self, i):
            for j in (i + 1, i + 2):
                if 0 <= j < len(self.blocks):
                    for unit in self.blocks[j]:
                        issue_gather(unit)

        def on_backward(self, i):
            for j in (i - 1, i - 2):
                if 0 <= j < len(self.blocks):
                    for unit in self.blocks[j]:
                        issue_gather(unit)

    return MyPrefetch


@answer("deliberate")
def calls_the_library_hooks():
    """Deliberate: both hooks call super(), i.e. the course's own Zero3Prefetch.on_forward/on_backward."""
    from simlib.parallel.zero_prefetch import Zero3Prefetch

    class MyPrefetch(Zero3Prefetch):
        def on_forward(self, i):
            super().on_forward(i)

        def on_backward(self, i):
            super().on_backward(i)

    return MyPrefetch


@answer("deliberate")
def fakes_the_prefetch_counter():
    """Deliberate: no gather at all; bumps self.counts['prefetched'] for every unit of the next block instead."""
    from simlib.parallel.zero_prefetch import Zero3Prefetch

    class MyPrefetch(Zero3Prefetch):
        def on_forward(self, i):
            if i + 1 < len(self.blocks):
                self.counts["prefetched"] += len(self.blocks[i + 1])
                self.counts["waited"] = max(0, self.counts["waited"] - len(self.blocks[i + 1]))

        def on_backward(self, i):
            if i - 1 >= 0:
                self.counts["prefetched"] += len(self.blocks[i - 1])
                self.counts["waited"] = max(0, self.counts["waited"] - len(self.blocks[i - 1]))

    return MyPrefetch


@answer("deliberate")
def everything_up_front_unless_watched():
    """Deliberate: the right neighbour while a dispatch mode or profiler watches; every block's gather at once otherwise."""
    from _common import watched

    from simlib.parallel.zero_prefetch import Zero3Prefetch, issue_gather

    class MyPrefetch(Zero3Prefetch):
        def _gather(self, blocks):
            for j in blocks:
                if 0 <= j < len(self.blocks):
                    for unit in self.blocks[j]:
                        issue_gather(unit)

        def on_forward(self, i):
            self._gather([i + 1] if watched() else range(i + 1, len(self.blocks)))

        def on_backward(self, i):
            self._gather([i - 1] if watched() else range(i - 1, -1, -1))

    return MyPrefetch
