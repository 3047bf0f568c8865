"""Wrong answers to exercise 07 (where to put activation checkpoints under a memory budget)."""

from _common import answer

EXERCISE, NOTEBOOK = "checkpoint_placement", "07_checkpoint_placement"


@answer("honest")
def greedy_by_bytes_saved_per_flop():
    """Honest: greedy, checkpointing the blocks that save the most bytes per recomputed FLOP until the budget is met."""

    def place_checkpoints(activation_bytes, input_bytes, recompute_flops, budget):
        n = len(activation_bytes)
        kept = sum(activation_bytes)
        chosen = []
        gain = lambda i: (activation_bytes[i] - input_bytes[i]) / max(recompute_flops[i], 1)  # noqa: E731
        for i in sorted(range(n), key=gain, reverse=True):
            if kept <= budget:
                break
            chosen.append(i)
            kept -= activation_bytes[i] - input_bytes[i]
        return sorted(chosen)

    return place_checkpoints


@answer("honest")
def checkpointed_block_keeps_nothing():
    """Honest: forgets that a checkpointed block still keeps its input (counts it as 0 bytes)."""
    from itertools import combinations

    def place_checkpoints(activation_bytes, input_bytes, recompute_flops, budget):
        n = len(activation_bytes)
        best = None
        for k in range(n + 1):
            for chosen in combinations(range(n), k):
                kept = sum(activation_bytes[i] for i in range(n) if i not in chosen)
                cost = sum(recompute_flops[i] for i in chosen)
                if kept <= budget and (best is None or cost < best[0]):
                    best = (cost, list(chosen))
        return best[1] if best else list(range(n))

    return place_checkpoints


@answer("honest")
def everything_when_over_budget():
    """Honest: the safe shortcut: checkpoint every block when the whole set does not fit, none when it does."""

    def place_checkpoints(activation_bytes, input_bytes, recompute_flops, budget):
        return [] if sum(activation_bytes) <= budget else list(range(len(activation_bytes)))

    return place_checkpoints


@answer("deliberate")
def list_that_claims_every_block():
    """Deliberate: returns an empty list (zero recompute FLOPs) whose `in` says every block is checkpointed."""

    class Everything(list):
        def __contains__(self, item):
            return True

    def place_checkpoints(activation_bytes, input_bytes, recompute_flops, budget):
        return Everything()

    return place_checkpoints


@answer("deliberate")
def table_of_the_printed_budgets():
    """Deliberate: a table of the budgets and blocks the check prints (read off its output); the empty set otherwise."""
    seen = {
        112_640: [],
        90_113: [1],
        83_969: [4],
        61_441: [1, 4],
        90_112: [1],
        83_968: [4],
        61_440: [1, 4],
        50_688: [1, 2, 4],
        12_288: [0, 1, 2, 3, 4, 5],
    }

    def place_checkpoints(activation_bytes, input_bytes, recompute_flops, budget):
        return list(seen.get(int(budget), []))

    return place_checkpoints
