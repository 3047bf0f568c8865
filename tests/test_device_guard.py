"""Same code, bigger machine: every runner a lesson, a project, the CLI or the simulator calls keeps its model,
data and buffers on ``ctx.device`` (checked on CPU with a fake accelerator; see tests/device_guard.py).

A runner that builds anything on the CPU by default fails here, where on a real GPU machine it would silently
train on the CPU or crash at its first collective under NCCL. Torch's own DDP and pipelining are left out: they
need a real process group, and they are torch's to get right.

What it missed until the first real GPU run (notebook 12 failed on an H200): it drove the training loop only with
the lessons' MLP and the GPT task, never the projects' own tasks through their runners. The loop moves the
batches it is given to ctx.device, so the only tensors it cannot move are those a task makes itself -- its
held-out data in ``evaluate`` -- and the finance task handed CPU paths to a CUDA model there. Now every project
(gpt, vision, finance) runs through ``run_project`` at world 1 (as a notebook's kernel does) and through each
rank's ``_train_worker`` at world 2, evaluation included, and the state a runner brings home must be on the CPU
(``run_project`` at world 1 returned it on the device, ``train_on`` on the CPU).
"""

import pytest
from device_guard import OffDevice, guarded


def _train(task_name, budget=None, **plan):
    def run():
        from simlib.train import Plan, train

        if task_name == "gpt":
            from simlib.projects.gpt import GPTTask

            task = GPTTask.quick()
        else:
            from simlib.tasks import RegressionTask

            task = RegressionTask()
        return train(task, Plan(**plan), **(budget or dict(steps=3)), eval_every=3, log_every=1, verbose=False)

    return run


def _lesson(name):
    def run():
        from simlib import collectives
        from simlib.lessons import accumulation as accumulate
        from simlib.lessons import data_parallel as data
        from simlib.lessons import pipeline as pe
        from simlib.lessons import scaling as experiments
        from simlib.lessons import tensor as te
        from simlib.sim import validate

        return {
            "experiments.dp_train": lambda: experiments.dp_train(width=32, depth=2, local_batch=8, steps=2, warmup=1),
            "data.run_data_parallel bucket": lambda: data.run_data_parallel("bucket", steps=2, timeline=True),
            "data.run_data_parallel naive": lambda: data.run_data_parallel("naive", steps=2),
            "data.run_data_parallel flat": lambda: data.run_data_parallel("flat", steps=2),
            "accumulate.run_accumulation": lambda: accumulate.run_accumulation(steps=2, mode="bucket"),
            "collectives.bandwidth_sweep": lambda: collectives.bandwidth_sweep([1024, 4096], repeats=2),
            "collectives.collective_demo": lambda: collectives.collective_demo("all_reduce"),
            "pipeline.simlib_steps": lambda: pe.simlib_steps(steps=2, width=32, depth=4, micro_batch=4),
            "tensor.tp_steps": lambda: te.tp_steps(hidden=32, batch=2, seq=8, steps=2, warmup=1),
            "tensor.dense_steps": lambda: te.dense_steps(hidden=32, batch=2, seq=8, steps=2, warmup=1),
            "validate.dp_workload": lambda: validate.dp_workload(
                validate.RunConfig(2, 8, accumulation=2, bucket_mb=0.01, width=32, depth=2), steps=2, warmup=1
            ),
            "validate.pipeline": lambda: validate.dp_workload(
                validate.RunConfig(2, 8, accumulation=2, width=32, depth=2, pipeline="1f1b"), steps=2, warmup=1
            ),
        }[name]()

    return run


def _project(name, world_size, **overrides):
    """A project's runner as each rank runs it: ``run_project`` in-process at world 1 (what a notebook's kernel
    does), ``_train_worker`` (each rank of ``train_on`` / ``run_project(name, n)``) at world 2. The trained state
    it brings home must be on the CPU whatever the device, as ``train_on``'s is."""

    def run():
        from simlib.projects import runner

        spec = dict(quick=True, verbose=False, steps=2, eval_every=2, **overrides)
        if world_size == 1:
            record, state = runner.run_project(name, 1, **spec)
        else:
            from simlib.train import Plan

            full = {**runner.PROJECTS[name](True), **{k: v for k, v in spec.items() if k != "quick"}}
            task = full.pop("task")
            plan = Plan(dp=world_size, sync_batchnorm=(name == "vision"))
            record, state = runner._train_worker(task, plan, full, None)
        off = sorted({str(v.device) for v in state.values() if v.device.type != "cpu"})
        if off:
            raise OffDevice(
                f"{name}'s runner brought its trained state home on {off}, not on the CPU: "
                "a caller (a notebook, grading) loads it into a CPU model"
            )
        return record

    return run


def _gpt_project(world_size):
    def run():
        from simlib.projects.gpt import run as project

        plan = project.plan_for("dp" if world_size > 1 else "single", world_size)
        return project.train_gpt(plan, quick=True, steps=2, eval_every=2, verbose=False, samples=1, sample_tokens=4)

    return run


RUNNERS = {
    "train mlp single": (_train("mlp"), 1),
    "train mlp dp bucket": (_train("mlp", dp=2), 2),
    "train mlp dp, a time budget": (_train("mlp", budget=dict(seconds=0.2), dp=2), 2),
    "train mlp dp naive + accumulation": (_train("mlp", dp=2, dp_variant="naive", accumulation=2), 2),
    "train mlp dp flat": (_train("mlp", dp=2, dp_variant="flat"), 2),
    "train gpt dp": (_train("gpt", dp=2), 2),
    "train gpt tp": (_train("gpt", tp=2), 2),
    "train gpt pp 1f1b": (_train("gpt", pp=2, pp_microbatches=2), 2),
    "train gpt dp x tp": (_train("gpt", dp=2, tp=2), 4),
    "train gpt recompute": (_train("gpt", dp=2, activation_checkpointing=True), 2),
}
RUNNERS.update(
    {f"project {name} world {w}": (_project(name, w), w) for name in ("gpt", "vision", "finance") for w in (1, 2)}
)
RUNNERS.update({f"project gpt train_gpt world {w}": (_gpt_project(w), w) for w in (1, 2)})
RUNNERS.update(
    {
        name: (_lesson(name), 2)
        for name in [
            "experiments.dp_train",
            "data.run_data_parallel bucket",
            "data.run_data_parallel naive",
            "data.run_data_parallel flat",
            "accumulate.run_accumulation",
            "collectives.bandwidth_sweep",
            "collectives.collective_demo",
            "pipeline.simlib_steps",
            "tensor.tp_steps",
            "tensor.dense_steps",
            "validate.dp_workload",
            "validate.pipeline",
        ]
    }
)


@pytest.mark.parametrize("name", list(RUNNERS))
def test_runner_keeps_everything_on_ctx_device(name):
    fn, world_size = RUNNERS[name]
    with guarded(world_size=world_size):
        fn()


def test_the_guard_catches_a_runner_that_hard_codes_the_cpu():
    import torch
    import torch.distributed as dist

    import simlib

    def careless():
        simlib.context()
        model = torch.nn.Linear(4, 4)  # forgot .to(ctx.device)
        dist.all_reduce(model.weight.data)

    def careful():
        ctx = simlib.context()
        model = torch.nn.Linear(4, 4).to(ctx.device)
        dist.all_reduce(model.weight.data)
        return float(model(torch.ones(2, 4, device=ctx.device)).sum())

    with guarded():
        with pytest.raises(OffDevice, match="not on ctx.device"):
            careless()
        assert careful() == 1.0  # a meta scalar reads as 1.0
