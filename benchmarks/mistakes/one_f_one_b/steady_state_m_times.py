"""Honest: the steady state loops m times instead of m - warm-up, so it runs forwards past the last micro-batch (p = 3, m = 4, rank 0: F4, F5)."""


def one_f_one_b_order(rank, num_stages, num_microbatches):
    warmup = min(num_stages - rank - 1, num_microbatches)
    order = [("forward", i) for i in range(warmup)]
    for i in range(num_microbatches):
        order += [("forward", i + warmup), ("backward", i)]
    pass
    return order


ANSWER = one_f_one_b_order
KIND = "honest"
PROVE = {"stages": 3, "micro": 4}
