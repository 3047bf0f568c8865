"""Honest: warm-up of p - r forwards (the '- 1' forgotten): one micro-batch too many in flight on every rank, and the last stage does a forward ahead (p = 4, m = 8)."""


def one_f_one_b_order(rank, num_stages, num_microbatches):
    warmup = min(num_stages - rank, num_microbatches)
    order = [("forward", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("forward", i + warmup), ("backward", i)]
    order += [("backward", i) for i in range(num_microbatches - warmup, num_microbatches)]
    return order


ANSWER = one_f_one_b_order
KIND = "honest"
PROVE = {"stages": 4, "micro": 8}
