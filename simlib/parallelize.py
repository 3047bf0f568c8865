"""``parallelize``: the one place that reads a :class:`simlib.train.Plan` and applies it to a model.

In torchtitan's spirit (``parallelize_llama``): the library holds mechanisms, this function composes them
in a fixed order, and the training loop never asks which were applied.

    1. tensor parallelism     ``task.tensor_parallel(model, tp_group, log)``   (simlib.parallel.tensor);
                              ``plan.sequence_parallel``: with ``sequence_parallel=True``, and after each
                              backward the replicated weights' gradients summed over the TP group
    2. activation checkpoint  ``torch.utils.checkpoint`` around each of ``task.blocks(model)``
    3. pipeline parallelism   ``task.pipeline_stages(model, pp_rank, pp)`` run by the schedules-as-data
                              executor (simlib.parallel.pipeline); gradients all-reduced over the DP group
                              once after the pipeline flush (ZeRO-1: then each DP rank steps what it owns;
                              ZeRO-2: each gradient reduced to its owner instead); TP (step 1) runs inside
                              each stage, so dp x tp x pp compose (Megatron's 3D)
    4. data parallelism       a ``simlib.parallel.data`` wrapper (or torch DDP) over the DP group, with
                              ``no_sync`` on every micro-batch but the last; ZeRO (``plan.zero_stage``) instead
                              wraps with ``simlib.parallel.zero`` (stages 1, 2) or ``zero3`` (stage 3)
    (``plan.sync_batchnorm``: first, every BatchNorm becomes ``simlib.parallel.batchnorm.SyncBatchNorm`` over the
    DP group, so its statistics cover the global batch)
    context / experts         ``plan.cp``: ``task.context_parallel(model, split)`` (ring attention over the CP
                              group, ``simlib.parallel.context``); each step cuts the sequences of this rank's
                              samples into its zig-zag slice, and data parallelism (step 4) runs over the
                              ``dp x cp`` ranks. MoE layers (``simlib.parallel.experts.MoEFeedForward``) route
                              over the step's whole batch (the ``dp x cp`` ranks); ``plan.ep``: each keeps its
                              ``E / ep`` experts, and the gradients are averaged after the backward, shared
                              weights over ``dp x cp``, each expert over the ranks holding it

It returns a :class:`ParallelModel`: the local module the optimizer updates, and one method,
``forward_backward(x, y)``, that runs one step's forward and backward on this rank's share of the batch
whatever the plan. Mixed precision is ``torch.autocast`` around the forward (and the loss).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from . import pieces
from .parallel import accumulate, precision, schedules
from .parallel import data as dp_lib
from .parallel import pipeline as pp_lib


def _span(timeline, kind, name=None):
    return timeline.span(kind, name=name) if timeline is not None else nullcontext()


def autocast(plan, device: torch.device):
    """The autocast context of ``plan.mixed_precision`` (None: full precision): ``simlib.parallel.precision``'s."""
    return precision.autocast(device, plan.mixed_precision)


def checkpoint_blocks(blocks) -> None:
    """Recompute each block's activations in backward instead of keeping them (``torch.utils.checkpoint``)."""
    from .parallel import recompute  # the one implementation (lesson 07 teaches it)

    recompute.checkpoint_blocks(blocks)


def tensor_parallel_sharded(module: nn.Module) -> set[int]:
    """ids of the parameters split over the tensor-parallel group (the rest are replicated)."""
    from .parallel.tensor import ColumnParallelLinear, RowParallelLinear

    ids = set()
    for m in module.modules():
        if isinstance(m, ColumnParallelLinear):
            ids.update(id(p) for p in m.parameters())
        elif isinstance(m, RowParallelLinear):
            ids.add(id(m.weight))  # its bias is replicated: added once, after the all-reduce
    # a learner's split layers (a project's piece, e.g. the GPT's tp_attention) are marked where the slot builds them
    ids.update(id(p) for p in module.parameters() if getattr(p, "tensor_parallel_split", False))
    return ids


def unique_parameters(module: nn.Module) -> list[nn.Parameter]:
    return list({id(p): p for p in module.parameters()}.values())


