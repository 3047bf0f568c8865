"""Honest: numbers micro-batches from 1 to m as in the lesson's figure, but micro-batch indices start at 0 (p = 2, m = 3: F1..F3)."""


def one_f_one_b_order(rank, num_stages, num_microbatches):
    warmup = min(num_stages - rank - 1, num_microbatches)
    order = [("forward", i) for i in range(1, warmup + 1)]
    for i in range(1, num_microbatches - warmup + 1):
        order += [("forward", i + warmup), ("backward", i)]
    order += [("backward", i) for i in range(num_microbatches - warmup + 1, num_microbatches + 1)]
    return order


ANSWER = one_f_one_b_order
KIND = "honest"
PROVE = {"stages": 2, "micro": 3}
