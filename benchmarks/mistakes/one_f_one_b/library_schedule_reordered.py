"""Deliberate: asks simlib's own schedules.gpipe for the actions and reorders nothing: GPipe's order from the library, not 1F1B (p = 3, m = 4)."""

from simlib.parallel import schedules


def one_f_one_b_order(rank, num_stages, num_microbatches):
    return [a for a in schedules.gpipe(rank, num_stages, num_microbatches) if a[0] in ("forward", "backward")]


ANSWER = one_f_one_b_order
KIND = "deliberate"
PROVE = {"stages": 3, "micro": 4}
