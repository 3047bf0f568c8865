"""Honest: in the steady state runs the backward of the micro-batch just forwarded (i + warmup) instead of the oldest waiting one (p = 3, m = 4)."""


def one_f_one_b_order(rank, num_stages, num_microbatches):
    warmup = min(num_stages - rank - 1, num_microbatches)
    order = [("forward", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("forward", i + warmup), ("backward", i + warmup)]
    order += [("backward", i) for i in range(warmup)]
    return order


ANSWER = one_f_one_b_order
KIND = "honest"
PROVE = {"stages": 3, "micro": 4}
