"""Planted wrong versions of lesson 09b's exercise: prefetching in ZeRO-3 (simlib.parallel.zero_prefetch)."""

from simlib.parallel.zero import _count, all_gather_shards
from simlib.parallel.zero_prefetch import Zero3Prefetch, issue_gather


class _Right(Zero3Prefetch):
    """Both hooks written right (the library's own refuse to run for an answer): each planted bug replaces one."""

    def on_forward(self, i):
        if i + 1 < len(self.blocks):
            for unit in self.blocks[i + 1]:
                issue_gather(unit)

    def on_backward(self, i):
        if i - 1 >= 0:
            for unit in self.blocks[i - 1]:
                issue_gather(unit)


class NoPrefetch(Zero3Prefetch):
    """Planted: the hooks do nothing (the plain Zero3 with counters)."""

    def on_forward(self, i):
        pass

    def on_backward(self, i):
        pass


class BackwardWrongWay(_Right):
    """Planted: backward prefetches the next block, as forward does (its backward is already done)."""

    def on_backward(self, i):
        if 0 <= i + 1 < len(self.blocks):
            for unit in self.blocks[i + 1]:
                issue_gather(unit)


class SkipsABlock(_Right):
    """Planted: forward prefetches two blocks ahead."""

    def on_forward(self, i):
        if i + 2 < len(self.blocks):
            for unit in self.blocks[i + 2]:
                issue_gather(unit)


class WrongShard(_Right):
    """Planted: the next block's buffer is filled with *this* block's shards (a copy-paste slip)."""

    def on_forward(self, i):
        if i + 1 < len(self.blocks) and i >= 0:
            for unit, mine in zip(self.blocks[i + 1], self.blocks[i]):
                if unit.gathered() or unit.work is not None:
                    continue
                unit.full.untyped_storage().resize_(unit.full.numel() * unit.full.element_size())
                _count(unit.comm_counter, "all_gather", unit.full)
                unit.work = all_gather_shards(unit.full, mine.shard.detach(), group=unit.group, async_op=True)


class GathersEverythingUpFront(Zero3Prefetch):
    """Planted (issue 33): the root starts every block's gather at once, forward and backward. The numbers are
    right and every block finds its gather in flight, but the whole model's parameters are alive on every rank."""

    def on_forward(self, i):
        if i == -1:
            for units in self.blocks:
                for unit in units:
                    issue_gather(unit)

    def on_backward(self, i):
        if i == len(self.blocks):
            for units in self.blocks:
                for unit in units:
                    issue_gather(unit)


class ClaimsItsCounts(NoPrefetch):
    """Planted (issue 33): no prefetch at all, but ``counts`` says what a prefetch of 2 steps would have counted."""

    @property
    def counts(self):
        blocks = sum(len(b) for b in getattr(self, "blocks", []))
        root = sum(1 for u in self.units if not u.name)
        return {"prefetched": 2 * 2 * blocks, "waited": 2 * 2 * root}

    @counts.setter
    def counts(self, value):
        pass


PLANTED = {
    "no prefetch": NoPrefetch,
    "backward prefetches the wrong way": BackwardWrongWay,
    "forward skips a block": SkipsABlock,
    "gathers this block's shard into the next": WrongShard,
    "gathers every block up front": GathersEverythingUpFront,
    "claims the counts of a prefetch": ClaimsItsCounts,
}
