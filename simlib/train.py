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

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist

from . import guards
from . import pieces as pieces_lib
from .checkpoint import rng_state, set_rng_state  # noqa: F401 - every generator a step may use
from .parallelize import ParallelModel, build_optimizer, clip_grad_norm, parallelize, unique_parameters  # noqa: F401
from .plan import DP_VARIANTS, PRECISIONS, SCHEDULES, OptimConfig, Plan  # noqa: F401 - what a run is
from .record import RecordWriter, RunRecord, build_summary, step_row, time_to_target


@runtime_checkable
class Task(Protocol):
    """What a project provides (see ``simlib.tasks``). Optional: ``tensor_parallel(model, tp_group, log)``,
    ``pipeline_stages(model, pp_rank, pp_size)``, ``context_parallel(model, split)`` (batches (B, T, ...):
    the sequence on dim 1), ``moe_experts`` (its model's ``simlib.parallel.experts.MoEFeedForward`` layers),
    ``blocks(model)``, ``tied_parameters(model)``,
    ``tokens_per_sample`` and ``flops_per_sample`` (for tokens/s and MFU), ``check_plan(plan)``."""

    name: str
    global_batch: int

    def build_model(self): ...  # seeded: the same weights whatever the world size
    def batch(self, step: int): ...  # the GLOBAL batch (x, y) of ``step``, deterministic
    def loss(self, output, target): ...  # mean over the samples given
    def evaluate(self, model) -> dict: ...  # held-out metrics, e.g. {"eval_loss": 2.1}


@dataclass
class StepInfo:
    """What a step hook sees (``train(..., step_hook=hook)``): ``hook(info)`` is called as each step starts and
    may return a context manager, entered around the whole step (forward, backward, optimizer and scheduler
    step); callables it appends to ``after_backward`` run once the gradients are complete, before the optimizer.
    The peak-memory tracker (``simlib.parallel.step_memory.StepMemory``) is one: a tool that needs the training
    step uses this one instead of a copy of it."""

    step: int
    x: object  # this rank's batch (inputs, targets), on its device
    y: object
    model: ParallelModel  # .module: the local parameters; .forward_backward, .groups, .plan
    optimizer: object
    after_backward: list = field(default_factory=list)


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
    data_step: int = 0  # the data position: index of the next global batch
    samples: int = 0
    tokens: int = 0
    train_time: float = 0.0  # seconds of training so far (evaluation and checkpoints left out)
    shard: str = ""  # which part of the model this rank holds when ranks differ (TP/PP/ZeRO), e.g. "pp1"
    scaler: object = None  # fp16's LossScaler: its scale and run of good steps resume with the run

    def state_dict(self) -> dict:
        model, optimizer = self.model.state_dict(), self.optimizer.state_dict()
        if self.shard:  # ranks hold different tensors under the same names: keep each part apart in the checkpoint
            model, optimizer = {self.shard: model}, {self.shard: optimizer}
        return {
            "model": model,
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "data": {"next_step": self.data_step, "samples": self.samples, "tokens": self.tokens},
            "train_time": self.train_time,
            "rng": rng_state(),
            **({"loss_scaler": self.scaler.state_dict()} if self.scaler is not None else {}),
        }

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
    from . import hooks

    return hooks.tool("peaks").measured_peak(device, dtypes, size, repeats)


