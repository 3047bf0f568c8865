"""Wrong answers to exercise 03 (gradient accumulation with no_sync)."""

from _common import answer

EXERCISE, NOTEBOOK = "accumulate_no_sync", "03_accumulate_no_sync"


@answer("honest")
def zero_grad_every_micro_batch():
    """Honest: calls optimizer.zero_grad() at the start of every micro-batch, so only the last one's gradient is kept."""
    import contextlib

    def accumulation_step(model, optimizer, micro_batches, loss_fn):
        k = len(micro_batches)
        for i, (x, y) in enumerate(micro_batches):
            optimizer.zero_grad()
            with contextlib.nullcontext() if i == k - 1 else model.no_sync():
                (loss_fn(model(x), y) / k).backward()
        optimizer.step()

    return accumulation_step


@answer("honest")
def no_sync_only_on_the_first():
    """Honest: no_sync only around micro-batch 0 (right for k = 2): with k = 3 it all-reduces twice."""
    import contextlib

    def accumulation_step(model, optimizer, micro_batches, loss_fn):
        k = len(micro_batches)
        for i, (x, y) in enumerate(micro_batches):
            with model.no_sync() if i == 0 else contextlib.nullcontext():
                (loss_fn(model(x), y) / k).backward()
        optimizer.step()
        optimizer.zero_grad()

    return accumulation_step


@answer("honest")
def sum_losses_then_one_backward():
    """Honest: k forwards, their losses summed, one backward at the end (k micro-batches' activations alive at once)."""

    def accumulation_step(model, optimizer, micro_batches, loss_fn):
        k = len(micro_batches)
        total = sum(loss_fn(model(x), y) / k for x, y in micro_batches)
        total.backward()
        optimizer.step()
        optimizer.zero_grad()

    return accumulation_step


@answer("deliberate")
def no_grad_forwards_then_one_big_batch():
    """Deliberate: k forwards under no_grad to show k micro-batches, then one concatenated batch forward and backward."""
    import torch

    def accumulation_step(model, optimizer, micro_batches, loss_fn):
        with torch.no_grad():
            for x, _ in micro_batches:
                model.module(x)
        x = torch.cat([x for x, _ in micro_batches])
        y = torch.cat([y for _, y in micro_batches])
        loss_fn(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    return accumulation_step


@answer("deliberate")
def zero_loss_bait_then_big_batch():
    """Deliberate: k micro forward/backward pairs with loss * 0 inside no_sync as bait, then one big batch does the real work."""
    import torch

    def accumulation_step(model, optimizer, micro_batches, loss_fn):
        for x, y in micro_batches[:-1]:
            with model.no_sync():
                (loss_fn(model(x), y) * 0).backward()
        x = torch.cat([x for x, _ in micro_batches])
        y = torch.cat([y for _, y in micro_batches])
        loss_fn(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    return accumulation_step


@answer("deliberate")
def big_batch_unless_hooked():
    """Deliberate: the k micro-batches when the model carries someone's hooks (the grader counting); one big batch otherwise."""
    import contextlib

    import torch

    def hooked(module):
        seen = any(
            m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or getattr(m, "_backward_pre_hooks", None)
            for m in module.modules()
        )
        with open("/tmp/rt2_watched.log", "a") as f:  # which path each graded call took
            f.write(f"big_batch_unless_hooked hooked={seen}\n")
        return seen

    def accumulation_step(model, optimizer, micro_batches, loss_fn):
        k = len(micro_batches)
        if hooked(model.module):
            for i, (x, y) in enumerate(micro_batches):
                with contextlib.nullcontext() if i == k - 1 else model.no_sync():
                    (loss_fn(model(x), y) / k).backward()
        else:
            x = torch.cat([x for x, _ in micro_batches])
            y = torch.cat([y for _, y in micro_batches])
            loss_fn(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    return accumulation_step
