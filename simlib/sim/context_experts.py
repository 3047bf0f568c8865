"""The cost model for lesson 09: all-to-all, context-parallel attention (ring and Ulysses) and an MoE layer.

Same method as :mod:`simlib.sim.cost`: α-β collectives on a :class:`~simlib.sim.hardware.Link`, compute from the
hardware's rates. nccl-tests (PERFORMANCE.md) gives all-to-all the bus-bandwidth factor (n−1)/n, like
all-gather. Kept in its own module so the core cost model stays as it is; :func:`simlib.sim.cost.predict` does
not price these layers yet.

Compute, two ways. A box that :func:`simlib.sim.calibrate` measured has the times of the eager kernels these
layers are made of (``Hardware.overheads["kernels"]``: simlib's ring-attention block, full and causal, and
SDPA, each at the block lengths lesson 09 takes; one small autograd op; the wait of a small blocking
collective): a kernel of L×L scores is read off its table (linear in L² between measured lengths: a per-call
cost plus a cost per score entry), scaled by its heads; the MoE layer is its GEMMs plus its counted eager ops
at the cost of one measured in the layer itself. Collectives cost what calibrate() saw them add to the compute
around them (``kernels["in_situ"]``). A preset (no such measurement) prices the blocks' GEMMs at their own size
plus the element-wise passes at memory bandwidth, and collectives at the link's α-β.
"""

from __future__ import annotations

from ..parallel import context
from ..parallel.experts import a2a_volume, capacity
from .collectives import all_to_all  # noqa: F401 - priced with the other collectives, re-exported here
from .cost import gemm_time
from .ring_comm import _blocking, _in_situ, _in_step, _measured, _p2p, _small_collective, all_to_all_time, exposed_hop  # noqa: F401

# Passes over the score block (B·H·c·c values) that simlib.parallel.context's ring attention makes besides its
# GEMMs, counted in its code: forward (block_attention) scale, mask, max, subtract, exp, sum, and the merge's
# reads, each a read (and most a write) of the block; backward scale, mask, subtract, exp, dP - delta, dS = P·(…).
SCORE_BYTES_FORWARD = 8  # element moves per score entry (reads + writes), forward
SCORE_BYTES_BACKWARD = 11  # and backward
# The MoE layer's row copies besides its GEMMs (simlib.parallel.experts): gather the kept rows, put the experts'
# outputs back in order, weight them by their gates, add them up per token — each a read and a write of a row.
ROW_MOVES = 8  # per kept assignment and hidden value, forward; as many again in backward

# Eager ops (aten calls, forward and backward nodes) of ExpertParallelMoE's forward and of its backward, counted
# with a TorchDispatchMode at ep = 2, top-2, 2/4/8 experts per rank: 83 + 10 per local expert forward (the
# router, softmax/top-k, the queue positions, the kept rows' gather and sort, the splits; per expert its
# selection, its two Linears and GELU, the index_copy back), 45 + 22 per local expert backward.
OPS_FORWARD, OPS_PER_EXPERT_FORWARD, OPS_BACKWARD, OPS_PER_EXPERT_BACKWARD = 83, 10, 45, 22


def _op(hardware, processes):
    """Seconds of one small eager op where calibrate() measured it (``kernels["op"]``), else None."""
    return _measured(hardware, processes).get("op")


def _block_time(c, head_dim, batch_heads, hardware, dtype, processes, backward):
    """One (c queries × c keys) block for B·H heads: its GEMMs at their own size, plus the score passes."""
    forward = gemm_time(c, head_dim, c, hardware, dtype, processes) + gemm_time(
        c, c, head_dim, hardware, dtype, processes
    )
    # backward: the scores again (QKᵀ), dV += Pᵀ·dO, dP = dO·Vᵀ, dQ += dS·K, dK += dSᵀ·Q
    back = 3 * gemm_time(c, c, head_dim, hardware, dtype, processes) + 2 * gemm_time(
        c, head_dim, c, hardware, dtype, processes
    )
    nbytes = 2 if dtype in ("bf16", "fp16") else 4
    block = batch_heads * c * c * nbytes
    passes = SCORE_BYTES_FORWARD + (SCORE_BYTES_BACKWARD if backward else 0)
    memory = passes * block / hardware.achievable_bandwidth(block, processes)
    return batch_heads * (forward + (back if backward else 0.0)) + memory


