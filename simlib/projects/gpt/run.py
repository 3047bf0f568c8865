"""Hands-on project 1: a small GPT on real English text, trained for real on 1-4 processes.

What the notebook (``notebooks/10_project_gpt.ipynb``), ``simlib train gpt`` and ``benchmarks/project_gpt.py``
share: the sizes, the plans by name, one call that runs a plan on fresh or warm processes, and the plots.

    record = run("dp", world_size=2)                    # trains, writes results/gpt/dp/{run.jsonl,summary.json}
    records = {p: run(p, 2, cluster=c) for p in ("dp", "tp")}
    plot_runs({"1 process": r1, **records}, "results/gpt/loss.png")
"""

from __future__ import annotations

from pathlib import Path

from ...pieces import Slot
from ...plan import PLAN_NAMES, OptimConfig, Plan, named_plan  # noqa: F401 - PLAN_NAMES: the plans by name
from .task import GPTTask as TASK  # noqa: F401 - the registry's (simlib.projects.registry)

PROMPTS = ("The ", "KING. ", "What ")  # the samples' beginnings (the shipped corpus is Shakespeare's plays)


# the learner's pieces (solutions/10_gpt_pieces.ipynb): both run in a Plan(dp=2, tp=2) run (PIECES_PLAN)
PIECES = {
    "grad_sync": Slot(
        "grad_sync",
        what="the data-parallel gradient synchronisation: buckets all-reduced from gradient hooks during backward",
        given="simlib.parallel.data:DataParallelBucket",
        check="gpt_grad_sync",
        interface="class(module, bucket_cap_mb, group=None) with forward(...) and finish_gradient_synchronization()",
    ),
    "tp_attention": Slot(
        "tp_attention",
        what="the attention block split by heads over the tensor-parallel ranks (column-parallel qkv, row-parallel out)",
        given="simlib.parallel.tensor:tensor_parallel_attention",
        check="gpt_tp_attention",
        interface="class(attn, group) -> nn.Module with .qkv, .out (this rank's heads) and forward(x) = attn(x)",
    ),
}


# the milestone with the learner's pieces (grading "gpt_pieces_milestone"; base "gpt_milestone"): the standard run's
# target (settings(quick)) under the plan that reaches both slots; budget: seconds of training
MILESTONE = dict(metric="eval_loss", lower_is_better=True, budget_s=900.0, world_size=4, plan={"dp": 2, "tp": 2})


def pieces_plan() -> Plan:
    """The plan a run with the learner's pieces trains under: data- and tensor-parallel (4 processes), so both
    slots are on the training's path (dp=2 alone would never call tp_attention, tp=2 alone never grad_sync)."""
    return Plan(dp=2, tp=2)


def settings(quick: bool = False) -> dict:
    """Task, budget and optimizer of the project (the CPU sizes; the GPU size is ``simlib.projects.gpu``).

    Full size: 0.93 M parameters, 600 steps of 2,048 tokens = 0.64 of a pass over the 1.93 M training tokens of
    the shipped Shakespeare, so nothing is seen twice (measured, 1 process, 1 thread: held-out loss 4.31 at step
    600, training loss 3.9-4.1 over the last steps; target 4.5 first reached at step 400). Quick: 0.17 M
    parameters, 200 steps of 512 tokens at a higher learning rate: enough to get below the unigram cross-entropy
    (5.79 nats: the best a model ignoring context can do), so its target (5.6) means something was learned about
    context (measured at 1 process: 5.54 at step 125, 5.32 at step 200)."""
    from .task import GPTTask

    if quick:
        return dict(
            task=GPTTask.quick(),
            steps=200,
            eval_every=25,
            log_every=10,
            target={"eval_loss": 5.6},
            optim=OptimConfig(lr=2e-2, warmup_steps=10, weight_decay=0.1, grad_clip=1.0),
        )
    return dict(
        task=GPTTask(),
        steps=600,
        eval_every=50,
        log_every=10,
        target={"eval_loss": 4.5},
        optim=OptimConfig(lr=3e-3, warmup_steps=30, weight_decay=0.1, grad_clip=1.0),
    )


def gpu_target(task) -> dict:
    """The GPU size's goal on ``task``'s corpus: 60 % below its unigram cross-entropy (a goal set from the baseline,
    not a measured figure), so a corpus given with ``--task.corpus`` gets its own."""
    return {"eval_loss": round(0.4 * task.data.unigram_cross_entropy(), 2)}


