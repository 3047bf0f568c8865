# exercise: checkpoint_placement
# kind: honest
# mistake: brute force, but minimises the bytes kept (not the recompute FLOPs) among the choices under the budget: fits, recomputes too much.
from itertools import combinations


def place_checkpoints(activation_bytes, input_bytes, recompute_flops, budget):
    n = len(activation_bytes)
    best = None
    for k in range(n + 1):
        for chosen in combinations(range(n), k):
            kept = sum(input_bytes[i] if i in chosen else activation_bytes[i] for i in range(n))
            if kept <= budget and (best is None or kept < best[0]):
                best = (kept, list(chosen))
    return best[1] if best else list(range(n))


ANSWER = place_checkpoints
