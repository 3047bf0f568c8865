# exercise: ring_attention
# kind: fool
# mistake: does not write the algorithm: imports and calls the library's own ring attention (simlib.parallel.context.ring_attention), the grader's likely reference.
from simlib.parallel.context import ring_attention as _library_ring_attention


def ring_attention(q, k, v, causal):
    return _library_ring_attention(q, k, v, causal=causal)


ANSWER = ring_attention
