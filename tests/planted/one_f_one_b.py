"""Wrong 1F1B orders."""


def gpipe_order(rank, num_stages, num_microbatches):
    """All forwards, then all backwards: GPipe, not 1F1B."""
    m = num_microbatches
    return [("forward", i) for i in range(m)] + [("backward", i) for i in reversed(range(m))]


def warmup_off_by_one(rank, num_stages, num_microbatches):
    """Warm-up of p - rank forwards: one micro-batch too many in flight."""
    warmup = min(num_stages - rank, num_microbatches)
    order = [("forward", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("forward", i + warmup), ("backward", i)]
    return order + [("backward", i) for i in range(num_microbatches - warmup, num_microbatches)]


def warmup_from_the_wrong_end(rank, num_stages, num_microbatches):
    """Warm-up of `rank` forwards: rank 0 wants a gradient before any activation reached the last stage."""
    warmup = min(rank, num_microbatches)
    order = [("forward", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("forward", i + warmup), ("backward", i)]
    return order + [("backward", i) for i in range(num_microbatches - warmup, num_microbatches)]


def cooldown_newest_first(rank, num_stages, num_microbatches):
    """The cool-down backwards run newest first."""
    warmup = min(num_stages - rank - 1, num_microbatches)
    order = [("forward", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("forward", i + warmup), ("backward", i)]
    return order + [("backward", i) for i in reversed(range(num_microbatches - warmup, num_microbatches))]


def forgets_the_last_backward(rank, num_stages, num_microbatches):
    warmup = min(num_stages - rank - 1, num_microbatches)
    order = [("forward", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("forward", i + warmup), ("backward", i)]
    return order + [("backward", i) for i in range(num_microbatches - warmup, num_microbatches - 1)]


PLANTED = [gpipe_order, warmup_off_by_one, warmup_from_the_wrong_end, cooldown_newest_first, forgets_the_last_backward]
