"""Honest: syncs the first micro-batch and runs the later ones under no_sync: the all-reduce happens before the other gradients exist, so they stay local (replicas differ)."""

import contextlib


def accumulation_step(model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        last = i == k - 1
        with contextlib.nullcontext() if i == 0 else model.no_sync():
            loss = loss_fn(model(x), y) / k
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()


ANSWER = accumulation_step
KIND = "honest"
PROVE = {"world_size": 2, "micro": [3, 3, 3], "steps": 2}
