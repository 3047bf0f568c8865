"""Honest: runs every backward inside no_sync, the last one too: DDP never all-reduces, each rank steps on its own gradients and the replicas drift apart."""


def accumulation_step(model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        last = i == k - 1
        with model.no_sync():
            loss = loss_fn(model(x), y) / k
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()


ANSWER = accumulation_step
KIND = "honest"
PROVE = {"world_size": 2, "micro": [3, 3, 3], "steps": 2}
