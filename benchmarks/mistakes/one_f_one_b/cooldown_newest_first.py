"""Honest: runs the cool-down backwards newest first (reversed), but gradients come back oldest first (p = 3, m = 4, rank 0: B3 B2 instead of B2 B3)."""


def one_f_one_b_order(rank, num_stages, num_microbatches):
    warmup = min(num_stages - rank - 1, num_microbatches)
    order = [("forward", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("forward", i + warmup), ("backward", i)]
    order += [("backward", i) for i in reversed(range(num_microbatches - warmup, num_microbatches))]
    return order


ANSWER = one_f_one_b_order
KIND = "honest"
PROVE = {"stages": 3, "micro": 4}
