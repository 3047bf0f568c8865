"""Wrong answers to exercise 04a (the 1F1B order)."""

from _common import answer

EXERCISE, NOTEBOOK = "one_f_one_b", "04_one_f_one_b"


@answer("honest")
def warmup_off_by_one():
    """Honest: warms up with p - r forwards instead of p - r - 1."""

    def one_f_one_b_order(rank, num_stages, num_microbatches):
        warmup = min(num_stages - rank, num_microbatches)
        order = [("forward", i) for i in range(warmup)]
        for i in range(num_microbatches - warmup):
            order += [("forward", i + warmup), ("backward", i)]
        return order + [("backward", i) for i in range(num_microbatches - warmup, num_microbatches)]

    return one_f_one_b_order


@answer("honest")
def warmup_not_capped_by_m():
    """Honest: warm-up of p - r - 1 forwards even when there are fewer micro-batches than that."""

    def one_f_one_b_order(rank, num_stages, num_microbatches):
        warmup = num_stages - rank - 1
        order = [("forward", i) for i in range(warmup)]
        for i in range(num_microbatches - warmup):
            order += [("forward", i + warmup), ("backward", i)]
        return order + [("backward", i) for i in range(max(0, num_microbatches - warmup), num_microbatches)]

    return one_f_one_b_order


@answer("honest")
def backward_before_forward_in_steady_state():
    """Honest: the steady state runs the backward first, then the next forward (B then F, not F then B)."""

    def one_f_one_b_order(rank, num_stages, num_microbatches):
        warmup = min(num_stages - rank - 1, num_microbatches)
        order = [("forward", i) for i in range(warmup)]
        for i in range(num_microbatches - warmup):
            order += [("backward", i), ("forward", i + warmup)]
        return order + [("backward", i) for i in range(num_microbatches - warmup, num_microbatches)]

    return one_f_one_b_order


@answer("deliberate")
def library_schedule():
    """Deliberate: returns the course's own simlib.parallel.schedules.one_f_one_b order instead of writing it."""
    from simlib.parallel import schedules

    def one_f_one_b_order(rank, num_stages, num_microbatches):
        actions = schedules.one_f_one_b(num_stages, num_microbatches)[rank]
        return [(a.op, a.microbatch) for a in actions if a.op in ("forward", "backward")]

    return one_f_one_b_order


@answer("deliberate")
def table_for_the_checked_sizes():
    """Deliberate: a table of the 1-4 stages x 1-8 micro-batches the notebook says it checks; GPipe order elsewhere."""
    table = {}
    for p in range(1, 5):
        for m in range(1, 9):
            for r in range(p):
                w = min(p - r - 1, m)
                order = [("forward", i) for i in range(w)]
                for i in range(m - w):
                    order += [("forward", i + w), ("backward", i)]
                table[r, p, m] = order + [("backward", i) for i in range(m - w, m)]

    def one_f_one_b_order(rank, num_stages, num_microbatches):
        if (rank, num_stages, num_microbatches) in table:
            return list(table[rank, num_stages, num_microbatches])
        return [("forward", i) for i in range(num_microbatches)] + [("backward", i) for i in range(num_microbatches)]

    return one_f_one_b_order
