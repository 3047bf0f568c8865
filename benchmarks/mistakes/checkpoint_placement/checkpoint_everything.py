"""Deliberate: checkpoints every block whatever the budget: it always fits when anything does, and recomputes every FLOP there is."""


def place_checkpoints(activation_bytes, input_bytes, recompute_flops, budget):
    return list(range(len(activation_bytes)))


ANSWER = place_checkpoints
KIND = "deliberate"
PROVE = {
    "activation_bytes": [40960, 8192, 20480, 12288, 30720, 16384],
    "input_bytes": [2048, 1024, 3072, 1024, 2048, 1024],
    "recompute_flops": [9000000, 2000000, 5000000, 3000000, 7000000, 4000000],
    "budget": 60000,
}
