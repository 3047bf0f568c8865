"""THE training loop: a Task, a Plan and a budget in, a run record out. Every run that trains uses it.

    from simlib.train import Plan, OptimConfig, train
    record = train(task, Plan(dp=2, accumulation=2), steps=200, optim=OptimConfig(lr=3e-4),
                   eval_every=50, out_dir="results/gpt/dp2")      # on every rank (simlib.launch, torchrun, ...)

A :class:`Task` says what to learn (model, global batches, loss, evaluation); a :class:`Plan` says how to split
the work over the ranks; :func:`simlib.parallelize.parallelize` is the one place that reads the plan; the
loop below is the same for every plan. Global batches come from ``task.batch(step)``, identical for every
world size and plan, so runs compare step for step. Rank 0 writes ``out_dir/run.jsonl`` (one JSON object
per logged step and per evaluation) and ``out_dir/summary.json``; every rank gets the :class:`RunRecord`.
"""
from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist

from . import guards
from .checkpoint import rng_state, set_rng_state  # noqa: F401 - every generator a step may use
from .parallel.data import MODES as DP_VARIANTS
from .parallel.mesh import Mesh
from .parallelize import ParallelModel, build_optimizer, clip_grad_norm, parallelize, unique_parameters  # noqa: F401
from .record import RecordWriter, RunRecord, build_summary, step_row, time_to_target

SCHEDULES = ("gpipe", "1f1b")
PRECISIONS = (None, "bf16", "fp16")


