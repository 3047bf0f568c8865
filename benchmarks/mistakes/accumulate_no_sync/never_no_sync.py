"""Honest: never uses no_sync: every backward all-reduces, k all-reduces per step instead of one (right numbers, 3x the communication the exercise is about)."""

import contextlib


def accumulation_step(model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        last = i == k - 1
        with contextlib.nullcontext():
            loss = loss_fn(model(x), y) / k
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()


ANSWER = accumulation_step
KIND = "honest"
PROVE = {"world_size": 2, "micro": [3, 3, 3], "steps": 2}
