# exercise: checkpoint_placement
# kind: honest
# mistake: greedy: checkpoint blocks in order of bytes saved per recompute FLOP until the budget fits; fits the budget but is not the minimum-recompute choice in general.
def place_checkpoints(activation_bytes, input_bytes, recompute_flops, budget):
    n = len(activation_bytes)
    kept = sum(activation_bytes)
    order = sorted(range(n), key=lambda i: -(activation_bytes[i] - input_bytes[i]) / max(recompute_flops[i], 1))
    chosen = []
    for i in order:
        if kept <= budget:
            break
        chosen.append(i)
        kept -= activation_bytes[i] - input_bytes[i]
    return sorted(chosen)


ANSWER = place_checkpoints
