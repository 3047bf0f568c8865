# exercise: one_f_one_b
# kind: honest
# mistake: warm-up not capped by the number of micro-batches: with m < p - rank - 1 it emits forwards of micro-batches that do not exist (and backwards of negative ones are skipped).
def one_f_one_b_order(rank, num_stages, num_microbatches):
    warmup = num_stages - rank - 1
    order = [("forward", i) for i in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("forward", i + warmup), ("backward", i)]
    order += [("backward", i) for i in range(max(0, num_microbatches - warmup), num_microbatches)]
    return order


ANSWER = one_f_one_b_order