@dataclass
class ParallelModel:
    """One rank's part of the model under a plan, and how to run a step on it."""

    module: nn.Module  # the local parameters (the optimizer updates these)
    groups: object  # simlib.parallel.mesh.MeshGroups
    plan: object  # simlib.train.Plan
    task: object
    device: torch.device
    full_model: nn.Module  # the model as built (for evaluation under PP)
    wrapped: nn.Module | None = None  # the DP wrapper, when there is one
    stages: list = field(default_factory=list)  # pipeline stages of this rank (pp > 1)
    tied: list = field(default_factory=list)  # parameters held by the first and last pipeline stage
    activation: tuple | None = None  # (shape after the micro-batch dim, dtype) between stages
    timeline: object = None
    scaler: object = None  # simlib.parallel.precision.LossScaler when the plan scales the loss
    zero_optimizer: object = None  # ZeRO-1/2: the ShardedOptimizer (its owner of each parameter)
    split: object = None  # cp > 1: the simlib.parallel.context.ContextSplit of every step
    moe: list = field(default_factory=list)  # the model's MoE layers when dp x cp > 1 (MoEFeedForward)
    step_fn: object = None  # the plan's forward + backward, chosen once by :meth:`choose_step` (parallelize)

    # ── data ──
    def shard(self, x, y):
        """This rank's contiguous share of the global batch: block ``dp_rank`` of ``dp``."""
        dp, r = self.plan.dp, self.groups.dp_rank
        n = x.shape[0] // dp
        return x[r * n : (r + 1) * n].to(self.device), y[r * n : (r + 1) * n].to(self.device)

    # ── one step ──
    def choose_step(self) -> ParallelModel:
        """Decide once, as the model is built, which step this plan runs: the pipeline schedule (pp > 1), the
        context/expert step (cp > 1 or MoE layers over several ranks) or the accumulation step."""
        if self.plan.pp > 1:
            self.step_fn = self._pipeline_step
        elif self.split is not None or self.moe:
            self.step_fn = self._context_expert_step
        else:
            self.step_fn = self._accumulation_step
        return self

    def forward_backward(self, x, y):
        """Forward and backward of this rank's share (x, y); gradients end up averaged over the DP group.

        Returns this rank's mean loss (a float), or None on pipeline ranks without the last stage.
        """
        loss = self.step_fn(x, y)
        if self.plan.sequence_parallel:
            with _span(self.timeline, "comm", "sequence-parallel grads"):
                self._sum_sequence_parallel()
        return loss

    def _sum_sequence_parallel(self) -> None:
        """Sequence parallelism: each TP rank's gradient of a replicated weight (LayerNorms, embeddings, the
        row-parallel biases) covers its block of the sequence only; the sum over the TP group is the whole."""
        split = tensor_parallel_sharded(self.module)
        grads = [p.grad for p in unique_parameters(self.module) if p.grad is not None and id(p) not in split]
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.groups.tp_group)
            for g, part in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(part.view_as(g))

    def _context_expert_step(self, x, y):
        """The accumulation step with this rank's slice of each sequence (cp) and the MoE layers routing over
        the ``dp x cp`` ranks; under ep, then the gradients averaged (:meth:`_average_expert_parallel`)."""
        from contextlib import ExitStack

        plan, g = self.plan, self.groups
        with ExitStack() as scope:
            if self.split is not None:
                x, y = self.split.shard(x, 1), self.split.shard(y, 1)
                scope.enter_context(self.split.on())
            # the auxiliary loss's weight: the ranks its gradient is averaged over, the 1/k, the loss scale
            aux_scale = plan.dp * plan.cp / plan.accumulation * (self.scaler.scale if self.scaler else 1.0)
            for layer in self.moe:
                scope.enter_context(layer.over(g.dp_cp_group, aux_scale))
            loss = self._accumulation_step(x, y)
        if plan.ep > 1:
            with _span(self.timeline, "comm", "expert-parallel grads"):
                self._average_expert_parallel()
        return loss

    def expert_parameter_ids(self) -> set[int]:
        return {id(p) for layer in self.moe for p in layer.expert_parameters}

    def _average_expert_parallel(self) -> None:
        """Shared weights: mean over the dp x cp ranks. An expert's gradient already sums what the tokens of
        its EP group sent it; the mean over the ranks holding that expert, / ep, is its share of the mean loss."""
        plan, g = self.plan, self.groups
        experts = self.expert_parameter_ids()
        params = [p for p in unique_parameters(self.module) if p.grad is not None]
        dp_lib.all_reduce_mean_flat([p.grad for p in params if id(p) not in experts], group=g.dp_cp_group)
        mine = [p.grad for p in params if id(p) in experts]
        if plan.dp * plan.cp > plan.ep:
            dp_lib.all_reduce_mean_flat(mine, group=g.expert_dp_group)
        for grad in mine:
            grad.div_(plan.ep)

    def _accumulation_step(self, x, y):
        """Lesson 03's ``accumulation_step`` (1/k per micro-batch, ``no_sync`` but on the last), without its
        optimizer step: the loop unscales, clips and steps."""
        model = self.wrapped if self.wrapped is not None else self.module
        return accumulate.accumulation_step(
            model,
            None,
            list(zip(x.chunk(self.plan.accumulation), y.chunk(self.plan.accumulation))),
            loss_fn=self.task.loss,
            timeline=self.timeline,
            autocast=lambda: autocast(self.plan, self.device),
            loss_scale=self.scaler.scale if self.scaler is not None else 1.0,
        )

    def _pipeline_step(self, x, y):
        """``plan.accumulation`` passes of the schedule over ``plan.microbatches`` micro-batches each; gradients
        add up over the passes, then one all-reduce over the DP group."""
        plan, g = self.plan, self.groups
        k, m = plan.accumulation, plan.microbatches
        make = schedules.one_f_one_b if plan.schedule == "1f1b" else schedules.gpipe
        actions = make(plan.pp, m)[g.pp_rank]
        shape, dtype = self.activation
        factor = (self.scaler.scale if self.scaler is not None else 1.0) / k  # 1/k: the mean over the passes

        def loss_fn(output, target):
            loss = self.task.loss(output, target)
            return loss * factor if factor != 1 else loss

        total = None
        for xk, yk in zip(x.chunk(k), y.chunk(k)):
            xs, ys = list(xk.chunk(m)), list(yk.chunk(m))
            with autocast(self.plan, self.device):
                out = pp_lib.run_schedule(
                    actions,
                    self.stages,
                    xs,
                    ys,
                    activation_shape=(xs[0].shape[0], *shape),
                    loss_fn=loss_fn,
                    group=g.pp_group,
                    timeline=self.timeline,
                    dtype=dtype,
                )
            if out["loss"] is not None:
                total = (total or 0.0) + float(out["loss"]) / factor / k
        with _span(self.timeline, "comm", "tied + data-parallel grads"):
            self._sync_tied()
            if plan.dp > 1 and plan.zero_stage == 2:
                self._reduce_to_owners()
            elif plan.dp > 1:
                grads = [p.grad for p in unique_parameters(self.module) if p.grad is not None]
                dp_lib.all_reduce_mean_flat(grads, group=g.dp_group)
        return total

    def _reduce_to_owners(self) -> None:
        """ZeRO-2 under PP: each gradient averaged onto its owner in this stage's DP group, freed elsewhere."""
        opt, group = self.zero_optimizer, self.groups.dp_group
        for p in unique_parameters(self.module):
            if p.grad is None:
                continue
            owner = opt.owner[p]
            dist.reduce(p.grad, dst=dist.get_global_rank(group, owner), group=group)
            if owner == opt.rank:
                p.grad.div_(self.plan.dp)
            else:
                p.grad = None

    def _sync_tied(self) -> None:
        """Sum the gradients of parameters held by both the first and the last stage (a tied head)."""
        mine = {id(p) for p in self.module.parameters()}
        for p in self.tied:
            held = id(p) in mine and p.grad is not None
            grad = p.grad if held else torch.zeros_like(p, device=self.device)
            dist.all_reduce(grad, group=self.groups.pp_group)
            if held:
                p.grad = grad

    # ── what evaluation sees ──
    def eval_model(self) -> nn.Module:
        """A module whose forward gives the whole model's output on this rank (a collective under TP / PP).

        TP: the split model itself (its forward all-reduces). PP: every stage's parameters are broadcast
        into this rank's full copy of the model, which then runs locally.
        """
        if self.plan.pp == 1:
            return self.module
        g, mesh = self.groups, self.plan.mesh
        pipeline = [int(r) for r in mesh.grid[g.dp_rank, :, g.cp_rank, g.tp_rank]]
        for stage in range(self.plan.pp):
            owned = unique_parameters(nn.ModuleList(self.task.pipeline_stages(self.full_model, stage, self.plan.pp)))
            for p in owned:
                dist.broadcast(p.data, src=pipeline[stage], group=g.pp_group)
        return self.full_model

    def global_loss(self, loss) -> float:
        """The step's loss over the global batch (a collective: every rank calls it)."""
        g = self.groups
        holder = loss is not None and g.tp_rank == 0 and g.pp_is_last_stage
        t = torch.tensor([loss if holder else 0.0], dtype=torch.float64, device=self.device)  # NCCL: on the GPU
        if dist.get_world_size() > 1:
            dist.all_reduce(t)
        return float(t) / (self.plan.dp * self.plan.cp)  # cp: each rank's mean over its equal slice


