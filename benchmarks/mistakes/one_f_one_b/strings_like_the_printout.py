"""Honest: returns strings like 'F0' and 'B0' (the format the look-at-it cell prints), not ('forward', 0) pairs (p = 2, m = 2)."""


def one_f_one_b_order(rank, num_stages, num_microbatches):
    warmup = min(num_stages - rank - 1, num_microbatches)
    order = [f"F{i}" for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [f"F{i + warmup}", f"B{i}"]
    order += [f"B{i}" for i in range(num_microbatches - warmup, num_microbatches)]
    return order


ANSWER = one_f_one_b_order
KIND = "honest"
PROVE = {"stages": 2, "micro": 2}
