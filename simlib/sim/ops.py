"""The operator a layer is made of (:class:`Op`) and the GEMMs' backward rule: shared by :mod:`simlib.sim.layer`
and :mod:`simlib.sim.cluster_ops`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    """One operator of a layer on one tensor-parallel rank: a GEMM ``(m, k, n)`` repeated ``count`` times, a
    memory-bound kernel moving ``bytes``, or a collective of ``bytes`` (``collective``: all_reduce, ...)."""

    name: str
    kind: str  # "gemm" | "memory" | "comm" | "attention" (a fused FlashAttention kernel)
    bytes: float  # memory traffic (gemm, memory) or message size (comm), all counts together
    shape: tuple = ()  # gemm: (m, k, n)
    count: int = 1  # gemm: how many such GEMMs (batched attention: micro_batch × heads per rank)
    collective: str = ""  # comm: all_reduce | reduce_scatter | all_gather | all_to_all | p2p
    group: str = "tp"  # comm: the group of the rank grid it runs on (tp, cp, ep; see topology)
    overlap: str = ""  # comm: "attention" — a ring's hops, hidden behind the attention steps
    fanout: tuple = ()  # an expert-parallel all-to-all: (experts, top_k) of the tokens it carries
    pairs: float = 0.0  # attention: visible (query, key) pairs per sequence and head (0: causal over the
    # shape's keys, s_q·s_k/2; a sliding window has fewer: attention.visible_pairs)

    @property
    def exps(self) -> float:
        """attention: exponentials its softmax computes, one per visible score (backward recomputes P: as many)."""
        if self.kind != "attention":
            return 0.0
        s_q, _, s_k = self.shape
        return (self.pairs or s_q * s_k / 2) * self.count

    @property
    def flops(self) -> float:
        if self.kind == "attention":  # causal: half of Q·Kᵀ and P·V (2·s²·d each); backward 2.5× (Dao 2023)
            s_q, d, s_k = self.shape  # context parallelism: s/cp queries against the whole sequence
            forward = 4.0 * (self.pairs or s_q * s_k / 2) * d * self.count
            return 2.5 * forward if "backward" in self.name else forward
        if self.kind != "gemm":
            return 0.0
        m, k, n = self.shape
        return 2.0 * m * k * n * self.count


# Bytes per element of Transformer Engine's FP8 cast of a GEMM input (read ``width``-byte values, write FP8 for the
# forward GEMM and a second copy laid out for the backward one): delayed scaling writes the cast and its transpose
# (2); current scaling reads the tensor once more for its amax first, blockwise 1×128 quantizes the transposed copy
# with its own scales (a re-read); MXFP8 ("mx") reads once and writes both copies in one kernel — a row-wise and a
# column-wise FP8 copy, each with one E8M0 scale byte per 32 elements, since a 1×32 block's scales do not carry over
# to the transpose (TE 2.9: one ``cast_mxfp8_2D_kernel``, ``common/util/cast_kernels.cuh``, fills both
# ``tensor_map_output_rowwise`` and ``_colwise`` when the quantizer is set for both usages, as in training: the
# forward GEMM reads rows, the weight gradient columns). The fused norm + MXFP8 cast runs only through cuDNN's norm
# (``NVTE_NORM_FWD_USE_CUDNN``, which Megatron-Bridge's perf scripts remove for Llama's MXFP8 runs), so it is not
# taken; the activation's fusion belongs to TE's LayerNormMLP, which Megatron-Core's MLP does not use
MX_BLOCK = 32


def fp8_cast_bytes(recipe, width: int = 2, transpose: bool = True) -> float:
    """Bytes per element one FP8 cast of ``recipe`` (True: delayed) moves; 0 without FP8. ``transpose=False``:
    a GPU whose FP8 GEMMs take every layout (Blackwell: ``Hardware.fp8_transpose``), where Transformer Engine writes
    one per-tensor-scaled copy for both GEMMs (TE ≥ 2.3, ``is_non_tn_fp8_gemm_supported``: sm100-sm119)."""
    if not recipe:
        return 0.0
    if recipe == "mx":
        return width + 2 * (1 + 1 / MX_BLOCK)
    copies = 2 if transpose or recipe == "blockwise" else 1
    return width + copies + (0 if recipe in (True, "delayed") else width)


def _gemm(name, m, k, n, count=1, width=2):
    """A GEMM (m×k)·(k×n), ``count`` of them: reads both inputs, writes the output."""
    return Op(name, "gemm", width * (m * k + k * n + m * n) * count, (m, k, n), count)


def _backward_gemms(op: Op, skip_dgrad: bool = False):
    """Each forward GEMM x·W has a data-gradient GEMM (m×n)·(n×k) and a weight-gradient GEMM (k×m)·(m×n)."""
    m, k, n = op.shape
    out = [] if skip_dgrad else [_gemm(f"{op.name} dgrad", m, n, k, op.count)]
    return out + [_gemm(f"{op.name} wgrad", k, m, n, op.count)]
