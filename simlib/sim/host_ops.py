"""The host's cost per eager operator: what a CPU box pays for every op simlib's GPT dispatches.

On a CPU each aten op, however small, costs the host its dispatch and autograd bookkeeping (calibrate measures it:
``kernels["block_op"]``, a GPT block's own ops timed as a throughput, :func:`simlib.sim.kernels.block_op_time`; about
6 µs alone here, 12–16 with 4 ranks on the 2 cores, 27–30 with 8). A
micro-batch of a small model is made of hundreds of them, so a plan that splits the batch into more micro-batches
pays that cost once more per micro-batch. The op counts are simlib's GPT block's, counted with PyTorch's
TorchDispatchMode (``tests/test_sim_host_ops.py`` counts them again); a GPU preset measured none: 0 there.
"""

from __future__ import annotations

from .ring_comm import _measured

GPT_OPS_PER_LAYER = (28, 65)  # aten ops of one block of simlib's GPT: forward, backward
GPT_OPS_ENDS = (14, 23)  # the embedding, the final norm, the head and the loss: forward, backward


def host_op_time(hardware, processes) -> float:
    """Seconds the host spends on one eager op of a GPT block where calibrate() measured it (``kernels["block_op"]``:
    the block's own ops, :func:`simlib.sim.kernels.block_op_time`; else ``kernels["op"]``, a 4×4 multiply's), else 0."""
    measured = _measured(hardware, processes)
    return measured.get("block_op") or measured.get("op") or 0.0
