# exercise: one_f_one_b
# kind: honest
# mistake: GPipe's order (all forwards, then all backwards): valid and deadlock-free, but m micro-batches in flight instead of p - rank.
def one_f_one_b_order(rank, num_stages, num_microbatches):
    return [("forward", i) for i in range(num_microbatches)] + [("backward", i) for i in range(num_microbatches)]


ANSWER = one_f_one_b_order
