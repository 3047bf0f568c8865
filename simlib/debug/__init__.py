"""Tools for when a distributed run misbehaves (lesson 09b).

- :mod:`simlib.debug.hangs`   the hang finder: each rank's sequence of collectives, and where they part
  (:mod:`~simlib.debug.divergence` reads the logs and writes the report, :mod:`~simlib.debug.stacks` asks a
  silent rank for its Python stack before it is stopped)
- :mod:`simlib.debug.trace`   torch.profiler on every rank, merged into one Chrome/Perfetto trace
- :mod:`simlib.debug.parity`  loss parity between two plans, with tolerance bands from summation order
- :mod:`simlib.debug.memory`  the peak memory of a whole training step, by kind (the loop's ``StepMemory`` hook)
- :mod:`simlib.debug.mfu`     model FLOPs of the GPT, checked against torch's FLOP counter; MFU with a stated peak
"""

from .. import hooks

# the core calls these through simlib.hooks (it never imports simlib.debug: the tools use the core, not the reverse)
hooks.plug("hang_finder", f"{__name__}.hangs")
hooks.plug("peaks", f"{__name__}.mfu")