def parallelize(model: nn.Module, groups, plan, task, device=None, timeline=None) -> ParallelModel:
    """Apply ``plan`` to ``model`` (built identically on every rank); see the module docstring for the order."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    full_model = model
    if plan.tp > 1:
        from .parallel.tensor import CommLog

        sp = {"sequence_parallel": True} if plan.sequence_parallel else {}
        model = task.tensor_parallel(model, groups.tp_group, log=CommLog(timeline=timeline), **sp).to(device)
    if plan.sync_batchnorm and plan.dp > 1:
        from .parallel.batchnorm import convert_sync_batchnorm

        model = convert_sync_batchnorm(model, groups.dp_group)
    if plan.activation_checkpointing:
        blocks = task.blocks(model)
        inside = {id(m) for m in model.modules()}
        stray = [type(b).__name__ for b in blocks if id(b) not in inside]
        if stray:  # recomputing a module the forward never calls would silently save nothing
            raise ValueError(
                f"{type(task).__name__}.blocks() returned {len(stray)} module(s) that are not part of "
                "the model (new containers?): return the model's own block modules so that "
                "activation checkpointing wraps what the forward runs"
            )
        checkpoint_blocks(blocks)
    pm = ParallelModel(model, groups, plan, task, device, full_model, timeline=timeline)
    _apply_context_experts(pm, model, groups, plan, task)
    if plan.scales_loss:
        pm.scaler = precision.LossScaler()  # agreed over every rank: TP/PP/ZeRO ranks hold different gradients
    if plan.pp > 1:
        first = task.pipeline_stages(model, 0, plan.pp)[0]
        x, _ = task.batch(0)
        with torch.no_grad(), autocast(plan, device):
            probe = first(x[:1].to(device))
        pm.activation = (tuple(probe.shape[1:]), probe.dtype)
        pm.stages = task.pipeline_stages(model, groups.pp_rank, plan.pp)
        pm.module = nn.ModuleList(pm.stages)
        pm.tied = list(getattr(task, "tied_parameters", lambda m: [])(model))
        if plan.dp > 1:
            dp_lib.broadcast_parameters(pm.module, group=groups.dp_group)
        return pm.choose_step()
    if plan.zero_stage:
        blocks = task.blocks(model) if plan.zero_stage == 3 and hasattr(task, "blocks") else None
        pm.wrapped = apply_zero(
            model,
            plan.zero_stage,
            groups.dp_group,
            blocks=blocks,
            param_dtype=precision.DTYPES.get(plan.mixed_precision) if plan.zero_stage == 3 else None,
        )
        if plan.zero_stage == 3:
            pm.module = pm.wrapped  # its parameters are the shards; its forward gathers each block
    elif plan.dp * plan.cp > 1 and plan.ep == 1:  # ep: _average_expert_parallel
        learner = pieces.get("grad_sync")  # a project's slot: the learner's gradient synchronisation, if given
        if learner is not None:
            from .parallel.learner_pieces import learner_grad_sync

            pm.wrapped = learner_grad_sync(learner, model, plan, timeline, groups.dp_cp_group)
        else:
            wrap = getattr(task, "data_parallel", None) or dp_lib.wrap  # a task's own wrapper (a project's slot)
            pm.wrapped = wrap(model, plan.dp_variant, plan.bucket_cap_mb, timeline, group=groups.dp_cp_group)
    return pm.choose_step()


def _apply_context_experts(pm: ParallelModel, model: nn.Module, groups, plan, task) -> None:
    """cp: ring attention over the CP group (the task's ``context_parallel``); MoE layers: routing over the
    ``dp x cp`` ranks, and under ep each layer keeps its share of the experts."""
    cp, ep = plan.cp, plan.ep
    if cp > 1:
        from .parallel.context import ContextSplit

        pm.split = ContextSplit(groups.cp_group, layout="zigzag")  # causal work balanced over the CP ranks
        task.context_parallel(model, pm.split)
    if plan.dp * cp > 1:
        from .parallel.experts import MoEFeedForward

        pm.moe = [m for m in model.modules() if isinstance(m, MoEFeedForward)]
    if ep > 1:
        from .parallel import dims

        dims.check(dp=plan.dp, cp=cp, ep=ep, experts=len(pm.moe), task=f"{task.name} ({type(model).__name__})")
        for layer in pm.moe:
            layer.shard_experts(groups.ep_group)


def apply_zero(model: nn.Module, stage: int, group, blocks=None, comm_counter=None, param_dtype=None) -> nn.Module:
    """ZeRO ``stage`` over the data-parallel ``group``: ``ZeroDataParallel`` (stages 1, 2: attach its
    ``ShardedOptimizer`` next) or ``Zero3`` (stage 3: each of ``blocks`` sharded; None: ``blocks_of(model)``;
    ``param_dtype``: FSDP2's mixed-precision policy, weights cast before the all-gather, gradients reduced in fp32)."""
    from .parallel import dims

    dims.check(zero_stage=stage)
    if stage == 0:
        raise ValueError("apply_zero(stage=0): stage 0 is plain data parallelism, use simlib.parallel.data.wrap")
    if stage in (1, 2):
        from .parallel.zero import ZeroDataParallel

        return ZeroDataParallel(model, stage=stage, group=group, comm_counter=comm_counter)
    from .parallel.zero3 import Zero3

    return Zero3(model, blocks=blocks, group=group, comm_counter=comm_counter, param_dtype=param_dtype)


def build_optimizer(pm: ParallelModel, plan, optim, total_steps: int | None):
    """The optimizer over this rank's parameters and its learning-rate schedule (warm-up, then cosine)."""
    import math

    params = unique_parameters(pm.module)
    decay = [p for p in params if p.dim() >= 2]  # weights decay; biases and LayerNorm gains do not
    no_decay = [p for p in params if p.dim() < 2]
    param_groups = [dict(params=decay, weight_decay=optim.weight_decay), dict(params=no_decay, weight_decay=0.0)]
    if optim.name == "adamw":
        cls, hyper = torch.optim.AdamW, dict(lr=optim.lr, betas=optim.betas)
    else:
        cls, hyper = torch.optim.SGD, dict(lr=optim.lr, momentum=optim.momentum)
    if plan.zero_stage in (1, 2):  # each DP rank steps the optimizer states of the parameters it owns
        from .parallel.zero import ShardedOptimizer

        optimizer = ShardedOptimizer([g for g in param_groups if g["params"]], cls, group=pm.groups.dp_group, **hyper)
        if pm.wrapped is not None:
            pm.wrapped.attach(optimizer)
        # (under PP there is no wrapper: the pipeline step reduces the gradients, ZeRO-2 to their owners)
        pm.zero_optimizer = optimizer  # clipping counts each gradient on its owner only
    elif plan.zero_stage == 3:  # each DP rank steps its flat shards
        from .parallel.zero3 import check_elementwise

        check_elementwise(cls, dist.get_rank())
        optimizer = cls(pm.wrapped.param_groups(weight_decay=optim.weight_decay), **hyper)
    else:
        optimizer = cls(param_groups, **hyper, **fused_adamw(cls, params))
    horizon = optim.decay_steps or total_steps

    def factor(step: int) -> float:
        if optim.warmup_steps and step < optim.warmup_steps:
            return (step + 1) / optim.warmup_steps
        if optim.schedule != "cosine" or not horizon:
            return 1.0
        progress = min(1.0, (step - optim.warmup_steps) / max(1, horizon - optim.warmup_steps))
        return optim.min_lr_ratio + (1 - optim.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def fused_adamw(cls, params) -> dict:
    """``{"fused": True}`` for AdamW when every parameter is a floating-point CUDA tensor and this torch has the
    fused kernel (one launch for the whole update instead of several per tensor); else ``{}`` (CPU: foreach)."""
    import inspect

    if cls is not torch.optim.AdamW or "fused" not in inspect.signature(cls).parameters:
        return {}
    ok = bool(params) and all(p.is_cuda and p.is_floating_point() for p in params)
    return {"fused": True} if ok else {}


def clip_grad_norm(pm: ParallelModel, max_norm: float) -> float:
    """Clip the gradient norm of the WHOLE model (all stages, all TP shards) to ``max_norm``; return it.

    Squares of TP-split parameters are summed over the TP group, replicated ones counted once; stages
    add up over the pipeline group; a tied parameter counts on the first stage only. So the norm (and the
    clipping) equals ``torch.nn.utils.clip_grad_norm_`` on the unsplit model.
    """
    g, plan = pm.groups, pm.plan
    if plan.zero_stage == 3:  # each rank holds the gradient shards of its flat shards
        from .parallel.zero import clip_grad_norm_

        module = pm.wrapped if pm.wrapped is not None else pm.module
        return float(clip_grad_norm_(list(module.parameters()), max_norm, group=g.dp_group))
    sharded = tensor_parallel_sharded(pm.module) if plan.tp > 1 else set()
    experts = pm.expert_parameter_ids() if plan.ep > 1 else set()
    shared_out = torch.zeros((), dtype=torch.float64, device=pm.device)  # ep: each rank's own experts
    tied = {id(p) for p in pm.tied} if not g.pp_is_first_stage else set()
    params = [p for p in unique_parameters(pm.module) if p.grad is not None]
    owned = (
        {id(p) for p, r in pm.zero_optimizer.owner.items() if r == pm.zero_optimizer.rank}
        if pm.zero_optimizer is not None
        else None
    )
    split = torch.zeros((), dtype=torch.float64, device=pm.device)
    rest = torch.zeros((), dtype=torch.float64, device=pm.device)
    for p in params:
        if owned is not None and id(p) not in owned:  # ZeRO under PP: each DP rank counts what it owns
            continue
        sq = p.grad.detach().double().pow(2).sum()
        if id(p) in sharded:
            split += sq
        elif id(p) in experts:
            shared_out += sq
        elif id(p) not in tied:
            rest += sq

    blocking = plan.tp > 1 or experts or plan.pp > 1 or (owned is not None and plan.dp > 1)
    with _span(pm.timeline if blocking else None, "comm", "gradient norm"):  # a blocking collective: exposed
        if plan.tp > 1:
            dist.all_reduce(split, group=g.tp_group)
        if experts:
            dist.all_reduce(shared_out, group=g.ep_group)
        total = split + rest + shared_out
        if plan.pp > 1:
            dist.all_reduce(total, group=g.pp_group)
        if owned is not None and plan.dp > 1:
            dist.all_reduce(total, group=g.dp_group)
    norm = float(total.sqrt())
    coef = max_norm / (norm + 1e-6)
    if coef < 1:
        for p in params:
            p.grad.mul_(coef)
    return norm
