"""Wrong ring all-reduces."""

import torch
import torch.distributed as dist


def _exchange(outgoing, incoming, right, left):
    send = dist.isend(outgoing, right)
    dist.recv(incoming, left)
    send.wait()


def _reduce_scatter(chunks, rank, n, right, left):
    scratch = torch.empty_like(chunks[0])
    for step in range(n - 1):
        incoming = chunks[(rank - step - 1) % n]
        received = scratch[: incoming.numel()]
        _exchange(chunks[(rank - step) % n], received, right, left)
        incoming += received


def _setup(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    return rank, n, (rank + 1) % n, (rank - 1) % n, torch.tensor_split(tensor.view(-1), n)


def mean_instead_of_sum(tensor):
    rank, n, right, left, chunks = _setup(tensor)
    _reduce_scatter(chunks, rank, n, right, left)
    for step in range(n - 1):
        _exchange(chunks[(rank + 1 - step) % n], chunks[(rank - step) % n], right, left)
    tensor /= n
    return tensor


def off_by_one_chunk(tensor):
    """All-gather passes on chunk (r - s) instead of (r + 1 - s): not yet finished."""
    rank, n, right, left, chunks = _setup(tensor)
    _reduce_scatter(chunks, rank, n, right, left)
    for step in range(n - 1):
        _exchange(chunks[(rank - step) % n], chunks[(rank - step - 1) % n], right, left)
    return tensor


def drops_the_remainder(tensor):
    """Chunks of numel // n elements: the last numel % n elements are never reduced."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    flat, size = tensor.view(-1), tensor.numel() // n
    chunks = [flat[i * size : (i + 1) * size] for i in range(n)]
    _reduce_scatter(chunks, rank, n, right, left)
    for step in range(n - 1):
        _exchange(chunks[(rank + 1 - step) % n], chunks[(rank - step) % n], right, left)
    return tensor


def reduce_scatter_only(tensor):
    """Forgets the all-gather phase."""
    rank, n, right, left, chunks = _setup(tensor)
    _reduce_scatter(chunks, rank, n, right, left)
    return tensor


def calls_all_reduce(tensor):
    """Correct numbers, but not built from send/recv."""
    dist.all_reduce(tensor)
    return tensor


def returns_a_copy(tensor):
    """Right values in a new tensor; the input is left as it was."""
    out = tensor.clone()
    rank, n, right, left, chunks = _setup(out)
    _reduce_scatter(chunks, rank, n, right, left)
    for step in range(n - 1):
        _exchange(chunks[(rank + 1 - step) % n], chunks[(rank - step) % n], right, left)
    return out


def calls_all_reduce_by_another_name(tensor):
    """The collective through a name the old spy did not replace (bound before the check started)."""
    from torch.distributed import distributed_c10d

    distributed_c10d.all_reduce(tensor)
    return tensor


def calls_the_process_group(tensor):
    """The collective straight on the process group object."""
    dist.group.WORLD.allreduce([tensor]).wait()
    return tensor


def bitmask_instead_of_modulo(tensor):
    """Chunk indices with `& (n - 1)` for `% n`: right only when n is a power of two (2 and 4, not 3)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = torch.tensor_split(tensor.view(-1), n)
    scratch = torch.empty_like(chunks[0])
    for step in range(n - 1):
        incoming = chunks[(rank - step - 1) & (n - 1)]
        received = scratch[: incoming.numel()]
        _exchange(chunks[(rank - step) & (n - 1)], received, right, left)
        incoming += received
    for step in range(n - 1):
        _exchange(chunks[(rank + 1 - step) & (n - 1)], chunks[(rank - step) & (n - 1)], right, left)
    return tensor


def _ring(tensor):
    rank, n, right, left, chunks = _setup(tensor)
    _reduce_scatter(chunks, rank, n, right, left)
    for step in range(n - 1):
        _exchange(chunks[(rank + 1 - step) % n], chunks[(rank - step) % n], right, left)
    return tensor


def destroys_process_group(tensor):
    """Right numbers, then tears down the process group the grader's workers share (on rank 1)."""
    _ring(tensor)
    if dist.get_rank() == 1:
        dist.destroy_process_group()
    return tensor


def kills_its_worker(tensor):
    """Right numbers on rank 0; rank 1's process exits in the middle of the check."""
    import os

    if dist.get_rank() == 1:
        os._exit(3)
    return _ring(tensor)


def deadlock(tensor):
    """Every rank waits to receive before anyone sends."""
    rank, n = dist.get_rank(), dist.get_world_size()
    dist.recv(torch.empty_like(tensor), (rank - 1) % n)
    dist.send(tensor, (rank + 1) % n)
    return tensor


PLANTED = [
    mean_instead_of_sum,
    off_by_one_chunk,
    drops_the_remainder,
    reduce_scatter_only,
    calls_all_reduce,
    returns_a_copy,
    calls_all_reduce_by_another_name,
    calls_the_process_group,
    bitmask_instead_of_modulo,
]
# destroys_process_group and kills_its_worker break the workers: tests/test_grading.py checks them on their own
# (the hint names rank 1, and the next check of a solution passes)


def sends_around_the_recorder(tensor):
    """A right ring, and the whole tensor sent to every other rank with the grader's dispatch recorder switched off
    in this process (issue 47: what a rank sends was counted only inside the answer's process). The kernel's TCP
    counters, read by the grader from outside, still see it."""
    from torch.utils._python_dispatch import _disable_current_modes

    rank, n = dist.get_rank(), dist.get_world_size()
    with _disable_current_modes():
        copies = [torch.empty_like(tensor) for _ in range(n)]
        ops = [dist.isend(tensor.clone(), q) for q in range(n) if q != rank]
        ops += [dist.irecv(copies[q], q) for q in range(n) if q != rank]
        for op in ops:
            op.wait()
    return _ring(tensor)


PLANTED.append(sends_around_the_recorder)
