# exercise: ring_all_reduce
# kind: honest
# mistake: torch.chunk instead of tensor_split: for a size that does not divide, chunk returns fewer than n chunks, so the ring indexes past the end (numel 5 on 4 ranks gives 3 chunks: IndexError).
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = list(torch.chunk(tensor.view(-1), n))
    scratch = torch.empty_like(chunks[0])
    for step in range(n - 1):
        out, inc = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        got = scratch[: inc.numel()]
        s = dist.isend(out, right)
        dist.recv(got, left)
        s.wait()
        inc += got
    for step in range(n - 1):
        out, inc = chunks[(rank + 1 - step) % n], chunks[(rank - step) % n]
        s = dist.isend(out, right)
        dist.recv(inc, left)
        s.wait()
    return tensor


ANSWER = ring_all_reduce