def gpu_settings(world_size: int = 1, facts: list[dict] | None = None, corpus: str | None = None) -> dict:
    """The GPU size (``simlib train gpt --size gpu``): GPT-2's layout at hidden 1536 (``gpu.GPT_SHAPE``), compiled, on the prepared corpus (``simlib prepare
    gpt``; none prepared: the shipped one), bf16 or fp16 by the GPU, micro-batches by its memory."""
    from .. import gpu
    from . import prepare
    from .task import GPTTask

    facts = gpu.gpu_facts() if facts is None else facts
    micro = gpu.micro_batch_for(facts)
    global_batch = max(64, micro * world_size)  # 65,536 tokens a step on 1 to 2 GPUs
    corpus = prepare.default_corpus() if corpus is None else corpus
    task = GPTTask(**gpu.GPT_SHAPE, global_batch=global_batch, eval_windows=64, corpus=corpus, compile=True)
    optim = OptimConfig(lr=6e-4, warmup_steps=100, weight_decay=0.1, grad_clip=1.0, schedule="constant")
    note = (
        ""
        if corpus
        else (
            "no prepared corpus, so it trains on the shipped 5 MB of Shakespeare, which GPT-2 "
            "small learns by heart within minutes (a check of speed, not of learning): run "
            "`simlib prepare gpt` once for TinyStories"
        )
    )
    return dict(
        task=task,
        seconds=gpu.GPU_SECONDS,
        eval_every=200,
        log_every=50,
        optim=optim,
        note=note,
        target=gpu_target(task),
        plan=dict(
            mixed_precision=gpu.precision_for(facts),
            accumulation=gpu.accumulation_for(global_batch, world_size, micro),
        ),
    )


def plan_for(name: str, world_size: int, micro_batches: int = 4) -> Plan:
    """The plan called ``name`` (one of :data:`PLAN_NAMES`) on ``world_size`` processes (``simlib.plan``'s)."""
    return named_plan(name, world_size, micro_batches)


def train_gpt(plan: Plan, out_dir=None, quick: bool = False, samples: int = 2, sample_tokens: int = 60, **overrides):
    """One rank's part of a project run (call on every rank): the standard run of this size, with ``overrides``."""
    config = {**settings(quick), **overrides}
    task = config.pop("task")
    return train_rank(task, plan, out_dir=out_dir, samples=samples, sample_tokens=sample_tokens, **config)


def train_rank(task, plan: Plan, out_dir=None, samples: int = 2, sample_tokens: int = 60, **train_kwargs):
    """What every rank of a GPT run does (the registry's hook): train, save the unsplit weights a grader
    evaluates, then generate ``samples`` texts."""
    import torch

    from ...train import train

    record = train(task, plan, out_dir=out_dir, **train_kwargs)
    pm = record.model
    state = task.unsplit_state(pm)  # collective under TP / PP / EP: every rank takes part
    model = pm.eval_model()
    if out_dir is not None and _is_rank0():  # the weights a grader evaluates itself
        torch.save({"task": _task_fields(task), "state": state}, Path(out_dir) / "final_model.pt")
    if plan.tp > 1 and _is_rank0():  # what simlib.projects.runner returns as the run's state: the unsplit model's
        record.unsplit_state = state
    texts = [task.sample(model, prompt, sample_tokens, seed=i) for i, prompt in enumerate(PROMPTS[:samples])]
    record.summary["samples_text"] = texts
    # what MFU against a dtype's peak needs (simlib.projects.gpu's sizes): the compute dtype and FLOPs per token
    record.summary.update(
        dtype=plan.mixed_precision or "fp32",
        flops_per_token=task.config.flops_per_token(),
        compiled=bool(task.compile),
        corpus=task.corpus or "shipped",
    )
    if out_dir is not None and _is_rank0():  # train() wrote the summary before the samples existed
        import json

        (Path(out_dir) / "summary.json").write_text(json.dumps(record.summary, indent=2, default=str) + "\n")
    return record


def _task_fields(task) -> dict:
    return {
        k: getattr(task, k)
        for k in (
            "seq_len",
            "hidden",
            "num_layers",
            "num_heads",
            "global_batch",
            "eval_windows",
            "seed",
            "moe_experts",
            "moe_top_k",
            "moe_capacity_factor",
            "moe_aux_coeff",
            "corpus",
        )
    }


def load_final_model(out_dir):
    """The task and the unsplit trained model saved by a project run in ``out_dir``."""
    import torch

    from .task import GPTTask

    saved = torch.load(Path(out_dir) / "final_model.pt", weights_only=True)
    task = GPTTask(**saved["task"])
    model = task.build_model()
    model.load_state_dict(saved["state"])
    return task, model.eval()


