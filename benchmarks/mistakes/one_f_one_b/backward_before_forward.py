"""Honest: in the steady state runs the backward before the forward of each pair, so a backward waits for a gradient whose forward has not run downstream yet (p = 3, m = 4)."""


def one_f_one_b_order(rank, num_stages, num_microbatches):
    warmup = min(num_stages - rank - 1, num_microbatches)
    order = [("forward", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("backward", i), ("forward", i + warmup)]
    order += [("backward", i) for i in range(num_microbatches - warmup, num_microbatches)]
    return order


ANSWER = one_f_one_b_order
KIND = "honest"
PROVE = {"stages": 3, "micro": 4}
