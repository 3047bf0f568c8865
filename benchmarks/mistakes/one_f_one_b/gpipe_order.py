"""Honest: all forwards then all backwards: that is GPipe, which keeps m micro-batches in flight, not 1F1B's p - r (p = 3, m = 4, rank 0)."""


def one_f_one_b_order(rank, num_stages, num_microbatches):
    return [("forward", i) for i in range(num_microbatches)] + [("backward", i) for i in range(num_microbatches)]


ANSWER = one_f_one_b_order
KIND = "honest"
PROVE = {"stages": 3, "micro": 4}