@runtime_checkable
class Task(Protocol):
    """What a project provides (see ``simlib.tasks``). Optional: ``tensor_parallel(model, tp_group, log)``,
    ``pipeline_stages(model, pp_rank, pp_size)``, ``context_parallel(model, split)`` (batches (B, T, ...):
    the sequence on dim 1), ``moe_experts`` (its model's ``simlib.parallel.experts.MoEFeedForward`` layers),
    ``blocks(model)``, ``tied_parameters(model)``,
    ``tokens_per_sample`` and ``flops_per_sample`` (for tokens/s and MFU), ``check_plan(plan)``."""

    name: str
    global_batch: int

    def build_model(self): ...            # seeded: the same weights whatever the world size
    def batch(self, step: int): ...       # the GLOBAL batch (x, y) of ``step``, deterministic
    def loss(self, output, target): ...   # mean over the samples given
    def evaluate(self, model) -> dict: ...  # held-out metrics, e.g. {"eval_loss": 2.1}


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

    dp: int = 1                          # data-parallel degree
    tp: int = 1                          # tensor-parallel degree (attention by heads, MLP by columns)
    sequence_parallel: bool = False      # with tp > 1: LayerNorms/residuals hold S/tp of the sequence (Megatron SP)
    pp: int = 1                          # pipeline stages
    cp: int = 1                          # context-parallel degree: each sequence split over cp ranks (ring attention)
    ep: int = 1                          # expert-parallel degree: MoE experts shared out over ep of the dp x cp ranks
    dp_variant: str = "bucket"           # "bucket" | "flat" | "naive" (simlib.parallel.data) | "ddp" (torch)
    accumulation: int = 1                # gradient accumulation: forward+backward passes per step per DP rank
    pp_microbatches: int | None = None   # pipeline micro-batches per pass when pp > 1 (None: pp of them)
    schedule: str = "1f1b"               # pipeline schedule when pp > 1: "gpipe" | "1f1b"
    mixed_precision: str | None = None   # None | "bf16" (autocast, CPU or GPU) | "fp16" (GPU, loss scaling)
    loss_scaling: bool | None = None     # dynamic loss scaling (None: on for fp16 only; True also works in fp32)
    activation_checkpointing: bool = False  # recompute each block's activations in backward
    zero_stage: int = 0                  # 0: plain DP; 1-3: simlib.parallel.zero
    checkpoint_dir: str | None = None    # simlib.checkpoint: resume from here if a checkpoint exists
    checkpoint_every: int = 0            # save every k steps (0: never)
    bucket_cap_mb: float = 25.0          # gradient bucket size of the bucketed / DDP wrappers
    sync_batchnorm: bool = False         # BatchNorm statistics over the whole DP group (simlib.parallel.batchnorm)

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "cp", "ep", "accumulation"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Plan.{name} must be an int >= 1, got {v!r}")
        m = self.pp_microbatches
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"Plan.pp_microbatches must be an int >= 1 or None, got {m!r}")
        if m is not None and self.pp == 1:
            raise ValueError(f"Plan.pp_microbatches={m} splits a pipeline's batch, but pp=1: for gradient "
                             f"accumulation use Plan(accumulation={m})")
        if self.loss_scaling not in (None, True, False):
            raise ValueError(f"Plan.loss_scaling must be None, True or False, got {self.loss_scaling!r}")
        if self.dp_variant not in DP_VARIANTS:
            raise ValueError(f"Plan.dp_variant {self.dp_variant!r} is unknown: use one of {DP_VARIANTS}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"Plan.schedule {self.schedule!r} is unknown: use one of {SCHEDULES}")
        if self.mixed_precision not in PRECISIONS:
            raise ValueError(f"Plan.mixed_precision {self.mixed_precision!r} is unknown: use one of {PRECISIONS}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"Plan.zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
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
        parts = [f"{axis}{n}" for axis, n in (("dp", self.dp), ("tp", self.tp), ("pp", self.pp), ("cp", self.cp),
                                              ("ep", self.ep)) if n > 1]
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

        The one check of every combination, before anything launches: the trainer, ``simlib train`` and
        ``sim.Strategy.from_plan`` call it (torchtitan's ``ParallelDims``). ``world_size`` None: the plan's own.
        """
        world_size = self.world_size if world_size is None else world_size
        if self.world_size != world_size:
            options = ", ".join(f"dp={world_size // (t * p)} tp={t} pp={p}" for t in _divisors(world_size)
                                for p in _divisors(world_size // t))
            cp = f" x cp={self.cp}" if self.cp > 1 else ""
            raise ValueError(f"plan dp={self.dp} x tp={self.tp} x pp={self.pp}{cp} needs {self.world_size} ranks but "
                             f"the world has {world_size}: use one of {options}"
                             + (f" (or dp={world_size // self.cp} cp={self.cp})" if cp and world_size % self.cp == 0
                                else ""))
        _check_context_experts(self)
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel=True splits the sequence over the tensor-parallel ranks, but tp=1: "
                             "use tp >= 2 with it (e.g. Plan(tp=2, sequence_parallel=True)), or sequence_parallel=False")
        if self.mixed_precision == "fp16" and not torch.cuda.is_available():
            raise ValueError("fp16 needs a GPU (autocast to fp16 and loss scaling); on CPU use mixed_precision='bf16' "
                             "(fp32's range, no scaling), or Plan(loss_scaling=True) to run the scaling path in fp32")
        if self.zero_stage == 3 and self.pp > 1:
            raise ValueError(f"zero_stage=3 with pp={self.pp} is refused (as DeepSpeed does): every micro-batch would "
                             "all-gather each stage's weights again. Use zero_stage=1 or 2 with pp > 1 (optimizer "
                             "states and gradients sharded over each stage's DP group), or zero_stage=3 with pp=1")
        if self.zero_stage == 3 and self.tp > 1:
            raise ValueError(f"zero_stage=3 with tp={self.tp} is not supported: ZeRO-3 here gathers whole blocks, not "
                             "TP shards. Use zero_stage=1 or 2 with tp > 1 (sharded over each TP rank's DP group, as "
                             "Megatron's distributed optimizer), or zero_stage=3 with tp=1")
        if task is None:
            return
        for degree, method in ((self.tp, "tensor_parallel"), (self.pp, "pipeline_stages"),
                               (self.cp, "context_parallel")):
            if degree > 1 and not hasattr(task, method):
                raise ValueError(f"task {task.name!r} has no {method}(): it cannot be split that way; "
                                 "use data parallelism (dp) only, or a task that implements it (the GPT)")
        if self.sequence_parallel and ("sequence_parallel" not in inspect.signature(task.tensor_parallel).parameters
                                       or not isinstance(getattr(task, "seq_len", None), int)):
            raise ValueError(f"task {task.name!r} has no tensor_parallel(..., sequence_parallel) and seq_len: it "
                             "cannot split its sequences; use sequence_parallel=False, or a task that does (the GPT)")
        if self.sequence_parallel and task.seq_len % self.tp:
            heads = getattr(task, "num_heads", 1)  # tp must divide the heads too (the GPT's check_plan)
            ok = [t for t in _divisors(task.seq_len) if t > 1 and heads % t == 0]
            raise ValueError(f"sequence_parallel=True splits each sequence over tp={self.tp} ranks, but seq_len is "
                             f"{task.seq_len}: use tp in {ok[:8]}, or sequence_parallel=False")
        if self.activation_checkpointing and not hasattr(task, "blocks"):
            raise ValueError(f"task {task.name!r} has no blocks(): activation checkpointing needs them")
        if hasattr(task, "check_plan"):
            task.check_plan(self)  # the model's own limits: heads, layers, widths
        if self.ep > 1 and not getattr(task, "moe_experts", 0):
            raise ValueError(f"task {task.name!r} has no mixture-of-experts layers (moe_experts): ep={self.ep} has "
                             "no experts to share out; use ep=1, or the GPT's MoE variant")
        per_rank = self.dp * self.accumulation * self.microbatches
        if task.global_batch % per_rank:
            m = self.microbatches
            ok = [k for k in range(1, task.global_batch + 1) if task.global_batch % (self.dp * k * m) == 0]
            pipe = f" x {m} pipeline micro-batches" if self.pp > 1 else ""
            use = (f"use accumulation in {ok[:8]}{' ...' if len(ok) > 8 else ''}, or" if ok else
                   f"no accumulation can fix that (it is not a multiple of dp x micro-batches = {self.dp * m}): use")
            raise ValueError(f"global batch {task.global_batch} does not split into dp={self.dp} ranks x "
                             f"{self.accumulation} accumulation steps{pipe}: {use} a global batch that is a multiple "
                             f"of {per_rank}")


def _check_context_experts(plan) -> None:
    """How cp and ep compose: world = dp x cp (x tp x pp); ep divides dp x cp. The rest is refused here."""
    if plan.cp == 1 and plan.ep == 1:
        return
    tokens = plan.dp * plan.cp
    which = " and ".join(f"{k}={getattr(plan, k)}" for k in ("cp", "ep") if getattr(plan, k) > 1)
    world = plan.world_size  # the suggestions use every rank for dp x cp
    ok = [f"Plan({', '.join(f'{k}={v}' for k, v in (('dp', world // c), ('cp', c), ('ep', e)) if v > 1)})"
          for c in _divisors(world) for e in _divisors(world) if c * e > 1][:6]
    works = f"plans that work on these {world} ranks: {', '.join(ok)}"
    if tokens % plan.ep:
        raise ValueError(f"ep={plan.ep} does not divide the dp x cp = {tokens} ranks that hold tokens (expert "
                         f"parallelism shares the experts out over them, it adds no ranks): {works}")
    for name, why, off in (("tp", "tensor parallelism", 1), ("pp", "pipeline parallelism", 1),
                           ("zero_stage", "ZeRO", 0)):
        if getattr(plan, name) != off:
            raise ValueError(f"{which} with {name}={getattr(plan, name)} is not supported: here context and expert "
                             f"parallelism compose with data parallelism (world = dp x cp; ep divides dp x cp), "
                             f"accumulation, activation checkpointing and bf16, not with {why}. Use {works}")
    if plan.ep > 1 and plan.dp_variant != "bucket":
        raise ValueError(f"ep={plan.ep} averages gradients itself (shared weights over dp x cp, each expert over "
                         f"the ranks holding it), so dp_variant={plan.dp_variant!r} would not be used: leave "
                         "dp_variant at its default ('bucket')")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and learning-rate schedule (linear warm-up, then cosine decay to ``min_lr_ratio`` x lr)."""

    name: str = "adamw"            # "adamw" | "sgd"
    lr: float = 3e-4
    weight_decay: float = 0.0      # on matrices only (not biases, not LayerNorm gains)
    betas: tuple = (0.9, 0.95)
    momentum: float = 0.0          # sgd
    warmup_steps: int = 0
    schedule: str = "cosine"       # "cosine" | "constant"
    decay_steps: int | None = None  # cosine horizon (default: the step budget)
    min_lr_ratio: float = 0.1
    grad_clip: float | None = None  # max global gradient norm (None: no clipping)

    def __post_init__(self):
        guards.check_optim(self)  # every field, one line naming the wrong one


@dataclass
class TrainState:
    """Everything a resumed run needs: model, optimizer, schedule, step, RNG and data position.

    The data position is the index of the next global batch (``task.batch(index)`` is a pure function of it;
    it moves with ``step`` unless a checkpoint restored one without the other), plus the samples and tokens
    seen; a resumed run continues with the very next global batch. A part missing from a loaded state dict
    (``checkpoint.load_latest(..., skip=...)``, lesson 08's bugs) stays as it is.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    step: int = 0
    data_step: int = 0        # the data position: index of the next global batch
    samples: int = 0
    tokens: int = 0
    train_time: float = 0.0   # seconds of training so far (evaluation and checkpoints left out)
    shard: str = ""           # which part of the model this rank holds when ranks differ (TP/PP/ZeRO), e.g. "pp1"
    scaler: object = None     # fp16's LossScaler: its scale and run of good steps resume with the run

    def state_dict(self) -> dict:
        model, optimizer = self.model.state_dict(), self.optimizer.state_dict()
        if self.shard:  # ranks hold different tensors under the same names: keep each part apart in the checkpoint
            model, optimizer = {self.shard: model}, {self.shard: optimizer}
        return {"model": model, "optimizer": optimizer,
                "scheduler": self.scheduler.state_dict(), "step": self.step,
                "data": {"next_step": self.data_step, "samples": self.samples, "tokens": self.tokens},
                "train_time": self.train_time, "rng": rng_state(),
                **({"loss_scaler": self.scaler.state_dict()} if self.scaler is not None else {})}

    def load_state_dict(self, state: dict) -> None:
        part = (lambda d: d[self.shard]) if self.shard else (lambda d: d)
        if "model" in state:
            self.model.load_state_dict(part(state["model"]))
        if "optimizer" in state:
            self.optimizer.load_state_dict(part(state["optimizer"]))
        if "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state.get("step", self.step))
        if "data" in state:
            self.data_step = int(state["data"]["next_step"])
            self.samples, self.tokens = int(state["data"]["samples"]), int(state["data"]["tokens"])
        self.train_time = float(state.get("train_time", self.train_time))
        if "loss_scaler" in state and self.scaler is not None:
            self.scaler.load_state_dict(state["loss_scaler"])
        if "rng" in state:
            set_rng_state(state["rng"])


def _budget_steps(task, steps, tokens, samples, seconds) -> int | None:
    if steps is not None:
        return int(steps)
    if samples is not None:
        return math.ceil(samples / task.global_batch)
    if tokens is not None:
        per_sample = getattr(task, "tokens_per_sample", None)
        if not per_sample:
            raise ValueError(f"task {task.name!r} has no tokens_per_sample: give steps= or samples= instead")
        return math.ceil(tokens / (task.global_batch * per_sample))
    return None  # seconds: decided while running


def _matmul_rate(device, size: int = 512, repeats: int = 5, dtypes=("float32",)) -> float:
    """FLOP/s of a size^3 matmul on this process (its threads), the best of ``repeats`` in each of ``dtypes``:
    MFU's yardstick (:func:`simlib.debug.mfu.measured_peak`; the best, so that load cannot push MFU over 1)."""
    from .debug.mfu import measured_peak
    return measured_peak(device, dtypes, size, repeats)


def train(task, plan: Plan = Plan(), *, steps=None, tokens=None, samples=None, seconds=None,
          optim: OptimConfig = OptimConfig(), eval_every: int = 0, log_every: int = 10, out_dir=None,
          target: dict | None = None, stop_at_target: bool = False, warmup: int = 2, measure_memory: bool = True,
          verbose: bool = True, state_type: type | None = None, nonfinite: str = "stop",
          allow_changes=()) -> RunRecord:
    """Train ``task`` under ``plan`` for one budget (``steps``, ``tokens``, ``samples`` or ``seconds``).

    Call on every rank. ``eval_every``: evaluate every k steps (and at the end) if > 0. ``target``: e.g.
    ``{"eval_loss": 4.0}``; the summary records the training time and tokens at the first evaluation that
    reaches it (``stop_at_target``: and the run ends there). ``warmup``: first steps left out of throughput.
    ``measure_memory``: on CPU, profile the second step's allocations for its peak (that step is warm-up).
    ``state_type``: the class that holds what a checkpoint saves (default :class:`TrainState`; lesson 08's exercise
    passes its own). ``nonfinite``: at a step whose loss or gradients hold NaN/inf, ``"stop"`` (raise
    :class:`simlib.guards.NonFiniteError` naming the step) or ``"skip"`` (skip its update; counted in
    ``summary["skipped_steps"]``). ``allow_changes``: fields (``"optim.lr"``, ``"task.seed"``, ``"optim"``, ``"*"``)
    allowed to differ from the checkpoint resumed from; any other difference is refused, naming the field.
    """
    from . import env
    from .timeline import Timeline

    guards.check_run_args(steps, tokens, samples, seconds, eval_every, log_every, warmup, nonfinite, target)
    ctx = env.init()
    plan.validate(ctx.world_size, task)
    total_steps = _budget_steps(task, steps, tokens, samples, seconds)
    groups = plan.mesh.build()
    tl = Timeline(rank=ctx.rank, warmup=warmup, device=ctx.device)
    pm = parallelize(task.build_model().to(ctx.device), groups, plan, task, ctx.device, tl)
    optimizer, scheduler = build_optimizer(pm, plan, optim, total_steps)
    state = (state_type or TrainState)(pm.module, optimizer, scheduler, shard=_shard_name(plan, groups))
    state.scaler = pm.scaler
    if plan.checkpoint_dir:
        from . import checkpoint  # torch.distributed.checkpoint, atomic
        folder_lock = checkpoint.claim(plan.checkpoint_dir)  # noqa: F841 - the folder is this run's until it returns
        state.meta = guards.run_meta(task, plan, optim, optim.decay_steps or total_steps)
        state.free_changes = guards.free_changes(plan)
        if plan.checkpoint_every:
            checkpoint.preflight(plan.checkpoint_dir, state)  # writable, room for a checkpoint: before any step
        if checkpoint.load_latest(plan.checkpoint_dir, state, allow_changes=allow_changes) and allow_changes:
            guards.apply_optim(optimizer, scheduler, optim)
    tokens_per_sample = getattr(task, "tokens_per_sample", 0) or 0
    matmul_rate = _matmul_rate(ctx.device, dtypes=("float32",) + ({"bf16": ("bfloat16",), "fp16": ("float16",)}
                                                                    .get(plan.mixed_precision, ())))
    writer = RecordWriter(out_dir if ctx.rank == 0 else None, append=state.step > 0)
    rows, evals, peak_memory = [], [], None
    first_step, t_start = state.step, time.perf_counter()
    shardable = _accepts_part(task)
    skipped = 0  # steps whose update was skipped for NaN/inf (nonfinite="skip")
    local_params = [p for g in optimizer.param_groups for p in g["params"]]

    def one_step(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = pm.forward_backward(x, y)
        with tl.span("optimizer"):
            # loss scaling (fp16): gradients back to their true size; a step with inf/NaN on any rank is skipped
            # by the scaler (that is its job; every rank agrees on it), so the divergence check runs on the others
            finite = pm.scaler.unscale_(unique_parameters(pm.module)) if pm.scaler is not None else True
            norm = clip_grad_norm(pm, optim.grad_clip) if optim.grad_clip and finite else None
            bad = guards.nonfinite(loss, local_params, norm, ctx.device, tl) if finite else []  # same on every rank
            if finite and not bad:
                optimizer.step()
            if pm.scaler is not None:
                pm.scaler.update()
            if not bad:
                scheduler.step()
        return loss, norm, bad

    while True:
        step = state.step
        if total_steps is not None and step >= total_steps:
            break
        if seconds is not None and _agree_stop(state.train_time >= seconds, ctx.device):
            break
        index = state.data_step  # the data position (equal to step unless a checkpoint was restored in part)
        if shardable:
            x, y = task.batch(index, part=groups.dp_rank, parts=plan.dp)
            guards.check_batch(x, y, task.global_batch // plan.dp, index, task.name, ctx.rank, "batch part")
            x, y = x.to(ctx.device), y.to(ctx.device)
        else:
            x, y = task.batch(index)
            guards.check_batch(x, y, task.global_batch, index, task.name, ctx.rank)
            x, y = pm.shard(x, y)
        lr = scheduler.get_last_lr()[0]
        t0 = time.perf_counter()
        with tl.step(step):
            if measure_memory and step == first_step + 1 and ctx.device.type == "cpu":
                from .parallel.accumulate import peak_memory as measure
                box = {}
                peak_memory = measure(lambda: box.update(out=one_step(x, y)))
                loss, norm, bad = box["out"]
            else:
                loss, norm, bad = one_step(x, y)
        if bad:
            if nonfinite == "stop":
                raise guards.nonfinite_error(step, bad, lr, plan.checkpoint_dir, optim.grad_clip)
            skipped += 1
        step_time = time.perf_counter() - t0
        state.train_time += step_time
        state.step += 1
        state.data_step += 1
        state.samples += task.global_batch
        state.tokens += task.global_batch * tokens_per_sample
        last = (total_steps is not None and state.step >= total_steps)
        if log_every and (step % log_every == 0 or last):
            row = step_row(step, pm.global_loss(loss), state, lr, step_time, tl, norm, tokens_per_sample)
            if peak_memory is not None and step == first_step + 1:
                row["peak_memory"] = peak_memory
            if pm.scaler is not None:
                row["loss_scale"], row["skipped_steps"] = pm.scaler.scale, pm.scaler.skipped
            rows.append(row)
            writer.write(row)
            if verbose and ctx.rank == 0:
                print(f"step {step:5d}  loss {row['loss']:.4f}  lr {lr:.2e}  {step_time * 1e3:6.0f} ms/step"
                      f"  {state.tokens or state.samples:,} {'tokens' if tokens_per_sample else 'samples'}",
                      flush=True)
        if eval_every and (state.step % eval_every == 0 or last):
            _evaluate(task, pm, state, evals, writer, verbose and ctx.rank == 0)
            if stop_at_target and _agree_stop(bool(time_to_target(evals, target).get("target_reached")), ctx.device):
                break
        if plan.checkpoint_dir and plan.checkpoint_every and state.step % plan.checkpoint_every == 0:
            from . import checkpoint
            checkpoint.save(plan.checkpoint_dir, state)
    if eval_every and (not evals or evals[-1]["step"] != state.step):
        _evaluate(task, pm, state, evals, writer, verbose and ctx.rank == 0)
    if ctx.device.type == "cuda":
        peak_memory = torch.cuda.max_memory_allocated(ctx.device)
    timeline = tl.gather()
    summary = build_summary(task, plan, ctx, state, timeline, rows, evals, target, peak_memory,
                            matmul_rate, time.perf_counter() - t_start)
    summary["skipped_steps"] = skipped
    writer.finish(summary)
    return RunRecord(rows=rows, evals=evals, summary=summary, timeline=timeline, model=pm)


def _shard_name(plan, groups) -> str:
    """The part of the model and optimizer this rank holds, when ranks hold different ones (checkpoint keys)."""
    return ".".join([f"pp{groups.pp_rank}"] * (plan.pp > 1) + [f"tp{groups.tp_rank}"] * (plan.tp > 1)
                    + [f"dp{groups.dp_rank}"] * (plan.zero_stage > 0)  # ZeRO: optimizer sharded over dp
                    + [f"ep{groups.ep_rank}"] * (plan.ep > 1))  # EP: each rank holds its experts


def _accepts_part(task) -> bool:
    import inspect
    try:
        return "part" in inspect.signature(task.batch).parameters
    except (TypeError, ValueError):
        return False


def _agree_stop(mine: bool, device=None) -> bool:
    """Rank 0's clock decides, so every rank stops after the same step."""
    flag = torch.tensor([1.0 if mine else 0.0], device=device)  # NCCL: on the GPU
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast(flag, src=0)
    return bool(flag.item())


def _evaluate(task, pm, state, evals, writer, verbose) -> None:
    was_training = pm.module.training
    model = pm.eval_model()
    model.eval()
    with torch.no_grad():
        metrics = {k: float(v) for k, v in task.evaluate(model).items()}
    model.train(was_training)
    pm.module.train(was_training)
    row = {"step": state.step, "eval": metrics, "tokens": state.tokens, "samples": state.samples,
           "train_time": state.train_time}
    evals.append(row)
    writer.write(row)
    if verbose:
        print(f"eval at step {state.step}: " + "  ".join(f"{k} {v:.4f}" for k, v in metrics.items()), flush=True)


__all__ = ["Plan", "OptimConfig", "Task", "TrainState", "RunRecord", "train", "parallelize", "build_optimizer"]