def train(
    task,
    plan: Plan = Plan(),
    *,
    steps=None,
    tokens=None,
    samples=None,
    seconds=None,
    optim: OptimConfig = OptimConfig(),
    eval_every: int = 0,
    log_every: int = 10,
    out_dir=None,
    target: dict | None = None,
    stop_at_target: bool = False,
    warmup: int = 2,
    measure_memory: bool = True,
    verbose: bool = True,
    state_type: type | None = None,
    nonfinite: str = "stop",
    allow_changes=(),
    step_hook=None,
    pieces: dict | None = None,
) -> RunRecord:
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
    ``step_hook``: called with a :class:`StepInfo` as each step starts (see there). ``pieces``: the learner's code
    at a project's slots, ``{slot name: class or function}`` (:mod:`simlib.pieces`); the summary lists them.
    """
    guards.check_run_args(steps, tokens, samples, seconds, eval_every, log_every, warmup, nonfinite, target)
    with pieces_lib.using(pieces):
        return _train(
            task, plan, steps, tokens, samples, seconds, optim, eval_every, log_every, out_dir, target,
            stop_at_target, warmup, measure_memory, verbose, state_type, nonfinite, allow_changes, step_hook,
        )  # fmt: skip


def _train(
    task, plan, steps, tokens, samples, seconds, optim, eval_every, log_every, out_dir, target,
    stop_at_target, warmup, measure_memory, verbose, state_type, nonfinite, allow_changes, step_hook,
) -> RunRecord:  # fmt: skip
    total = _budget_steps(task, steps, tokens, samples, seconds)
    run = Trainer(task, plan, optim, total, out_dir, warmup, measure_memory, verbose, state_type, allow_changes)
    while not run.done(seconds):
        x, y = run.next_batch()
        loss, norm, step_time = run.train_step(x, y, step_hook, nonfinite)
        if log_every and (run.step_done % log_every == 0 or run.last_step):
            run.log(loss, norm, step_time)
        if eval_every and (run.state.step % eval_every == 0 or run.last_step):
            run.evaluate()
            if stop_at_target and run.agree(bool(time_to_target(run.evals, target).get("target_reached"))):
                break
        if plan.checkpoint_dir and plan.checkpoint_every and run.state.step % plan.checkpoint_every == 0:
            run.checkpoint()
    if eval_every and (not run.evals or run.evals[-1]["step"] != run.state.step):
        run.evaluate()
    return run.finish(target)


class Trainer:
    """One rank's run, in the steps a reader expects: built once (``__init__``: process group, mesh, model under
    the plan, optimizer, state, a checkpoint resumed), then :meth:`next_batch`, :meth:`train_step` (forward,
    backward, optimizer), :meth:`log`, :meth:`evaluate`, :meth:`checkpoint`, and :meth:`finish` (the summary).
    :func:`train` is the loop over them."""

    def __init__(
        self, task, plan, optim, total_steps, out_dir, warmup, measure_memory, verbose, state_type, allow_changes
    ):
        from . import env
        from .timeline import Timeline

        ctx = self.ctx = env.init()
        plan.validate(ctx.world_size, task)
        self.task, self.plan, self.optim, self.total_steps = task, plan, optim, total_steps
        if measure_memory and ctx.device.type == "cpu":
            from .parallel.accumulate import count_every_thread

            count_every_thread()  # before the model exists: every block the measured step frees is one it counts
        self.measure_memory = measure_memory and ctx.device.type == "cpu"
        self.verbose = verbose and ctx.rank == 0
        self.groups = plan.mesh.build()
        self.tl = Timeline(rank=ctx.rank, warmup=warmup, device=ctx.device)
        self.pm = parallelize(task.build_model().to(ctx.device), self.groups, plan, task, ctx.device, self.tl)
        self.optimizer, self.scheduler = build_optimizer(self.pm, plan, optim, total_steps)
        state = (state_type or TrainState)(
            self.pm.module, self.optimizer, self.scheduler, shard=_shard_name(plan, self.groups)
        )
        self.state, state.scaler = state, self.pm.scaler
        if plan.checkpoint_dir:
            self._resume(allow_changes)
        self.tokens_per_sample = getattr(task, "tokens_per_sample", 0) or 0
        dtypes = ("float32",) + {"bf16": ("bfloat16",), "fp16": ("float16",)}.get(plan.mixed_precision, ())
        self.matmul_rate = _matmul_rate(ctx.device, dtypes=dtypes)
        self.writer = RecordWriter(out_dir if ctx.rank == 0 else None, append=state.step > 0)
        self.rows, self.evals, self.peak_memory = [], [], None
        self.first_step, self.t_start = state.step, time.perf_counter()
        self.shardable = _accepts_part(task)
        self.skipped = 0  # steps whose update was skipped for NaN/inf (nonfinite="skip")
        self.local_params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.wrong = None  # this step's batch part, when its size is wrong (raised on every rank after the backward)
        self.step_done, self.lr = state.step, 0.0  # the step the last train_step ran, and its learning rate

    def _resume(self, allow_changes) -> None:
        from . import checkpoint  # torch.distributed.checkpoint, atomic

        plan, state = self.plan, self.state
        self.folder_lock = checkpoint.claim(plan.checkpoint_dir)  # the folder is this run's until it is dropped
        state.meta = guards.run_meta(self.task, plan, self.optim, self.optim.decay_steps or self.total_steps)
        state.free_changes = guards.free_changes(plan)
        if plan.checkpoint_every:
            total_steps = self.total_steps
            saves = total_steps // plan.checkpoint_every if total_steps is not None else None
            checkpoint.preflight(plan.checkpoint_dir, state, saves=saves)  # writable, room for its saves: at start
        if checkpoint.load_latest(plan.checkpoint_dir, state, allow_changes=allow_changes) and allow_changes:
            guards.apply_optim(self.optimizer, self.scheduler, self.optim)

    @property
    def last_step(self) -> bool:
        return self.total_steps is not None and self.state.step >= self.total_steps

    def agree(self, mine: bool) -> bool:
        return _agree_stop(mine, self.ctx.device)

    def done(self, seconds) -> bool:
        """The budget is spent: the steps, or (rank 0's clock) the seconds."""
        if self.total_steps is not None and self.state.step >= self.total_steps:
            return True
        return seconds is not None and self.agree(self.state.train_time >= seconds)

    def next_batch(self):
        """This rank's share of the next global batch (``task.batch(data position)``), on its device."""
        task, plan, index, rank = self.task, self.plan, self.state.data_step, self.ctx.rank
        if self.shardable:
            x, y = task.batch(index, part=self.groups.dp_rank, parts=plan.dp)
            part = task.global_batch // plan.dp
            self.wrong = guards.check_batch(  # a part only this rank sees: agreed on after the backward
                x, y, part, index, task.name, rank, "batch part", defer=plan.dp > 1
            )
            x, y = guards.fit_rows(x, y, part) if self.wrong else (x, y)  # the peers' shapes, so collectives match
            return x.to(self.ctx.device), y.to(self.ctx.device)
        x, y = task.batch(index)
        guards.check_batch(x, y, task.global_batch, index, task.name, rank)
        self.wrong = None
        return self.pm.shard(x, y)

    def train_step(self, x, y, step_hook=None, nonfinite="stop"):
        """One step on (x, y): forward, backward, optimizer and schedule, inside the step hook's context ->
        (this rank's loss, the gradient norm or None, seconds)."""
        step, state = self.state.step, self.state
        self.lr = self.scheduler.get_last_lr()[0]
        t0 = time.perf_counter()
        info = StepInfo(step, x, y, self.pm, self.optimizer) if step_hook is not None else None
        hooked = (step_hook(info) if info is not None else None) or nullcontext()
        after = info.after_backward if info is not None else ()
        with self.tl.step(step), hooked:
            if self.measure_memory and step == self.first_step + 1:
                from .parallel.accumulate import peak_memory as measure

                box = {}
                self.peak_memory = measure(lambda: box.update(out=self._update(x, y, after)))
                loss, norm, bad = box["out"]
            else:
                loss, norm, bad = self._update(x, y, after)
        if bad:
            if nonfinite == "stop":
                raise guards.nonfinite_error(step, bad, self.lr, self.plan.checkpoint_dir, self.optim.grad_clip)
            self.skipped += 1
        step_time = time.perf_counter() - t0
        state.train_time += step_time
        state.step += 1
        state.data_step += 1
        state.samples += self.task.global_batch
        state.tokens += self.task.global_batch * self.tokens_per_sample
        self.step_done = step
        return loss, norm, step_time

    def _update(self, x, y, after_backward=()):
        """Forward and backward (the plan's, chosen once), then the optimizer: unscale, clip, check, step."""
        pm, optimizer = self.pm, self.optimizer
        optimizer.zero_grad(set_to_none=True)
        loss = pm.forward_backward(x, y)
        for hook in after_backward:
            hook()
        with self.tl.span("optimizer"):
            # loss scaling (fp16): gradients back to their true size; a step with inf/NaN on any rank is skipped
            # by the scaler (that is its job; every rank agrees on it), so the divergence check runs on the others
            finite = pm.scaler.unscale_(unique_parameters(pm.module)) if pm.scaler is not None else True
            norm = clip_grad_norm(pm, self.optim.grad_clip) if self.optim.grad_clip and finite else None
            # the same answer on every rank; a batch part of the wrong size (``self.wrong``) raises on all of them
            device, wrong = self.ctx.device, self.wrong
            bad = guards.nonfinite(loss, self.local_params, norm, device, self.tl, (x, y), wrong) if finite else []
            if not finite:
                guards.agree_batch(wrong, device)
            if finite and not bad:
                optimizer.step()
            if pm.scaler is not None:
                pm.scaler.update()
            if not bad:
                self.scheduler.step()
        return loss, norm, bad

    def log(self, loss, norm, step_time) -> None:
        """The step's row of the run record (the global loss: a collective); rank 0 prints one line."""
        step, state, pm = self.step_done, self.state, self.pm
        row = step_row(step, pm.global_loss(loss), state, self.lr, step_time, self.tl, norm, self.tokens_per_sample)
        if self.peak_memory is not None and step == self.first_step + 1:
            row["peak_memory"] = self.peak_memory
        if pm.scaler is not None:
            row["loss_scale"], row["skipped_steps"] = pm.scaler.scale, pm.scaler.skipped
        self.rows.append(row)
        self.writer.write(row)
        if self.verbose:
            print(
                f"step {step:5d}  loss {row['loss']:.4f}  lr {self.lr:.2e}  {step_time * 1e3:6.0f} ms/step"
                f"  {state.tokens or state.samples:,} {'tokens' if self.tokens_per_sample else 'samples'}",
                flush=True,
            )

    def evaluate(self) -> None:
        _evaluate(self.task, self.pm, self.state, self.evals, self.writer, self.verbose)

    def checkpoint(self) -> None:
        from . import checkpoint

        checkpoint.save(self.plan.checkpoint_dir, self.state)

    def finish(self, target) -> RunRecord:
        """The summary (every rank's timeline gathered), written by rank 0; the run record."""
        ctx, state = self.ctx, self.state
        peak = torch.cuda.max_memory_allocated(ctx.device) if ctx.device.type == "cuda" else self.peak_memory
        timeline = self.tl.gather()
        elapsed = time.perf_counter() - self.t_start
        summary = build_summary(
            self.task, self.plan, ctx, state, timeline, self.rows, self.evals, target, peak, self.matmul_rate, elapsed
        )
        summary["skipped_steps"] = self.skipped
        summary["pieces"] = pieces_lib.used()  # the slots where this run ran the learner's code (on rank 0)
        self.writer.finish(summary)
        return RunRecord(rows=self.rows, evals=self.evals, summary=summary, timeline=timeline, model=self.pm)


def _shard_name(plan, groups) -> str:
    """The part of the model and optimizer this rank holds, when ranks hold different ones (checkpoint keys)."""
    return ".".join(
        [f"pp{groups.pp_rank}"] * (plan.pp > 1)
        + [f"tp{groups.tp_rank}"] * (plan.tp > 1)
        + [f"dp{groups.dp_rank}"] * (plan.zero_stage > 0)  # ZeRO: optimizer sharded over dp
        + [f"ep{groups.ep_rank}"] * (plan.ep > 1)
    )  # EP: each rank holds its experts


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
    row = {
        "step": state.step,
        "eval": metrics,
        "tokens": state.tokens,
        "samples": state.samples,
        "train_time": state.train_time,
    }
    evals.append(row)
    writer.write(row)
    if verbose:
        print(f"eval at step {state.step}: " + "  ".join(f"{k} {v:.4f}" for k, v in metrics.items()), flush=True)


__all__ = [
    "Plan",
    "OptimConfig",
    "Task",
    "TrainState",
    "StepInfo",
    "RunRecord",
    "train",
    "Trainer",
    "parallelize",
    "build_optimizer",
]
