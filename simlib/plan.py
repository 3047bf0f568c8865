"""What a run is, before it runs: :class:`Plan` (how the work is split over the ranks) and :class:`OptimConfig`.

    plan = Plan(dp=2, accumulation=4)
    plan.validate(world_size=2, task=task)     # every rule, once: what would work instead when it cannot run

The rules on sizes (degrees, world size, batch split, sequence split, experts) are
:func:`simlib.parallel.dims.check`'s, shared with the rank grid and the simulator's ``Strategy``; the rules on how
the parts compose (cp/ep with tp, pp, ZeRO; ZeRO-3 with pp or tp; fp16 on CPU) and on what the task can do are
here. :func:`simlib.train.train` runs a plan; :func:`simlib.parallelize.parallelize` is the one place that reads it.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

import torch

from . import guards
from .parallel import dims
from .parallel.data import MODES as DP_VARIANTS
from .parallel.mesh import Mesh

PLAN_NAMES = ("single", "dp", "dp+acc", "tp", "pp", "cp")  # named plans: simlib train --plan NAME
SCHEDULES = ("gpipe", "1f1b")
PRECISIONS = (None, "bf16", "fp16")


@dataclass(frozen=True)
class Plan:
    """How the work is split: ``Mesh(dp, pp, tp, cp, ep)`` plus how each part runs. Validated on construction
    (types) and by :meth:`validate` (against the world size and the task).

    The world is ``dp x tp x pp x cp`` ranks. Context parallelism (``cp``) gives each of ``cp`` ranks a zig-zag
    slice of every sequence of its data-parallel share, attention runs as ring attention over them, and
    gradients are averaged over the ``dp x cp`` ranks. Expert parallelism (``ep``) shares a mixture-of-experts
    model's experts out over groups of ``ep`` of those ``dp x cp`` ranks (it divides ``dp x cp`` and adds no
    ranks); tokens travel to their experts by all-to-all. ``cp``/``ep`` compose with dp, accumulation,
    recomputation and bf16; with tp, pp or ZeRO they are refused by :meth:`validate`. ``sequence_parallel``
    (tp > 1, seq_len divisible by tp): Megatron's SP in the TP regions. ``mixed_precision`` with ``zero_stage=3``
    is FSDP2's policy (weights gathered in that dtype, fp32 reduce and shards); ZeRO-1/2 go with tp and pp."""

    dp: int = 1  # data-parallel degree
    tp: int = 1  # tensor-parallel degree (attention by heads, MLP by columns)
    sequence_parallel: bool = False  # with tp > 1: LayerNorms/residuals hold S/tp of the sequence (Megatron SP)
    pp: int = 1  # pipeline stages
    cp: int = 1  # context-parallel degree: each sequence split over cp ranks (ring attention)
    ep: int = 1  # expert-parallel degree: MoE experts shared out over ep of the dp x cp ranks
    dp_variant: str = "bucket"  # "bucket" | "flat" | "naive" (simlib.parallel.data) | "ddp" (torch)
    accumulation: int = 1  # gradient accumulation: forward+backward passes per step per DP rank
    pp_microbatches: int | None = None  # pipeline micro-batches per pass when pp > 1 (None: pp of them)
    schedule: str = "1f1b"  # pipeline schedule when pp > 1: "gpipe" | "1f1b"
    mixed_precision: str | None = None  # None | "bf16" (autocast, CPU or GPU) | "fp16" (GPU, loss scaling)
    loss_scaling: bool | None = None  # dynamic loss scaling (None: on for fp16 only; True also works in fp32)
    activation_checkpointing: bool = False  # recompute each block's activations in backward
    zero_stage: int = 0  # 0: plain DP; 1-3: simlib.parallel.zero
    checkpoint_dir: str | None = None  # simlib.checkpoint: resume from here if a checkpoint exists
    checkpoint_every: int = 0  # save every k steps (0: never)
    bucket_cap_mb: float = 25.0  # gradient bucket size of the bucketed / DDP wrappers
    sync_batchnorm: bool = False  # BatchNorm statistics over the whole DP group (simlib.parallel.batchnorm)

    def __post_init__(self):
        dims.check_sizes(
            "plan",
            dp=self.dp,
            tp=self.tp,
            pp=self.pp,
            cp=self.cp,
            ep=self.ep,
            accumulation=self.accumulation,
            zero_stage=self.zero_stage,
        )
        m = self.pp_microbatches
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"Plan.pp_microbatches must be an int >= 1 or None, got {m!r}")
        if m is not None and self.pp == 1:
            raise ValueError(
                f"Plan.pp_microbatches={m} splits a pipeline's batch, but pp=1: for gradient "
                f"accumulation use Plan(accumulation={m})"
            )
        if self.loss_scaling not in (None, True, False):
            raise ValueError(f"Plan.loss_scaling must be None, True or False, got {self.loss_scaling!r}")
        if self.dp_variant not in DP_VARIANTS:
            raise ValueError(f"Plan.dp_variant {self.dp_variant!r} is unknown: use one of {DP_VARIANTS}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"Plan.schedule {self.schedule!r} is unknown: use one of {SCHEDULES}")
        if self.mixed_precision not in PRECISIONS:
            raise ValueError(f"Plan.mixed_precision {self.mixed_precision!r} is unknown: use one of {PRECISIONS}")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ValueError("Plan.checkpoint_every needs a checkpoint_dir to save into")
        guards.check_plan_fields(self)  # every other field

    @property
    def mesh(self) -> Mesh:
        return Mesh(dp=self.dp, pp=self.pp, tp=self.tp, cp=self.cp, ep=self.ep)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def microbatches(self) -> int:
        """Pipeline micro-batches per forward+backward pass (1 without pipeline parallelism)."""
        return 1 if self.pp == 1 else (self.pp_microbatches or self.pp)

    @property
    def scales_loss(self) -> bool:
        """Whether the loop scales the loss (``loss_scaling``, or fp16 when it is None)."""
        return self.mixed_precision == "fp16" if self.loss_scaling is None else self.loss_scaling

    @property
    def label(self) -> str:
        """A short name for tables and plots, e.g. ``dp2 acc4`` or ``pp2 1f1b m4``."""
        parts = [
            f"{axis}{n}"
            for axis, n in (("dp", self.dp), ("tp", self.tp), ("pp", self.pp), ("cp", self.cp), ("ep", self.ep))
            if n > 1
        ]
        if self.pp > 1:
            parts.append(f"{self.schedule} m{self.microbatches}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.accumulation > 1:
            parts.append(f"acc{self.accumulation}")
        if self.mixed_precision:
            parts.append(self.mixed_precision)
        if self.zero_stage:
            parts.append(f"zero{self.zero_stage}")
        return " ".join(parts) or "1 process"

    def validate(self, world_size: int | None = None, task=None) -> None:
        """Raise ``ValueError`` saying what would work if this plan cannot run ``task`` on ``world_size`` ranks.

        The one check of every combination, before anything launches (torchtitan's ``ParallelDims``): ``simlib
        train``, ``train_on`` and the trainer ask it, and it checks once: a plan that passed for this world and
        an equal task (the same dataclass fields) answers at once, here or after travelling to a worker.
        ``world_size`` None: the plan's own.
        """
        world_size = self.world_size if world_size is None else world_size
        key = (world_size, _task_key(task), torch.cuda.is_available())
        if self.__dict__.get("_validated") == key:
            return
        dims.check(
            dp=self.dp,
            tp=self.tp,
            pp=self.pp,
            cp=self.cp,
            ep=self.ep,
            zero_stage=self.zero_stage,
            world_size=world_size,
            accumulation=self.accumulation,
            microbatches=self.microbatches,
        )
        _check_compositions(self)
        if task is not None:
            _check_task(self, task)
        object.__setattr__(self, "_validated", key)  # a memo, not a field: equality and replace() ignore it


def _task_key(task):
    """What makes two tasks the same for validation: a dataclass's fields (its repr), else the object itself."""
    if task is None:
        return None
    return (type(task).__qualname__, repr(task)) if dataclasses.is_dataclass(task) else ("id", id(task))


def _check_compositions(plan) -> None:
    """How the parts compose, whatever the task."""
    _check_context_experts(plan)
    if plan.sequence_parallel and plan.tp == 1:
        raise ValueError(
            "sequence_parallel=True splits the sequence over the tensor-parallel ranks, but tp=1: "
            "use tp >= 2 with it (e.g. Plan(tp=2, sequence_parallel=True)), or sequence_parallel=False"
        )
    if plan.mixed_precision == "fp16" and not torch.cuda.is_available():
        raise ValueError(
            "fp16 needs a GPU (autocast to fp16 and loss scaling); on CPU use mixed_precision='bf16' "
            "(fp32's range, no scaling), or Plan(loss_scaling=True) to run the scaling path in fp32"
        )
    if plan.zero_stage == 3 and plan.pp > 1:
        raise ValueError(
            f"zero_stage=3 with pp={plan.pp} is refused (as DeepSpeed does): every micro-batch would "
            "all-gather each stage's weights again. Use zero_stage=1 or 2 with pp > 1 (optimizer "
            "states and gradients sharded over each stage's DP group), or zero_stage=3 with pp=1"
        )
    if plan.zero_stage == 3 and plan.tp > 1:
        raise ValueError(
            f"zero_stage=3 with tp={plan.tp} is not supported: ZeRO-3 here gathers whole blocks, not "
            "TP shards. Use zero_stage=1 or 2 with tp > 1 (sharded over each TP rank's DP group, as "
            "Megatron's distributed optimizer), or zero_stage=3 with tp=1"
        )


def _check_task(plan, task) -> None:
    """What the task must offer for this plan, its own limits (``check_plan``), and the sizes it brings."""
    for degree, method in ((plan.tp, "tensor_parallel"), (plan.pp, "pipeline_stages"), (plan.cp, "context_parallel")):
        if degree > 1 and not hasattr(task, method):
            raise ValueError(
                f"task {task.name!r} has no {method}(): it cannot be split that way; "
                "use data parallelism (dp) only, or a task that implements it (the GPT)"
            )
    if plan.sequence_parallel and (
        "sequence_parallel" not in inspect.signature(task.tensor_parallel).parameters
        or not isinstance(getattr(task, "seq_len", None), int)
    ):
        raise ValueError(
            f"task {task.name!r} has no tensor_parallel(..., sequence_parallel) and seq_len: it "
            "cannot split its sequences; use sequence_parallel=False, or a task that does (the GPT)"
        )
    if plan.activation_checkpointing and not hasattr(task, "blocks"):
        raise ValueError(f"task {task.name!r} has no blocks(): activation checkpointing needs them")
    seq_len = getattr(task, "seq_len", None)
    dims.check(
        dp=plan.dp,
        tp=plan.tp,
        pp=plan.pp,
        cp=plan.cp,
        ep=plan.ep,
        seq_len=seq_len if isinstance(seq_len, int) and (plan.cp > 1 or plan.sequence_parallel) else None,
        sequence_parallel=plan.sequence_parallel,
        heads=getattr(task, "num_heads", 1),
        experts=getattr(task, "moe_experts", 0) or 0,
        task=task.name,
    )
    if hasattr(task, "check_plan"):
        task.check_plan(plan)  # the model's own limits: heads, layers, widths
    dims.check(
        dp=plan.dp, global_batch=task.global_batch, accumulation=plan.accumulation, microbatches=plan.microbatches
    )


def _check_context_experts(plan) -> None:
    """How cp and ep compose: world = dp x cp (x tp x pp); ep divides dp x cp (``dims.check``). The rest is
    refused here."""
    if plan.cp == 1 and plan.ep == 1:
        return
    which = " and ".join(f"{k}={getattr(plan, k)}" for k in ("cp", "ep") if getattr(plan, k) > 1)
    world = plan.world_size  # the suggestions use every rank for dp x cp
    ok = [
        f"Plan({', '.join(f'{k}={v}' for k, v in (('dp', world // c), ('cp', c), ('ep', e)) if v > 1)})"
        for c in dims.divisors(world)
        for e in dims.divisors(world)
        if c * e > 1
    ][:6]
    works = f"plans that work on these {world} ranks: {', '.join(ok)}"
    for name, why, off in (
        ("tp", "tensor parallelism", 1),
        ("pp", "pipeline parallelism", 1),
        ("zero_stage", "ZeRO", 0),
    ):
        if getattr(plan, name) != off:
            raise ValueError(
                f"{which} with {name}={getattr(plan, name)} is not supported: here context and expert "
                f"parallelism compose with data parallelism (world = dp x cp; ep divides dp x cp), "
                f"accumulation, activation checkpointing and bf16, not with {why}. Use {works}"
            )
    if plan.ep > 1 and plan.dp_variant != "bucket":
        raise ValueError(
            f"ep={plan.ep} averages gradients itself (shared weights over dp x cp, each expert over "
            f"the ranks holding it), so dp_variant={plan.dp_variant!r} would not be used: leave "
            "dp_variant at its default ('bucket')"
        )


def named_plan(name: str, world_size: int, micro_batches: int = 4) -> Plan:
    """The plan called ``name`` (one of :data:`PLAN_NAMES`) on ``world_size`` processes: every rank in that one
    dimension (``dp+acc``: with ``micro_batches`` accumulation steps; ``pp``: that many pipeline micro-batches)."""
    if name not in PLAN_NAMES:
        raise ValueError(f"unknown plan {name!r}: use one of {PLAN_NAMES}")
    if name == "single" or world_size == 1:
        if name == "single" and world_size != 1:
            raise ValueError(
                f"plan 'single' runs on 1 process, not {world_size}: use --world-size 1, or a plan that "
                f"splits the work ({', '.join(n for n in PLAN_NAMES if n != 'single')})"
            )
        return Plan()
    return {
        "dp": lambda: Plan(dp=world_size),
        "dp+acc": lambda: Plan(dp=world_size, accumulation=micro_batches),
        "tp": lambda: Plan(tp=world_size),
        "pp": lambda: Plan(pp=world_size, pp_microbatches=max(micro_batches, world_size)),
        "cp": lambda: Plan(cp=world_size),
    }[name]()  # cp: each sequence split zig-zag, ring attention


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and learning-rate schedule (linear warm-up, then cosine decay to ``min_lr_ratio`` x lr)."""

    name: str = "adamw"  # "adamw" | "sgd"
    lr: float = 3e-4
    weight_decay: float = 0.0  # on matrices only (not biases, not LayerNorm gains)
    betas: tuple = (0.9, 0.95)
    momentum: float = 0.0  # sgd
    warmup_steps: int = 0
    schedule: str = "cosine"  # "cosine" | "constant"
    decay_steps: int | None = None  # cosine horizon (default: the step budget)
    min_lr_ratio: float = 0.1
    grad_clip: float | None = None  # max global gradient norm (None: no clipping)

    def __post_init__(self):
        guards.check_optim(self)  # every field, one line naming the wrong one


__all__ = ["Plan", "OptimConfig", "named_plan", "PLAN_NAMES", "SCHEDULES", "PRECISIONS", "DP_VARIANTS"]
