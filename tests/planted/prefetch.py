"""Planted wrong versions of lesson 09b's exercise: prefetching in ZeRO-3 (simlib.parallel.zero_prefetch)."""
from simlib.parallel.zero import _all_gather, _count
from simlib.parallel.zero_prefetch import Zero3Prefetch, issue_gather


class NoPrefetch(Zero3Prefetch):
    """Planted: the hooks do nothing (the plain Zero3 with counters)."""

    def on_forward(self, i):
        pass

    def on_backward(self, i):
        pass


class BackwardWrongWay(Zero3Prefetch):
    """Planted: backward prefetches the next block, as forward does (its backward is already done)."""

    def on_backward(self, i):
        if 0 <= i + 1 < len(self.blocks):
            for unit in self.blocks[i + 1]:
                issue_gather(unit)


class SkipsABlock(Zero3Prefetch):
    """Planted: forward prefetches two blocks ahead."""

    def on_forward(self, i):
        if i + 2 < len(self.blocks):
            for unit in self.blocks[i + 2]:
                issue_gather(unit)


class WrongShard(Zero3Prefetch):
    """Planted: the next block's buffer is filled with *this* block's shards (a copy-paste slip)."""

    def on_forward(self, i):
        if i + 1 < len(self.blocks) and i >= 0:
            for unit, mine in zip(self.blocks[i + 1], self.blocks[i]):
                if unit.gathered() or unit.work is not None:
                    continue
                unit.full.untyped_storage().resize_(unit.full.numel() * unit.full.element_size())
                _count(unit.comm_counter, "all_gather", unit.full)
                unit.work = _all_gather(unit.full, mine.shard.detach(), group=unit.group, async_op=True)


PLANTED = {"no prefetch": NoPrefetch, "backward prefetches the wrong way": BackwardWrongWay,
           "forward skips a block": SkipsABlock, "gathers this block's shard into the next": WrongShard}
