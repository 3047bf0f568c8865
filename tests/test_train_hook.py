"""train()'s step hook (issue 34, part 3): called once per step with the step's batch, model and optimizer; its
context wraps the whole step; ``after_backward`` runs with the gradients complete and the weights not yet updated.
One process, the quick GPT for 3 steps (about 2 s)."""

from contextlib import contextmanager

import torch

from simlib import env
from simlib.projects.gpt import GPTTask
from simlib.train import OptimConfig, Plan, train


def test_the_step_hook_sees_every_step_around_the_optimizer(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):  # what a one-process run sets: undone after
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    seen = []

    def hook(info):
        weight = next(info.model.module.parameters())
        before = weight.detach().clone()

        def after_backward():  # gradients there, weights untouched yet
            seen.append(("backward", info.step, weight.grad is not None, torch.equal(weight, before)))

        info.after_backward.append(after_backward)

        @contextmanager
        def around():
            seen.append(("enter", info.step, tuple(info.x.shape), info.optimizer is not None))
            yield
            seen.append(("exit", info.step, not torch.equal(weight, before)))  # the optimizer stepped inside

        return around()

    task = GPTTask.quick()
    try:
        train(
            task,
            Plan(),
            steps=3,
            optim=OptimConfig(lr=1e-2),
            log_every=0,
            verbose=False,
            measure_memory=False,
            step_hook=hook,
        )
    finally:
        env.shutdown()
    shape = (task.global_batch, task.seq_len)
    assert seen == [
        e for s in range(3) for e in (("enter", s, shape, True), ("backward", s, True, True), ("exit", s, True))
    ], seen
