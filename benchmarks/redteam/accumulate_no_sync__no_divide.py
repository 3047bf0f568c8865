# exercise: accumulate_no_sync
# kind: honest
# mistake: forgets to divide each micro-batch loss by k: the step uses the sum of k mean gradients, k times too large.
import contextlib


def accumulation_step(model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == k - 1 else model.no_sync():
            loss_fn(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()


ANSWER = accumulation_step
