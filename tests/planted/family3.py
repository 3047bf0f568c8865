"""Issue 33's family 3, second round: right outputs by another algorithm, where the algorithm's *contract* (what
the messages carry, how much moves, in what order, what stays in memory, whose code runs) is what fails.

Each was passed by the checks before this round (the second red team found them: benchmarks/redteam2/);
tests/test_grading_family3.py requires each to fail now, with the check that names the contract it breaks.
"""

import os
import types

import numpy as np
import torch
import torch.distributed as dist

from simlib.train import TrainState

# ---- ring all-reduce: the ring carries zeros, the sum comes another way (here: files) ----


def ring_on_zeros_sum_through_files(tensor):
    """A perfect ring (neighbours, volume, in place) run on zeros; the values go through a shared folder."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(torch.zeros_like(tensor).view(-1), n)
    for phase in range(2):
        for s in range(n - 1):
            got = torch.empty_like(chunks[(rank - s - 1 + phase) % n])
            req = dist.isend(chunks[(rank - s + phase) % n], (rank + 1) % n)
            dist.recv(got, (rank - 1) % n)
            req.wait()
    folder = f"/tmp/simlib-planted-ring-{os.getppid()}-{n}"
    os.makedirs(folder, exist_ok=True)
    seq = globals().setdefault("_calls", [0])
    seq[0] += 1
    torch.save(tensor.clone(), f"{folder}/{seq[0]}_{rank}.tmp")
    os.replace(f"{folder}/{seq[0]}_{rank}.tmp", f"{folder}/{seq[0]}_{rank}.pt")
    dist.barrier()
    tensor.copy_(sum(torch.load(f"{folder}/{seq[0]}_{r}.pt") for r in range(n)))
    return tensor


# ---- average_gradients: every rank's whole gradient gathered, then the mean ----


def all_gather_then_mean(model):
    n = dist.get_world_size()
    for p in [p for p in model.parameters() if p.grad is not None]:  # a frozen or unused one has none
        parts = [torch.empty_like(p.grad) for _ in range(n)]
        dist.all_gather(parts, p.grad)
        p.grad.copy_(torch.stack(parts).mean(0))


# ---- pipeline_stage (GPipe): each micro-batch's backward right after its forward ----


def backward_right_after_forward(stage, inputs, targets, activation_shape):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world_size - 1
    m, total = len(inputs), 0.0
    for i in range(m):
        x = inputs[i] if first else torch.empty(activation_shape)
        if not first:
            dist.recv(x, src=rank - 1)
            x.requires_grad_()
        y = stage(x)
        if last:
            loss = torch.nn.functional.mse_loss(y, targets[i]) / m
            loss.backward()
            total += loss.item()
        else:
            dist.send(y.detach(), dst=rank + 1)
            grad = torch.empty(activation_shape)
            dist.recv(grad, src=rank + 1)
            y.backward(grad)
        if not first:
            dist.send(x.grad, dst=rank - 1)
    return total if last else None


# ---- ring attention: the ring passes K/V, but every block is kept (torch: one SDPA; NumPy: outside torch) ----


def _collect(k, v, rank, n, keep):
    kept = {rank: keep(k, v)}
    for step in range(n - 1):
        nk, nv = torch.empty_like(k), torch.empty_like(v)
        for r in dist.batch_isend_irecv(
            [
                dist.P2POp(dist.isend, k, (rank + 1) % n),
                dist.P2POp(dist.isend, v, (rank + 1) % n),
                dist.P2POp(dist.irecv, nk, (rank - 1) % n),
                dist.P2POp(dist.irecv, nv, (rank - 1) % n),
            ]
        ):
            r.wait()
        k, v = nk, nv
        kept[(rank - step - 1) % n] = keep(k, v)
    return [kept[r] for r in range(n)]


def _mask(causal, rank, local, n):
    return (torch.arange(n * local)[None, :] <= (torch.arange(local) + rank * local)[:, None]) if causal else None


def ring_keeps_every_block_then_sdpa(q, k, v, causal):
    rank, n = dist.get_rank(), dist.get_world_size()
    blocks = _collect(k, v, rank, n, lambda k, v: (k, v))
    keys, values = torch.cat([b[0] for b in blocks], -2), torch.cat([b[1] for b in blocks], -2)
    del blocks
    return torch.nn.functional.scaled_dot_product_attention(
        q, keys, values, attn_mask=_mask(causal, rank, q.shape[-2], n)
    )


def ring_keeps_every_block_in_numpy(q, k, v, causal):
    rank, n = dist.get_rank(), dist.get_world_size()
    blocks = _collect(k, v, rank, n, lambda k, v: (k.numpy().copy(), v.numpy().copy()))
    keys = np.concatenate([b[0] for b in blocks], -2)
    values = np.concatenate([b[1] for b in blocks], -2)
    s = q.numpy() @ np.swapaxes(keys, -1, -2) * q.shape[-1] ** -0.5
    if causal:
        s = np.where(_mask(True, rank, q.shape[-2], n).numpy(), s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    return torch.from_numpy((s / s.sum(-1, keepdims=True)) @ values)


# ---- full_state: the library's own TrainState code, copied into new functions before the check ----


def _copied(f, name):
    g = types.FunctionType(f.__code__, f.__globals__, name, f.__defaults__, f.__closure__)
    g.__qualname__ = name
    return g


_SAVE, _LOAD = _copied(TrainState.state_dict, "save"), _copied(TrainState.load_state_dict, "load")


class LibraryCodeCopied(TrainState):
    def state_dict(self):
        return _SAVE(self)

    def load_state_dict(self, sd):
        _LOAD(self, sd)


FAMILY3_CONTRACTS = {
    "ring_all_reduce": [ring_on_zeros_sum_through_files],
    "average_gradients": [all_gather_then_mean],
    "pipeline_stage": [backward_right_after_forward],
    "ring_attention": [ring_keeps_every_block_then_sdpa, ring_keeps_every_block_in_numpy],
}
# LibraryCodeCopied runs the library's own code: no longer refused (issue 47: the library is open); `simlib grade`
# notes a close copy for the teacher instead (tests/test_grading_family3.py)
