"""The planner's pricing: :func:`simlib.sim.predict`'s step, with its costly parts computed once per key.

A search over tens of thousands of plans calls the same few expensive functions with the same arguments again
and again: one micro-batch of a pipeline stage depends on (micro-batch, tp, pp, recomputation, sequence
parallelism, dtype, kernels) but not on dp, ZeRO or the schedule; the data-parallel sync depends on
(dp, tp, pp, ZeRO, buckets) but not on the micro-batch. :class:`FastPricer` keys each part on the fields it
reads — a copy of the strategy with the fields it does *not* read set to their defaults, so a field added to
``Strategy`` later stays in every key — and assembles the step exactly as ``predict`` does:

    step = m·(t_fwd + t_bwd) + bubble + tp, cp and ep comm + pp messages + exposed dp sync + embedding sync
           + optimizer

The planner re-prices its top plans with ``predict`` itself and falls back to it if they disagree.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache

from .cpu_share import combine_entry


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def label(s) -> str:
    """A plan's short name: ``dp16 tp8 pp4 1f1b m32 mb1 zero1 full-recompute``."""
    parts = [
        f"{a}{getattr(s, a, 1)}" + (f"({s.cp_kind})" if a == "cp" else "")
        for a in ("dp", "tp", "pp", "cp", "ep")
        if getattr(s, a, 1) > 1
    ]
    if s.pp > 1:
        parts.append(s.schedule + (f" v{s.virtual_stages}" if s.virtual_stages > 1 else ""))
    parts.append(f"mb{s.micro_batch} x{s.num_micro_batches}")
    if s.zero_stage:
        parts.append(("fsdp" if s.fsdp else "zero") + str(s.zero_stage))
    if s.recompute != "none":
        parts.append(f"{s.recompute}-recompute")
    if s.sequence_parallel:
        parts.append("sp" + ("+overlap" if s.tp_overlap else ""))
    if s.dp > 1 and not s.overlap and not s.fsdp:
        parts.append("no-overlap")
    if s.param_gather_overlap:
        parts.append("param-gather-overlap")
    return " ".join(parts) or "1 device"


# fields each cached part does not read, and the value its key sets them to (``Strategy``'s defaults)
_NOT_STAGE = dict(
    dp=1,
    num_micro_batches=1,
    zero_stage=0,
    overlap=False,
    param_gather_overlap=False,
    fsdp=False,
    schedule="1f1b",
    virtual_stages=1,
    bucket_bytes=25e6,
    shard_size=0,
    reduce_dtype="",
)
_NOT_SYNC = dict(
    micro_batch=1,
    num_micro_batches=1,
    recompute="none",
    schedule="1f1b",
    virtual_stages=1,
    overlap=False,
    tp_overlap=False,
    sequence_parallel=False,
    fsdp=False,
    shard_size=0,
    reduce_dtype="",
)


# stage fields the compute floor does not depend on (:meth:`FastPricer.floor`)
_NOT_FLOOR = (
    "recompute",
    "tp_overlap",
    "recompute_layers",
    "pp",
    "virtual_stages",
    "first_stage_layers",
    "last_stage_layers",
    "pipeline_flushes",
)


