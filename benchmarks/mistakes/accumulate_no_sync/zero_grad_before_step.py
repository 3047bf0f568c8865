"""Honest: zero_grad() before step(): the step sees zero gradients and the weights do not move (plain SGD: no update at all)."""

import contextlib


def accumulation_step(model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        last = i == k - 1
        with contextlib.nullcontext() if last else model.no_sync():
            loss = loss_fn(model(x), y) / k
            loss.backward()
    optimizer.zero_grad()
    optimizer.step()


ANSWER = accumulation_step
KIND = "honest"
PROVE = {"world_size": 2, "micro": [3, 3, 3], "steps": 2}
