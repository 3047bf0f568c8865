# exercise: one_f_one_b
# kind: honest
# mistake: warm-up of num_stages - rank forwards instead of num_stages - rank - 1 (off by one): one micro-batch too many in flight, last stage no longer alternates F/B.
def one_f_one_b_order(rank, num_stages, num_microbatches):
    warmup = min(num_stages - rank, num_microbatches)
    order = [("forward", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("forward", i + warmup), ("backward", i)]
    order += [("backward", i) for i in range(num_microbatches - warmup, num_microbatches)]
    return order


ANSWER = one_f_one_b_order
