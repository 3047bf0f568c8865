"""Honest: returns 1-based block numbers as in the lesson's figure ('block 1 is the first'): index n does not exist and every other index names the wrong block. (the input in PROVE: solution (True, 54000000), this bad index)"""

from itertools import combinations


def place_checkpoints(activation_bytes, input_bytes, recompute_flops, budget):
    n = len(activation_bytes)
    best = None
    for k in range(n + 1):
        for chosen in combinations(range(n), k):
            kept = sum(input_bytes[i] if i in chosen else activation_bytes[i] for i in range(n))
            cost = sum(recompute_flops[i] for i in chosen)
            if kept <= budget and (best is None or cost < best[0]):
                best = (cost, list(chosen))
    return [i + 1 for i in best[1]] if best else list(range(1, n + 1))


ANSWER = place_checkpoints
KIND = "honest"
PROVE = {
    "activation_bytes": [23552, 23552, 37888, 17408, 22528, 32768],
    "input_bytes": [3072, 3072, 1024, 2048, 2048, 1024],
    "recompute_flops": [9000000, 2000000, 1000000, 1000000, 24000000, 17000000],
    "budget": 18432,
}