class FastPricer:
    """Prices strategies of one model on one machine; ``exact=True`` calls ``predict`` for every plan."""

    def __init__(self, model, hardware, processes: int | None = None, exact: bool = False):
        import dataclasses

        from .strategy import Strategy

        self.model, self.hw, self.processes, self.exact = model, hardware, processes, exact
        self.gpt = model.kind == "gpt"
        names = [f.name for f in dataclasses.fields(Strategy)]
        self._stage_fields = tuple(n for n in names if n not in _NOT_STAGE)
        self._sync_fields = tuple(n for n in names if n not in _NOT_SYNC)
        self._stages, self._syncs, self._p2p, self._ops, self._floors, self._floor_comm = {}, {}, {}, {}, {}, {}
        self._small = lru_cache(maxsize=None)(self._small_uncached)
        self._flops = model.flops_per_sample()  # the MFU's numerator: one model, one number
        self._at = None  # processes to price at in place of procs(s) (at_own_cores)

    def procs(self, s) -> int:
        return self._at or self.processes or min(s.world_size, self.hw.devices_per_node)

    @contextmanager
    def at_own_cores(self, s):
        """Inside: prices at a core per process where ``s``'s ranks share a CPU's cores (``Hardware.own_cores``;
        :mod:`simlib.sim.cpu_share`); yields that count, or None (then nothing changes)."""
        own = None if self._at else self.hw.own_cores(self.procs(s))
        self._at = own
        try:
            yield own
        finally:
            self._at = None

    def memory(self, s) -> dict:
        from .memory import memory_per_device

        return memory_per_device(self.model, s)

    def predict(self, s):
        from .cost import predict

        return predict(self.model, self.hw, s, self.procs(s))

    # ---- the cached parts: keyed on the values of the fields each one reads ----
    def _small_uncached(self, s, layer_forward, layer_backward, act_bytes):
        from .grad_sync import fsdp_comm
        from .topology import p2p_time

        f = fsdp_comm(self.model, self.hw, s, layer_forward, layer_backward) if s.fsdp else None
        return f, p2p_time(act_bytes, s, self.hw)

    def stage(self, s, **changes) -> dict:
        """One micro-batch of the slowest pipeline stage (``gpt_stage``) of ``s.replace(**changes)``, once per
        set of the fields it reads (the replaced strategy is built only when it is priced)."""
        from .cost import gpt_stage

        p = self.procs(s)
        # with ep > 1 the all-to-all's group spans dp (its placement on the nodes): dp stays in the key
        dp = s.dp if s.ep > 1 else 1
        # interleaving: gpt_stage asks only whether virtual_stages > 1 (then layers / pp per stage, as Megatron
        # splits 126 layers + embedding and loss into 8 x 8 chunks, where v = 1 needs pp to divide the layers)
        inter = s.virtual_stages > 1
        key = (p, dp, inter) + tuple(changes[n] if n in changes else getattr(s, n) for n in self._stage_fields)
        stage = self._stages.get(key)
        if stage is None:
            norm = {**changes, **_NOT_STAGE, "dp": dp}
            if inter:
                norm.update(schedule="interleaved", virtual_stages=s.virtual_stages, num_micro_batches=s.pp)
            stage = self._stages[key] = gpt_stage(self.model, self.hw, s.replace(**norm), p, memo=self._ops)
        return stage

    def parts(self, s):
        from .grad_sync import dp_sync, embedding_sync_time, optimizer_time

        p = self.procs(s)
        stage = self.stage(s)
        key = (p,) + tuple(getattr(s, n) for n in self._sync_fields)
        sync = self._syncs.get(key)
        if sync is None:
            k = s.replace(**_NOT_SYNC)
            sync = self._syncs[key] = (
                dp_sync(self.model, self.hw, k, p),
                embedding_sync_time(self.model, self.hw, k),
                optimizer_time(self.model, self.hw, k, p),
            )
        return stage, sync, p

    def floor(self, s, tp_overlap: bool = False, **changes) -> float:
        """A lower bound on the step time of ``s.replace(**changes)`` and of every plan that differs from it only
        in ZeRO/FSDP, recomputation or overlap (and in tp_overlap if ``tp_overlap``), cheaper than :meth:`bound`.

        ``predict``'s step is compute + bubble + exposed communication + optimizer, every term >= 0, and
        compute + bubble + the tp, cp and ep collectives = (m + flushes·(pp − 1)/v)·T, with T the time of one
        micro-batch (compute and collectives) on the stage ``gpt_stage`` charges: the slowest one. Each stage's
        T is at least its layers' GEMMs, kernels and attention, an MoE layer's host overhead on a GPU, plus the
        collectives nothing hides (all but a ring's hops, and tp's own when tp_overlap may hide them):
        recomputation, hidden-TP slowdowns, the embedding and head only add to it. The pipeline messages
        (>= 0) are added as ``predict`` prices them.
        Operator times are ``op_time``'s own, memoized with :meth:`parts`."""
        if not self.gpt:
            return 0.0
        if self._at is None and self.hw.own_cores(self.procs(s)):  # shared cores: the step >= a core per rank's
            with self.at_own_cores(s):
                return self.floor(s, tp_overlap, **changes)
        key = (self.procs(s),) + tuple(
            changes[n] if n in changes else getattr(s, n) for n in self._stage_fields if n not in _NOT_FLOOR
        )
        layer = self._floors.get(key)
        if layer is None:
            layer = self._floors[key] = self._layer_floor(s.replace(**changes) if changes else s)
        # the collectives' times depend on the groups' placement: the grid (dp and pp besides the key's degrees)
        grid = key + (s.dp, s.pp, tp_overlap)
        per_layer = self._floor_comm.get(grid)
        if per_layer is None:
            places: dict = {}
            per_layer = self._floor_comm[grid] = {
                expert: compute
                + sum(self._op_time(op, s, places) for op in comms if not (tp_overlap and op.group == "tp"))
                for expert, (compute, comms) in layer.items()
            }
        model = self.model
        stages = s.stage_layers(model.layers) if s.virtual_stages == 1 else [model.layers / s.pp] * s.pp
        dense_end = model.dense_layers if model.experts else model.layers
        most, start = 0.0, 0
        for n in stages:
            dense = max(0, min(dense_end, start + n) - start)
            most = max(most, dense * per_layer[False] + (n - dense) * per_layer.get(True, 0.0))
            start += n
        m, v = s.num_micro_batches, s.virtual_stages
        out = (m + s.pipeline_flushes * (s.pp - 1) / v) * most
        if s.pp > 1:
            out += 2 * m * v * self._small_p2p(s, self._act_bytes(s))[1]
        return out

    def _act_bytes(self, s) -> int:
        return s.micro_batch * self.model.seq_len // s.cp * self.model.hidden * (2 if s.mixed_precision else 4)

    def _op_time(self, op, s, places):
        from .cost import op_time
        from .layer import op_time_key

        p = self.procs(s)
        k = op_time_key(op, self.hw, s, p, s.threads, places)
        t = self._ops.get(k)
        if t is None:
            t = self._ops[k] = op_time(op, self.hw, s, p, s.threads)
        return t

    def bound(self, s, variants) -> float:
        """A tighter lower bound than :meth:`floor` on every plan that differs from ``s`` only in ZeRO/FSDP,
        recomputation, overlap and the (sequence_parallel, tp_overlap) pairs in ``variants``: the stage priced
        without recomputation (which only adds to every stage's time and collectives), so
        compute + bubble + tp/cp/ep comm = (m + flushes·(pp − 1)/v)·(t_fwd + t_bwd + comm per micro-batch),
        plus the pipeline messages; the data-parallel sync and the optimizer (>= 0) are left out."""
        if not self.gpt or self.exact:
            return self.floor(s)
        if self._at is None and self.hw.own_cores(self.procs(s)):  # as floor: a core per rank is a lower bound
            with self.at_own_cores(s):
                return self.bound(s, variants)
        least = None
        for sp, tpo in variants:
            st = self.stage(s, sequence_parallel=sp, tp_overlap=tpo, recompute="none", recompute_layers=0)
            t = st["forward"] + st["backward"] + st["forward_comm"] + st["backward_comm"]
            least = t if least is None else min(least, t)
        m, v = s.num_micro_batches, s.virtual_stages
        out = (m + s.pipeline_flushes * (s.pp - 1) / v) * least
        if s.pp > 1:
            out += 2 * m * v * self._small_p2p(s, self._act_bytes(s))[1]
        return out

    def _layer_floor(self, s) -> dict:
        """Per layer kind (dense, MoE): (compute seconds, the collectives compute does not hide)."""
        from .cluster_ops import moe_host_overhead
        from .layer_strategy import strategy_layer_ops

        out = {}
        for expert in (False, True) if self.model.experts else (False,):
            ops = strategy_layer_ops(self.model, s, expert, self.hw)
            compute = 0.0
            for op in ops["forward"] + ops["backward"]:
                if op.kind in ("gemm", "memory", "attention"):  # what gpt_stage counts as compute
                    compute += self._op_time(op, s, None)
            if expert:  # the host's per-expert launches, as gpt_stage charges them per pass
                compute += moe_host_overhead(self.model, s, self.hw)
            comms = tuple(
                op for op in ops["forward"] + ops["backward"] if op.kind == "comm" and op.overlap != "attention"
            )  # exposed whole (exposed_comm)
            out[expert] = (compute, comms)
        return out

    def recompute_time(self, s) -> float:
        """Seconds of recomputation per step: backward with this policy minus backward without."""
        if s.recompute == "none" or not self.gpt:
            return 0.0
        with_, _, _ = self.parts(s)
        without, _, _ = self.parts(s.replace(recompute="none"))
        return s.num_micro_batches * (with_["backward"] - without["backward"])

    def price(self, s, global_batch: int) -> dict:
        """Step time, its terms, tokens/s and MFU of ``s`` (a dict; ``strategy`` is ``s``)."""
        model = self.model
        if self.exact or not self.gpt:
            pr = self.predict(s)
            return dict(
                strategy=s,
                step_time=pr.step_time,
                compute=pr.compute,
                bubble=pr.bubble,
                optimizer=pr.optimizer,
                exposed_comm=pr.exposed_comm,
                tokens_per_s=global_batch * model.seq_len / pr.step_time,
                mfu=self._flops * global_batch / (pr.step_time * s.world_size * self.hw.peak(s.dtype, self.procs(s))),
                **{
                    k: pr.breakdown.get(k, 0.0)
                    for k in ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_exposed", "dp_comm", "embedding_sync")
                },
            )
        out = self._fast_price(s, global_batch)
        if self._at is None and self.hw.own_cores(self.procs(s)):  # predict's processor sharing, the same way
            with self.at_own_cores(s):
                alone = self._fast_price(s, global_batch)
            out = combine_entry(out, alone)
        return out

    def _fast_price(self, s, global_batch: int) -> dict:
        model = self.model
        # predict(), term for term (simlib/sim/cost.py)
        st, (sync, embed, opt), p = self.parts(s)
        m, v = s.num_micro_batches, s.virtual_stages
        act_bytes = s.micro_batch * model.seq_len // s.cp * model.hidden * (2 if s.mixed_precision else 4)
        t_fwd, t_bwd = st["forward"], st["backward"]
        tp_per_mb = st["forward_comm"] + st["backward_comm"]
        compute = m * (t_fwd + t_bwd)
        cp_comm, ep_comm = (m * st["cp_comm"], m * st["ep_comm"]) if s.cp > 1 or s.ep > 1 else (0.0, 0.0)
        tp_comm = m * tp_per_mb - cp_comm - ep_comm  # the stage's comm holds the cp and ep collectives too
        bubble = s.pipeline_flushes * (s.pp - 1) * (t_fwd + t_bwd + tp_per_mb) / v if s.pp > 1 else 0.0
        if s.fsdp:
            f, p2p = self._small(s, st["layer_forward"], st["layer_backward"], act_bytes)
        else:
            f, p2p = self._small_p2p(s, act_bytes)
        pp_comm = (2 * m * v if s.pp > 1 else 0) * p2p
        if s.fsdp:
            dp_total, dp_exposed = f["step_total"], f["step_exposed"]
        else:
            dp_total, dp_exposed = sync.total, sync.exposed(t_fwd, t_bwd, s.overlap)
        exposed = tp_comm + cp_comm + ep_comm + pp_comm + dp_exposed + embed
        step = compute + bubble + exposed + opt
        mfu = self._flops * global_batch / (step * s.world_size * self.hw.peak(s.dtype, p))
        return dict(
            strategy=s,
            step_time=step,
            compute=compute,
            bubble=bubble,
            optimizer=opt,
            exposed_comm=exposed,
            tokens_per_s=global_batch * model.seq_len / step,
            mfu=mfu,
            tp_comm=tp_comm,
            cp_comm=cp_comm,
            ep_comm=ep_comm,
            pp_comm=pp_comm,
            dp_exposed=dp_exposed,
            dp_comm=dp_total,
            embedding_sync=embed,
            stage_idle=m * st["stage_excess"],
        )

    def _small_p2p(self, s, act_bytes):
        if s.pp == 1:
            return None, 0.0
        key = (act_bytes,) + tuple(getattr(s, n) for n in self._sync_fields)  # p2p_time reads the grid, dtype
        out = self._p2p.get(key)
        if out is None:
            from .topology import p2p_time

            out = self._p2p[key] = (None, p2p_time(act_bytes, s, self.hw))
        return out
