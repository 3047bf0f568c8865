# exercise: checkpoint_placement
# kind: fool
# mistake: checkpoints every block whatever the budget: always fits, but recomputes far more than needed (and needlessly when everything fits).
def place_checkpoints(activation_bytes, input_bytes, recompute_flops, budget):
    return list(range(len(activation_bytes)))


ANSWER = place_checkpoints
