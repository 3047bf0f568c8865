"""Honest: warm-up of r forwards instead of p - r - 1 (the stages counted from the wrong end): the last stage waits longest, the first not at all (p = 3, m = 4)."""


def one_f_one_b_order(rank, num_stages, num_microbatches):
    warmup = min(rank, num_microbatches)
    order = [("forward", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("forward", i + warmup), ("backward", i)]
    order += [("backward", i) for i in range(num_microbatches - warmup, num_microbatches)]
    return order


ANSWER = one_f_one_b_order
KIND = "honest"
PROVE = {"stages": 3, "micro": 4}
