# exercise: ring_all_reduce
# kind: fool
# mistake: no ring at all: calls the default ProcessGroup's C++ allreduce directly, bypassing any Python-level wrapper on dist.all_reduce.
import torch.distributed as dist


def ring_all_reduce(tensor):
    pg = dist.distributed_c10d._get_default_group()
    pg.allreduce([tensor]).wait()
    return tensor


ANSWER = ring_all_reduce
