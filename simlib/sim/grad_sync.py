"""What a step syncs besides its layers: the dense gradients (bytes, DDP-style buckets, the data-parallel all-reduce
and how much of it hides under backward), FSDP's per-layer gathers and scatters with their overlap, the
optimizer's pass over its local state, and the tied embedding's all-reduce between the pipeline's ends. Priced by
:func:`simlib.sim.cost.predict`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .topology import Placement, group_collective, group_ranks, placement


def grad_bytes(model, strategy) -> float:
    """Bytes of the dense gradients one rank all-reduces over dp × cp (experts' are synced apart)."""
    bytes_per = 2 if strategy.mixed_precision else 4
    experts = model.expert_params if getattr(model, "experts", 0) else 0
    return (model.params - experts) / (strategy.tp * strategy.pp) * bytes_per


def bucket_sizes(total_bytes, bucket_bytes):
    """Split ``total_bytes`` of gradients into buckets of at most ``bucket_bytes`` (the last one smaller)."""
    full = int(total_bytes // bucket_bytes)
    sizes = [float(bucket_bytes)] * full
    rest = total_bytes - full * bucket_bytes
    if rest > 0:
        sizes.append(float(rest))
    return sizes


def gradient_buckets(model, strategy) -> list[float]:
    """Bytes of each gradient bucket, in the order they fill. A counted model uses the real executor's rule
    (``simlib.parallel.data.make_buckets``: whole parameters in reverse order up to the cap); a formula model
    splits the gradient bytes evenly into full buckets."""
    if not model.param_numels or strategy.tp * strategy.pp > 1:
        return bucket_sizes(grad_bytes(model, strategy), strategy.bucket_bytes)
    import torch

    from ..parallel.data import make_buckets

    bytes_per = 2 if strategy.mixed_precision else 4
    dtype = torch.bfloat16 if bytes_per == 2 else torch.float32
    params = [torch.nn.Parameter(torch.empty(n, device="meta", dtype=dtype)) for n in model.param_numels]
    buckets = make_buckets(params, strategy.bucket_bytes / 2**20)
    return [float(sum(p.numel() for p in b) * bytes_per) for b in buckets]


@dataclass(frozen=True)
class BucketSync:
    """A step's bucketed data-parallel sync, as Megatron-LM's DDP and distributed optimizer run it.

    ``after``: seconds of each bucket's collective issued as backward produces its gradients (the all-reduce; the
    reduce-scatter under a distributed optimizer), in fill order; ``after_ready``: the fraction of the last
    micro-batch's backward done when each bucket is full (its bytes so far over all). ``before``: seconds of each
    bucket's all-gather of the updated parameters issued under the next step's first forward
    (``param_gather_overlap``: Megatron's ``--overlap-param-gather``), in forward order; ``before_need``: the
    fraction of that forward done when each bucket's layers start. One communication channel: a bucket's
    collective starts when it is ready and the previous one is done."""

    after: tuple
    after_ready: tuple
    before: tuple = ()
    before_need: tuple = ()

    @property
    def total(self) -> float:
        return float(sum(self.after) + sum(self.before))

    @property
    def last(self) -> float:
        return float(self.after[-1]) if self.after else 0.0

    def exposed(self, t_fwd: float, t_bwd: float, overlap: bool) -> float:
        """Seconds of the sync compute does not hide. Not overlapped: all of it. Overlapped: under backward
        (a window of ``t_bwd``) the channel ends at max_i(ready_i + the buckets from i on) — at least the last
        bucket, which is full only when backward ends; under forward (``t_fwd``) the step waits
        max_j(the all-gathers up to j done − bucket j needed) — at least the first bucket."""
        if not overlap:
            return self.total
        out = 0.0
        if self.after:
            t = np.asarray(self.after)
            suffix = np.cumsum(t[::-1])[::-1]
            out += max(0.0, float(np.max(np.asarray(self.after_ready) * t_bwd + suffix)) - t_bwd)
        if self.before:
            done = np.cumsum(np.asarray(self.before))
            out += max(0.0, float(np.max(done - np.asarray(self.before_need) * t_fwd)))
        return out


def dp_comm_time(model, hardware, strategy, processes=1) -> tuple[float, float]:
    """(total, last bucket) seconds of the data-parallel gradient sync, bucket by bucket (:func:`dp_sync`)."""
    sync = dp_sync(model, hardware, strategy, processes)
    return sync.total, sync.last


def dp_sync(model, hardware, strategy, processes=1) -> BucketSync:
    """The step's data-parallel sync bucket by bucket (:class:`BucketSync`; empty without data parallelism).

    ZeRO 1/2 replace the all-reduce by reduce-scatter + all-gather (the same traffic): priced as the all-reduce
    under backward, unless ``param_gather_overlap`` (Megatron's distributed optimizer with
    ``--overlap-param-gather``): then each bucket's gradients are reduce-scattered under backward and its updated
    parameters all-gathered under the next step's first forward — in FP8 (1 byte a parameter) with
    ``fp8_param_gather`` (Megatron's ``--fp8-param-gather``, torchtitan's float8 all-gather), as the recipe keeps
    FP8 weights. ZeRO-3 reduce-scatters the gradients and all-gathers the weights before forward and again before
    backward: 1.5× the traffic of the all-reduce (Rajbhandari et al. 2020 §7), all under backward here. Every
    collective runs on the data-parallel group's placement on the rank grid (``topology``). Each bucket is packed
    flat, divided and unpacked (6 bytes moved per byte)."""
    s = strategy
    if s.dp * s.cp == 1:
        return BucketSync((), ())
    pack = 6.0 / hardware.mem_rate(processes)
    factor = hardware.comm_in_situ(processes)
    split = s.param_gather_overlap and s.zero_stage in (1, 2)
    gather_per_byte = (1 if s.fp8_param_gather else 2) / (2 if s.mixed_precision else 4)  # params over grads
    seen: dict = {}  # buckets are mostly of one size: each (kind, size, group) priced once

    def coll(kind, b, place):
        key = (kind, b, place)
        if key not in seen:
            seen[key] = group_collective(kind, b, place, hardware)
        return seen[key]

    def sync(b, place):
        if s.zero_stage == 3:  # reduce-scatter the gradients; all-gather the weights for forward and backward
            return coll("reduce_scatter", b, place) + 2 * coll("all_gather", b, place)
        return coll("reduce_scatter" if split else "all_reduce", b, place)

    after, before, sizes = [], [], []
    groups = [(placement(s, hardware, "dp" if s.cp == 1 else "dp_cp"), gradient_buckets(model, s))]
    if getattr(model, "experts", 0) and s.expert_dp > 1:  # each expert's over the ranks that hold it
        nbytes = model.expert_params / (s.ep * s.pp) * (2 if s.mixed_precision else 4)
        groups.append((placement(s, hardware, "expert_dp"), bucket_sizes(nbytes, s.bucket_bytes)))
    for place, buckets in groups:
        for b in buckets:
            after.append(sync(b, place) * factor + pack * b)
            sizes.append(b)
            if split:
                before.append(coll("all_gather", b * gather_per_byte, place) * factor)
    ready = tuple(float(x) for x in np.cumsum(sizes) / sum(sizes))
    if not split:
        return BucketSync(tuple(after), ready)
    # forward needs the buckets in the reverse of backward's fill order; bucket j when the bytes before it are done
    fwd = list(reversed(sizes))
    need = tuple(float(x) for x in (np.cumsum(fwd) - fwd) / sum(fwd))
    return BucketSync(tuple(after), ready, tuple(reversed(before)), need)


def bucket_comm_times(model, hardware, strategy, processes=1) -> list[float]:
    """Seconds of each gradient bucket's sync under backward: pack flat + collective + divide + unpack.

    Packing moves 6 bytes per byte at memory bandwidth (cat, divide, copy back: each reads and writes). The
    collective is the calibrated back-to-back time times ``hardware.comm_in_situ(processes)``: on a CPU box
    an all-reduce that follows compute is slower than the back-to-back ones a sweep times (Gloo's threads
    wake up, caches are cold, and the cores are the same ones compute just used), measured by calibrate().
    """
    return list(dp_sync(model, hardware, strategy, processes).after)


def shard_placement(strategy, hardware) -> Placement:
    """Where one FSDP shard group lies: the first ``shard_degree`` of the dp × cp ranks of the grid."""
    s, g = strategy, hardware.devices_per_node
    counts: dict[int, int] = {}
    for r in group_ranks(s, "dp_cp")[: s.shard_degree]:
        counts[r // g] = counts.get(r // g, 0) + 1
    return Placement("dp", s.shard_degree, max(counts.values()), len(counts))


def fsdp_comm(model, hardware, strategy, layer_forward: float, layer_backward: float) -> dict:
    """Seconds of FSDP's communication for one micro-batch, and how much of it compute does not hide.

    As PyTorch FSDP runs it (Zhao et al. 2023, "PyTorch FSDP", §3–4; torchtitan wraps one unit per block):
    each layer's parameters are all-gathered (in the 16-bit parameter dtype) before its forward, and with
    FULL_SHARD (zero_stage 3) again before its backward; its gradients are reduce-scattered (in
    ``reduce_dtype``) after its backward — every micro-batch. Prefetching overlaps layer i+1's all-gather with
    layer i's compute, so per layer only max(0, comm − compute) is exposed, plus the first all-gather and the
    last reduce-scatter, which nothing hides. Hybrid sharding (``shard_size``) runs these inside the shard group
    and all-reduces the gradient shards across the replicas, once per step (charged to the last micro-batch's
    backward, where FSDP issues it). The embedding and output layer form one more unit.
    """
    s = strategy
    layers = model.layers / s.pp
    embed = model.vocab * model.hidden * (1 if model.tied_embeddings else 2)
    per_layer = (model.params - embed) / model.layers / s.tp
    param_bytes = 1 if s.fp8_param_gather else 2 if s.mixed_precision else 4  # FP8 weights gathered in FP8
    reduce_bytes = {"fp32": 4, "tf32": 4}.get(s.reduce_dtype, 2 if s.mixed_precision else 4)
    place = shard_placement(s, hardware)
    gather = group_collective("all_gather", per_layer * param_bytes, place, hardware)
    scatter = group_collective("reduce_scatter", per_layer * reduce_bytes, place, hardware)
    gather_bwd = gather if s.zero_stage == 3 else 0.0
    replicas = s.dp // s.shard_degree
    across = 0.0
    if replicas > 1:
        g = hardware.devices_per_node
        stride = s.tp * s.pp * s.shard_degree
        nodes = len({i * stride // g for i in range(replicas)})
        per_node = replicas // nodes
        across = group_collective(
            "all_reduce",
            per_layer * reduce_bytes / s.shard_degree,
            Placement("dp", replicas, per_node, nodes),
            hardware,
        )
    ends = group_collective("all_gather", embed / s.tp * (2 if s.mixed_precision else 4), place, hardware)  # 16-bit
    fwd_exposed = gather + layers * max(0.0, gather - layer_forward) + ends
    bwd_exposed = layers * max(0.0, gather_bwd + scatter - layer_backward) + scatter
    total = layers * (gather + gather_bwd + scatter) + ends * (2 if s.zero_stage == 3 else 1)
    m = s.num_micro_batches
    step_across = layers * across
    across_exposed = (
        max(0.0, layers * (gather_bwd + scatter + across) - layers * layer_backward)
        - layers * max(0.0, gather_bwd + scatter - layer_backward)
        + (across if replicas > 1 else 0.0)
    )
    return dict(
        per_micro_batch=total,
        exposed_per_micro_batch=fwd_exposed + bwd_exposed,
        step_total=m * total + step_across,
        step_exposed=m * (fwd_exposed + bwd_exposed) + across_exposed,
        gather_per_layer=gather,
        scatter_per_layer=scatter,
    )


def optimizer_time(model, hardware, strategy, processes=1) -> float:
    """The optimizer reads and writes every local parameter's state: bandwidth-bound."""
    s = strategy
    experts = model.expert_params if getattr(model, "experts", 0) else 0
    params_here = (model.params - experts) / (s.tp * s.pp) / (s.shard_degree if s.zero_stage >= 1 else 1) + experts / (
        s.ep * s.pp
    ) / (s.expert_dp if s.zero_stage >= 1 else 1)
    moved = {"sgd": 12.0, "sgd_momentum": 20.0, "adam": 36.0}[s.optimizer]  # fp32 reads + writes per param
    zero_grad = 4.0  # zero_grad(set_to_none=False) writes the gradients
    total = params_here * (moved + zero_grad)
    return total / hardware.achievable_bandwidth(total, processes)


def embedding_sync_time(model, hardware, strategy) -> float:
    """Pipelines tie the input embedding (first stage) to the logits (last stage): their V/tp × h gradients are
    all-reduced between the two once per step (Megatron-LM). 0 without a pipeline or a vocabulary."""
    s = strategy
    if s.pp == 1 or model.kind != "gpt" or not model.vocab:
        return 0.0
    size = model.vocab / s.tp * model.hidden * (2 if s.mixed_precision else 4)
    same = (s.pp - 1) * s.tp < hardware.devices_per_node  # ranks 0 and (pp−1)·tp of the grid share node 0
    ends = Placement("embedding", 2, 2, 1) if same else Placement("embedding", 2, 1, 2)
    return group_collective("all_reduce", size, ends, hardware)
