"""Wrong gradient accumulation with DDP."""

import contextlib


def loss_not_divided_by_k(model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == k - 1 else model.no_sync():
            loss_fn(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()


def no_sync_left_on_at_last_step(model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    for x, y in micro_batches:
        with model.no_sync():
            (loss_fn(model(x), y) / k).backward()
    optimizer.step()
    optimizer.zero_grad()


def never_no_sync(model, optimizer, micro_batches, loss_fn):
    """Correct update, k times the communication."""
    k = len(micro_batches)
    for x, y in micro_batches:
        (loss_fn(model(x), y) / k).backward()
    optimizer.step()
    optimizer.zero_grad()


def step_every_micro_batch(model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == k - 1 else model.no_sync():
            (loss_fn(model(x), y) / k).backward()
        optimizer.step()
    optimizer.zero_grad()


def forgets_zero_grad(model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == k - 1 else model.no_sync():
            (loss_fn(model(x), y) / k).backward()
    optimizer.step()


def hard_coded_k(model, optimizer, micro_batches, loss_fn):
    """Written for k = 3: divides by 3 and syncs at index 2, whatever len(micro_batches) is."""
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == 2 else model.no_sync():
            (loss_fn(model(x), y) / 3).backward()
    optimizer.step()
    optimizer.zero_grad()


def one_big_batch(model, optimizer, micro_batches, loss_fn):
    """Right gradients, wrong algorithm: the micro-batches concatenated into one forward and one backward
    (k times the activation memory accumulation exists to avoid)."""
    import torch

    x = torch.cat([mx for mx, _ in micro_batches])
    y = torch.cat([my for _, my in micro_batches])
    loss_fn(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()


def sums_losses_one_backward(model, optimizer, micro_batches, loss_fn):
    """Right gradients, wrong algorithm: k forwards kept alive, then one backward of the summed losses."""
    k = len(micro_batches)
    with model.no_sync():
        losses = [loss_fn(model(x), y) / k for x, y in micro_batches[:-1]]
    x, y = micro_batches[-1]
    total = sum(losses) + loss_fn(model(x), y) / k
    total.backward()
    optimizer.step()
    optimizer.zero_grad()


PLANTED = [
    loss_not_divided_by_k,
    no_sync_left_on_at_last_step,
    never_no_sync,
    step_every_micro_batch,
    forgets_zero_grad,
    hard_coded_k,
    one_big_batch,
    sums_losses_one_backward,
]
