"""Honest: divides the loss by the micro-batch's size (len(x)) instead of the number of micro-batches: the loss is already a mean (3 micro-batches of 4 samples: gradients 3/4 of the right ones)."""

import contextlib


def accumulation_step(model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        last = i == k - 1
        with contextlib.nullcontext() if last else model.no_sync():
            loss = loss_fn(model(x), y) / len(x)
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()


ANSWER = accumulation_step
KIND = "honest"
PROVE = {"world_size": 2, "micro": [4, 4, 4], "steps": 2}