def kernel_time(hardware, name, length, batch_heads, processes, backward=True, head_dim=None):
    """Seconds of one calibrated kernel call on ``batch_heads`` heads of ``length`` × ``length`` scores, or None
    where the box did not measure it (presets).

    Between two measured lengths the time is linear in L² (a per-call cost plus a cost per score entry, both
    fitted to the two neighbours); outside them the nearest segment's line extends; heads scale it in
    proportion. ``head_dim``: the table measured at that head size (:func:`simlib.sim.kernels.kernel_key`);
    None or one not measured: the default head size's.
    """
    from .kernels import KERNEL_HEADS, kernel_key

    table = _measured(hardware, processes)
    if head_dim is not None and kernel_key(name, head_dim) in table:
        name = kernel_key(name, head_dim)
    if name not in table:
        return None
    pts = sorted(table[name]["backward" if backward else "forward"])
    i = next((j for j in range(1, len(pts) - 1) if length <= pts[j][0]), len(pts) - 1)
    (l1, t1), (l2, t2) = pts[i - 1], pts[i]
    t = t1 + (t2 - t1) * (length * length - l1 * l1) / (l2 * l2 - l1 * l1)
    return max(t, 0.0) * batch_heads / KERNEL_HEADS


def ring_attention_time(
    batch, heads, seq, head_dim, cp, hardware, layout="zigzag", causal=True, dtype="bf16", backward=True, processes=None
) -> dict:
    """Predicted seconds of one ring-attention layer, forward (and backward), as simlib runs it.

    Each rank computes its blocks (:func:`context.causal_work` / c², c the chunk length): per block and head
    two GEMMs forward and five backward, each priced at its own size (small blocks run far below a big GEMM's
    rate), plus the element-wise passes over the score block (:data:`SCORE_BYTES_FORWARD`, ``_BACKWARD``) at
    the achievable memory bandwidth; ranks side by side run at the slowest one's pace (``straggler``). Each of
    the cp−1 K/V hops (2·B·H·S/cp·D elements, point to point) overlaps with a step's compute; backward's dK/dV
    hops (cp of them) are waited for before the next step, so they add in full.

    On a calibrated box the blocks are read off the measured kernels (a zig-zag rank's own step measured whole:
    its diagonal blocks cost more beside the full one than alone), and each pass costs what calibrate() saw it
    add to compute (:func:`simlib.sim.kernels.in_situ_comm`): where the ranks share cores, a K/V pass overlapped
    with compute is not hidden, its copies take the compute's core.
    """
    processes = processes or min(cp, hardware.devices_per_node)
    nbytes = 2 if dtype in ("bf16", "fp16") else 4
    work = context.causal_work(seq, cp, layout, causal)
    c = seq // cp if layout == "contiguous" else seq // (2 * cp)
    # each rank holds one chunk (contiguous) or two (zig-zag); with a causal mask each chunk meets itself in
    # one diagonal block (masked, see kernels._kernels), every other block it computes is full
    diagonal = (1 if layout == "contiguous" else 2) if causal else 0
    t_full, t_diag, t_zigzag = (
        kernel_time(hardware, name, c, batch * heads, processes, backward, head_dim)
        for name in ("ring_full", "ring_diagonal", "ring_zigzag")
    )
    if t_zigzag is not None and t_full is not None and layout == "zigzag" and causal:
        # measured as a whole: a zig-zag rank's own step (two diagonal blocks, one full), then full blocks
        compute = [t_zigzag + (entries // (c * c) - 3) * t_full for entries in work]
    elif t_full is not None and t_diag is not None:  # measured: the slowest rank's times hold the straggler
        compute = [(entries // (c * c) - diagonal) * t_full + diagonal * t_diag for entries in work]
    else:
        per_block = _block_time(c, head_dim, batch * heads, hardware, dtype, processes, backward)
        straggle = hardware.straggler(processes) if hasattr(hardware, "straggler") else 1.0
        compute = [straggle * per_block * entries / (c * c) for entries in work]
    kv = 2 * batch * heads * (seq // cp) * head_dim * nbytes  # one K/V block
    hop = _p2p(kv, hardware) if cp > 1 else 0.0
    hops = (cp - 1) * (2 if backward else 1)  # K/V around the ring, forward and again in backward
    # each K/V hop is started before a step's blocks and waited for after them (ring_comm.exposed_hop); backward sends each step's dK/dV on and waits for it before the next step (RingAttention.backward):
    # cp blocking hops, in full
    exposed_dkv = cp * _blocking(kv, cp, hardware, "p2p", processes) if backward and cp > 1 else 0.0
    check = _small_collective(cp, hardware)
    per_rank = [
        t + hops * exposed_hop(kv, cp, hardware, processes, t) + exposed_dkv + check if cp > 1 else t for t in compute
    ]
    return dict(per_rank=per_rank, total=max(per_rank), compute=compute, hop=hop)


def ulysses_time(
    batch, heads, seq, head_dim, cp, hardware, causal=True, dtype="bf16", backward=True, processes=None
) -> dict:
    """Predicted seconds of one Ulysses layer: four all-to-alls each way, then attention on H/cp heads."""
    if heads % cp:
        raise ValueError(f"Ulysses needs heads ({heads}) divisible by cp ({cp})")
    processes = processes or min(cp, hardware.devices_per_node)
    nbytes = 2 if dtype in ("bf16", "fp16") else 4
    compute = kernel_time(hardware, "sdpa", seq, batch * heads // cp, processes, backward, head_dim) if causal else None
    if compute is None:
        rate = hardware.gemm_rate(2 * seq * seq * head_dim / 1e9, dtype, processes)  # one head's QKᵀ
        entries = seq * seq / (2 if causal else 1)
        compute = (3.5 if backward else 1.0) * entries * batch * (heads // cp) * 4 * head_dim / rate
    local = batch * heads * (seq // cp) * head_dim * nbytes  # one of q, k, v, out on a rank
    a2a = _blocking(local, cp, hardware, "all_to_all", processes)  # one that meets the ranks after compute
    calls = 4 * (2 if backward else 1)  # q, k, v in and the output back; dO in and dq, dk, dv back
    # q, k, v come right after the shape check and dk, dv after dq (:func:`_in_step`); the output, dO and dq
    # after compute
    in_step = _in_step(local, cp, hardware, processes)
    after_compute = 3 if backward else 1
    # seq_to_heads / heads_to_seq copy the tensor into its send layout and out of the received one: a read and
    # a write of it twice per all-to-all
    copies = calls * 4 * local / hardware.achievable_bandwidth(local, processes) if cp > 1 else 0.0
    comm = after_compute * a2a + (calls - after_compute) * in_step
    total = compute + comm + copies + _small_collective(cp, hardware)
    return dict(total=total, compute=compute, all_to_all=a2a, all_to_all_in_step=in_step, copies=copies)


def _moe_compute(tokens, hidden, num_experts, ep, hardware, top_k, capacity_factor, ffn, dtype, backward, processes):
    """(GEMMs + memory passes in seconds, eager ops) of one rank's share of the MoE layer."""
    nbytes = 2 if dtype in ("bf16", "fp16") else 4
    cap = capacity(tokens, num_experts, top_k, capacity_factor)
    per_expert = min(cap, tokens * top_k / num_experts)
    local = num_experts // ep
    rows = per_expert * local
    forward = local * (
        gemm_time(per_expert, hidden, ffn, hardware, dtype, processes)
        + gemm_time(per_expert, ffn, hidden, hardware, dtype, processes)
    )
    forward += gemm_time(tokens // ep, hidden, num_experts, hardware, dtype, processes)  # the router
    gelu = rows * ffn * nbytes * (2 + (3 if backward else 0))  # read + write; backward reads two, writes
    moves = rows * hidden * nbytes * ROW_MOVES * (2 if backward else 1)
    memory = (gelu + moves) / hardware.achievable_bandwidth(rows * hidden * nbytes, processes)
    ops = OPS_FORWARD + OPS_PER_EXPERT_FORWARD * local
    if backward:
        ops += OPS_BACKWARD + OPS_PER_EXPERT_BACKWARD * local
    # the experts and the router are autograd Linear layers: what they take over the bare GEMMs (transposed
    # weights, bias, outputs allocated, cold weights) is the calibrated layer factor (1 on a preset)
    layer = hardware.layer_factor(processes) if hasattr(hardware, "layer_factor") else 1.0
    return forward * (3 if backward else 1) * layer + memory, ops, cap


def moe_op_time(hardware, processes):
    """Seconds of one of the MoE layer's eager ops on a calibrated box, else None (presets).

    From the layer itself where calibrate() timed it (``kernels["moe"]``: one rank alone at small sizes, forward
    + backward): its time less its GEMMs and memory passes (priced as :func:`moe_layer_time` prices them),
    over its counted ops. Otherwise the cost of one tiny autograd op (``kernels["op"]``)."""
    cal = _measured(hardware, processes).get("moe")
    if cal:
        gemms, ops, _ = _moe_compute(
            cal["tokens"],
            cal["hidden"],
            cal["num_experts"],
            1,
            hardware,
            cal["top_k"],
            cal["capacity_factor"],
            4 * cal["hidden"],
            "fp32",
            True,
            processes,
        )
        return max(cal["seconds"] - gemms, 0.0) / ops
    return _op(hardware, processes)


def moe_layer_time(
    tokens,
    hidden,
    num_experts,
    ep,
    hardware,
    top_k=1,
    capacity_factor=1.25,
    ffn=None,
    dtype="bf16",
    backward=True,
    processes=None,
) -> dict:
    """Predicted seconds of one MoE layer on ``ep`` ranks under a uniform router (``tokens`` in the whole batch).

    Compute: the router (tokens/ep × hidden × E), and each of the rank's E/ep experts on at most capacity
    tokens (two GEMMs of hidden × ffn each, priced at their own size), backward twice forward's GEMMs; the
    GELU and the row copies (:data:`ROW_MOVES`) at the memory bandwidth; on a calibrated box also its eager
    ops (:data:`OPS_FORWARD` …) at :func:`moe_op_time` each. Communication: the routing counts (an all-gather
    of k×E counts and an all-to-all of E counts), then the dispatch and the combine all-to-alls (and both
    again in backward).
    """
    if num_experts % ep:
        raise ValueError(f"{num_experts} experts do not split evenly over ep = {ep}")
    processes = processes or min(ep, hardware.devices_per_node)
    ffn = ffn or 4 * hidden
    nbytes = 2 if dtype in ("bf16", "fp16") else 4
    compute, ops, cap = _moe_compute(
        tokens, hidden, num_experts, ep, hardware, top_k, capacity_factor, ffn, dtype, backward, processes
    )
    op = moe_op_time(hardware, processes)
    if op:  # a calibrated box: the layer is a few hundred small eager ops, each paying its dispatch
        compute += ops * op
    vol = a2a_volume(tokens // ep, hidden, top_k, ep, nbytes)
    one = _blocking(vol["dispatch"] * ep / max(ep - 1, 1), ep, hardware, "all_to_all", processes)
    # the routing counts: an all-gather of k×E counts (queue_positions), an all-to-all of E (exchange_counts)
    # (the second right after the first: :func:`_in_step`)
    counts = _blocking(8 * top_k * num_experts, ep, hardware, "all_gather", processes) + _in_step(
        8 * num_experts, ep, hardware, processes
    )
    comm = one * (4 if backward else 2) + counts
    return dict(total=compute + comm, compute=compute, all_to_all=one, counts=counts, comm=comm, capacity=cap)
