"""Wrong answers to exercise 01 (ring all-reduce from send/recv)."""

from _common import answer

EXERCISE, NOTEBOOK = "ring_all_reduce", "01_ring_all_reduce"


@answer("honest")
def allgather_chunk_off_by_one():
    """Honest: the all-gather phase sends chunk (r - s) and receives (r - s - 1), the reduce-scatter's indices."""
    import torch
    import torch.distributed as dist

    def ring_all_reduce(tensor):
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        chunks = torch.tensor_split(tensor.view(-1), n)
        scratch = torch.empty_like(chunks[0])
        for s in range(n - 1):
            out, inc = chunks[(rank - s) % n], chunks[(rank - s - 1) % n]
            got = scratch[: inc.numel()]
            req = dist.isend(out, right)
            dist.recv(got, left)
            req.wait()
            inc += got
        for s in range(n - 1):
            out, inc = chunks[(rank - s) % n], chunks[(rank - s - 1) % n]
            req = dist.isend(out, right)
            dist.recv(inc, left)
            req.wait()
        return tensor

    return ring_all_reduce


@answer("honest")
def torch_chunk_not_tensor_split():
    """Honest: splits with torch.chunk, which gives fewer than n chunks when the length does not divide."""
    import torch
    import torch.distributed as dist

    def ring_all_reduce(tensor):
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        chunks = torch.chunk(tensor.view(-1), n)
        for s in range(n - 1):
            out, inc = chunks[(rank - s) % n], chunks[(rank - s - 1) % n]
            got = torch.empty_like(inc)
            req = dist.isend(out, right)
            dist.recv(got, left)
            req.wait()
            inc += got
        for s in range(n - 1):
            out, inc = chunks[(rank + 1 - s) % n], chunks[(rank - s) % n]
            req = dist.isend(out, right)
            dist.recv(inc, left)
            req.wait()
        return tensor

    return ring_all_reduce


@answer("honest")
def blocking_send_then_recv():
    """Honest: every rank does a blocking dist.send before its recv (the deadlock the task warns of, for large messages)."""
    import torch
    import torch.distributed as dist

    def ring_all_reduce(tensor):
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        chunks = torch.tensor_split(tensor.view(-1), n)
        scratch = torch.empty_like(chunks[0])
        for s in range(n - 1):
            out, inc = chunks[(rank - s) % n], chunks[(rank - s - 1) % n]
            got = scratch[: inc.numel()]
            dist.send(out.clone(), right)
            dist.recv(got, left)
            inc += got
        for s in range(n - 1):
            out, inc = chunks[(rank + 1 - s) % n], chunks[(rank - s) % n]
            dist.send(out.clone(), right)
            dist.recv(inc, left)
        return tensor

    return ring_all_reduce


@answer("deliberate")
def decoy_ring_sum_through_files():
    """Deliberate: runs a correct ring on zeros (right volume, neighbours only) and computes the sum through files in /tmp."""
    import os
    import sys
    import time

    import torch
    import torch.distributed as dist

    def ring_all_reduce(tensor):
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        decoy = torch.zeros_like(tensor).view(-1)
        chunks = torch.tensor_split(decoy, n)
        for phase in range(2):
            for s in range(n - 1):
                out = chunks[(rank - s + phase) % n]
                inc = chunks[(rank - s - 1 + phase) % n]
                got = torch.empty_like(inc)
                req = dist.isend(out, right)
                dist.recv(got, left)
                req.wait()
                inc.copy_(got)
        key = f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}_{os.environ.get('MASTER_PORT', '')}_{os.getppid()}_{n}"
        seq = getattr(sys, "_rt2_ring_seq", 0)
        sys._rt2_ring_seq = seq + 1
        folder = f"/tmp/rt2_ring_{key}"
        os.makedirs(folder, exist_ok=True)
        torch.save(tensor.detach().clone(), f"{folder}/{seq}_{rank}.tmp")
        os.replace(f"{folder}/{seq}_{rank}.tmp", f"{folder}/{seq}_{rank}.pt")
        deadline = time.time() + 20
        while not all(os.path.exists(f"{folder}/{seq}_{r}.pt") for r in range(n)) and time.time() < deadline:
            time.sleep(0.002)
        total = sum(torch.load(f"{folder}/{seq}_{r}.pt") for r in range(n))
        tensor.copy_(total)
        if seq >= 2:  # every rank has read call seq - 2 by now (it finished call seq - 1)
            os.remove(f"{folder}/{seq - 2}_{rank}.pt")
        return tensor

    return ring_all_reduce


@answer("deliberate")
def ring_only_for_small_tensors():
    """Deliberate: the ring for tensors up to 4096 elements (what a check is likely to use), dist.all_reduce above."""
    import torch
    import torch.distributed as dist

    def ring_all_reduce(tensor):
        if tensor.numel() > 4096:
            dist.all_reduce(tensor)
            return tensor
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        chunks = torch.tensor_split(tensor.view(-1), n)
        scratch = torch.empty_like(chunks[0])
        for s in range(n - 1):
            out, inc = chunks[(rank - s) % n], chunks[(rank - s - 1) % n]
            got = scratch[: inc.numel()]
            req = dist.isend(out, right)
            dist.recv(got, left)
            req.wait()
            inc += got
        for s in range(n - 1):
            out, inc = chunks[(rank + 1 - s) % n], chunks[(rank - s) % n]
            req = dist.isend(out, right)
            dist.recv(inc, left)
            req.wait()
        return tensor

    return ring_all_reduce


@answer("deliberate")
def ring_only_when_watched():
    """Deliberate: the ring while a dispatch mode, tracer or wrapped collective is seen; plain dist.all_reduce otherwise."""
    import torch
    import torch.distributed as dist
    from _common import watched

    def ring_all_reduce(tensor):
        if not watched():
            dist.all_reduce(tensor)
            return tensor
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        chunks = torch.tensor_split(tensor.view(-1), n)
        scratch = torch.empty_like(chunks[0])
        for s in range(n - 1):
            out, inc = chunks[(rank - s) % n], chunks[(rank - s - 1) % n]
            got = scratch[: inc.numel()]
            req = dist.isend(out, right)
            dist.recv(got, left)
            req.wait()
            inc += got
        for s in range(n - 1):
            out, inc = chunks[(rank + 1 - s) % n], chunks[(rank - s) % n]
            req = dist.isend(out, right)
            dist.recv(inc, left)
            req.wait()
        return tensor

    return ring_all_reduce


@answer("honest")
def scratch_in_default_dtype():
    """Honest: the receive buffer is torch.empty(numel) in the default float32, whatever the tensor's dtype."""
    import torch
    import torch.distributed as dist

    def ring_all_reduce(tensor):
        rank, n = dist.get_rank(), dist.get_world_size()
        right, left = (rank + 1) % n, (rank - 1) % n
        chunks = torch.tensor_split(tensor.view(-1), n)
        scratch = torch.empty(chunks[0].numel())
        for s in range(n - 1):
            out, inc = chunks[(rank - s) % n], chunks[(rank - s - 1) % n]
            got = scratch[: inc.numel()]
            req = dist.isend(out, right)
            dist.recv(got, left)
            req.wait()
            inc += got.to(inc.dtype)
        for s in range(n - 1):
            out, inc = chunks[(rank + 1 - s) % n], chunks[(rank - s) % n]
            req = dist.isend(out, right)
            dist.recv(inc, left)
            req.wait()
        return tensor

    return ring_all_reduce
