# exercise: ring_all_reduce
# kind: honest
# mistake: written and tested on 2 ranks only: swaps the whole tensor with the neighbour and adds, which is a sum of two ranks, not n (wrong on 3 and 4 ranks).
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    buf = torch.empty_like(tensor)
    s = dist.isend(tensor.clone(), (rank + 1) % n)
    dist.recv(buf, (rank - 1) % n)
    s.wait()
    tensor += buf
    return tensor


ANSWER = ring_all_reduce
