# exercise: accumulate_no_sync
# kind: fool
# mistake: concatenates the micro-batches and runs one forward/backward: k times the activation memory (accumulation's point), and wrong when micro-batches differ in size (mean over samples, not mean of means).
import torch


def accumulation_step(model, optimizer, micro_batches, loss_fn):
    x = torch.cat([x for x, _ in micro_batches])
    y = torch.cat([y for _, y in micro_batches])
    loss_fn(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()


ANSWER = accumulation_step