def _is_rank0() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def run(
    plan,
    world_size: int = 2,
    quick: bool | None = None,
    out_dir="results/gpt/{name}",
    cluster=None,
    threads: int | None = None,
    timeout: float | None = None,
    collective_timeout: float | None = None,
    **overrides,
):
    """Run a plan (a :class:`Plan` or a name from :data:`PLAN_NAMES`) on fresh processes, or on ``cluster``.
    ``timeout``: limit of the whole run; ``collective_timeout``: how long a collective waits for a peer (fresh
    processes; default simlib.launch's), so a stopped or lost rank ends the run in that time.

    Returns rank 0's :class:`simlib.record.RunRecord` (with ``summary["samples_text"]``).
    """
    from ... import env
    from ...launch import launch

    quick = env.quick() if quick is None else quick
    name = plan if isinstance(plan, str) else plan.label.replace(" ", "_")
    plan = plan_for(plan, world_size) if isinstance(plan, str) else plan
    out = str(out_dir).format(name=name) if out_dir is not None else None
    kwargs = dict(out_dir=out, quick=quick, **overrides)
    if cluster is not None:
        return cluster.call(train_gpt, (plan,), kwargs, timeout=timeout)[0]
    extra = {} if collective_timeout is None else {"timeout": collective_timeout}
    return launch(train_gpt, plan.world_size, plan, threads=threads, call_timeout=timeout, **extra, **kwargs)[0]


def finish(records: dict, out, target=None) -> list:
    """Rank 0, after every plan (the registry's hook): the overlay plot of every plan's curves."""
    target = next(iter((target or {None: None}).values()))
    plot_runs(records, Path(out) / "loss.png", target=target)
    return [Path(out) / "loss.png"]


def plot_runs(records: dict, path=None, target: float | None = None):
    """Eval loss against tokens (the curves overlay: same mathematics) and against training time (speed)."""
    import matplotlib.pyplot as plt

    fig, (ax_tokens, ax_time) = plt.subplots(1, 2, figsize=(11, 4))
    for label, rec in records.items():
        ev = rec.eval_frame
        rows = rec.frame
        evaluated = {"tokens", "train_time", "eval_loss"} <= set(ev.columns)  # none with --budget.eval-every 0
        color = None
        if evaluated:
            (line,) = ax_tokens.plot(ev["tokens"], ev["eval_loss"], "o-", ms=3, label=f"{label} (eval)")
            color = line.get_color()
            ax_time.plot(ev["train_time"], ev["eval_loss"], "o-", ms=3, color=color, label=label)
        if {"tokens", "loss"} <= set(rows.columns):  # none when a run resumed at its last step (elastic restart)
            ax_tokens.plot(
                rows["tokens"],
                rows["loss"],
                color=color,
                alpha=0.3 if evaluated else 1.0,
                lw=1,
                label=None if evaluated else f"{label} (training; no evaluation)",
            )
    top = max(
        (float(rec.eval_frame["eval_loss"].max()) for rec in records.values() if "eval_loss" in rec.eval_frame),
        default=None,
    )
    if top is not None and ax_tokens.get_ylim()[1] > top + 1:  # a warm-up spike of the training loss would
        ax_tokens.set_ylim(top=top + 0.5)  # flatten the curves that matter: clip it
    for ax in (ax_tokens, ax_time):
        if target is not None:
            ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:g}")
        ax.set_ylabel("loss (nats per token)")
        ax.grid(alpha=0.3)
    ax_tokens.set_xlabel("tokens seen")
    ax_tokens.set_title("loss vs tokens (faint: training loss)")
    ax_time.set_xlabel("training time (s)")
    ax_time.set_title("eval loss vs training time")
    for ax in (ax_tokens, ax_time):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110, bbox_inches="tight")
    return fig


def table(records: dict):
    """tokens/s, time and tokens to the target, communication and peak memory, one row per run."""
    import pandas as pd

    rows = []
    for label, rec in records.items():
        s = rec.summary
        rows.append(
            {
                "run": label,
                "world_size": s["world_size"],
                "threads": s["threads"],
                "tokens_per_s": s["tokens_per_s"],
                "step_time_s": s["step_time"],
                "time_to_target_s": s.get("time_to_target"),
                "tokens_to_target": s.get("tokens_to_target"),
                "final_eval_loss": (s.get("final_eval") or {}).get("eval_loss"),
                "comm_s_per_step": s.get("comm_time"),
                "exposed_comm_s_per_step": s.get("exposed_comm_time"),
                "wait_s_per_step": s.get("wait_time"),
                "peak_memory_MB": s["peak_memory_bytes"] / 2**20 if s.get("peak_memory_bytes") else None,
            }
        )
    return pd.DataFrame(rows)
