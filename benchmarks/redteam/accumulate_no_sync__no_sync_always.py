# exercise: accumulate_no_sync
# kind: honest
# mistake: wraps every micro-batch (the last too) in no_sync: no all-reduce ever runs, each rank steps on its own gradient and the replicas drift apart.
def accumulation_step(model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    with model.no_sync():
        for x, y in micro_batches:
            (loss_fn(model(x), y) / k).backward()
    optimizer.step()
    optimizer.zero_grad()


ANSWER = accumulation_step
