"""Honest: checkpoints the blocks that save the most bytes first until the rest fits: greedy on bytes ignores the FLOPs, so it can recompute an expensive block where two cheap ones would do. (the input in PROVE: solution (True, 19000000), this (True, 32000000))"""


def place_checkpoints(activation_bytes, input_bytes, recompute_flops, budget):
    n = len(activation_bytes)
    kept = sum(activation_bytes)
    order = sorted(range(n), key=lambda i: activation_bytes[i] - input_bytes[i], reverse=True)
    chosen = []
    for i in order:
        if kept <= budget:
            break
        chosen.append(i)
        kept -= activation_bytes[i] - input_bytes[i]
    return chosen


ANSWER = place_checkpoints
KIND = "honest"
PROVE = {
    "activation_bytes": [7168, 11264, 18432, 7168, 29696, 7168],
    "input_bytes": [1024, 1024, 3072, 1024, 2048, 2048],
    "recompute_flops": [5000000, 18000000, 4000000, 19000000, 10000000, 18000000],
    "budget": 33928,
}
