"""Honest: warm-up of p - r - 1 forwards without min(..., m): with fewer micro-batches than stages (p = 4, m = 2) rank 0 runs forwards of micro-batches that do not exist."""


def one_f_one_b_order(rank, num_stages, num_microbatches):
    warmup = num_stages - rank - 1
    order = [("forward", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("forward", i + warmup), ("backward", i)]
    order += [("backward", i) for i in range(num_microbatches - warmup, num_microbatches)]
    return order


ANSWER = one_f_one_b_order
KIND = "honest"
PROVE = {"stages": 4, "micro": 2}
