"""Tensor-parallel communication overlap, priced as partial: what stays exposed and what the GEMMs lose."""

from __future__ import annotations

from .layer import op_time


def tp_overlap_exposed(ops, times, exposed, hardware, strategy, processes=1):
    """(exposed collectives, GEMM slowdown) of a layer's op list under tensor-parallel communication overlap.

    Megatron-LM's ``--tp-comm-overlap`` (Transformer Engine userbuffers) and torchtitan's async TP split each
    sequence-parallel all-gather / reduce-scatter into tp chunks pipelined with the GEMM it feeds or follows
    (Wang et al. 2022, "Overlap communication with dependent computation via decomposition"). What stays
    exposed: the first chunk of an all-gather (or the last of a reduce-scatter), 1/tp of it, and whatever of the
    other chunks the GEMM is too short to hide; the GEMM itself runs slower while communication kernels share
    its SMs (:data:`TP_OVERLAP_GEMM_SLOWDOWN`, applied to the overlapped GEMMs). Collectives of other groups
    (cp, ep) are left as they were."""
    s = strategy
    gemm_at = [i for i, op in enumerate(ops) if op.kind == "gemm"]
    room = {i: op_time(ops[i], hardware, s, processes, s.threads) for i in gemm_at}  # GEMM time left to hide in
    out, slow = exposed, 0.0
    for i, (op, t) in enumerate(zip(ops, times)):
        if not (op.kind == "comm" and op.group == "tp" and op.collective in ("all_gather", "reduce_scatter")):
            continue
        after = [j for j in gemm_at if j > i]
        before = [j for j in gemm_at if j < i]
        # an all-gather feeds the GEMM after it, a reduce-scatter follows the GEMM before it
        pick = (after or before) if op.collective == "all_gather" else (before or after)
        if not pick:
            continue
        j = pick[0] if pick is after else pick[-1]
        chunks = t * (s.tp - 1) / s.tp
        hidden = min(chunks, room[j])
        room[j] -= hidden
        out -= hidden
        slow += hidden * TP_OVERLAP_GEMM_SLOWDOWN  # the GEMM runs slower while the chunks share its SMs
    return max(out, 0.0), slow


# A GEMM overlapped with TP communication runs slower: the communication kernels take SMs (and memory
# bandwidth) from it. Public measurements put it near 10 %: AG+GEMM overlap kernels ran at 0.885 and 0.923 of the
# plain GEMM's speed (ROCm/TransformerEngine PR 707, 2026, on AMD GPUs), and DeepEP's communication kernels take 20
# of an H800's 132 SMs from the GEMM beside them (deepseek-ai/DeepEP issue 61). Not fitted to any run.
TP_OVERLAP_GEMM_SLOWDOWN = 0.10
