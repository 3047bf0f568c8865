"""Honest: warm-up of max(1, p - r - 1) forwards ('every stage warms up at least once'): the last stage runs two forwards before its first backward and holds one micro-batch more (p = 3, m = 4, rank 2)."""


def one_f_one_b_order(rank, num_stages, num_microbatches):
    warmup = min(max(1, num_stages - rank - 1), num_microbatches)
    order = [("forward", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("forward", i + warmup), ("backward", i)]
    order += [("backward", i) for i in range(num_microbatches - warmup, num_microbatches)]
    return order


ANSWER = one_f_one_b_order
KIND = "honest"
PROVE = {"stages": 3, "micro": 4}
