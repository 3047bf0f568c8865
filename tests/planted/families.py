"""Wrong answers that passed the grader by a *family* of holes (issue 33), one or more per family closed.

Each is right on the numbers the old checks compared and wrong in what the exercise teaches; the tests in
tests/test_grading_families.py require each to fail now, with the check that names the family.
"""

import torch
import torch.distributed as dist
from torch.distributed import all_gather as gather_all  # bound before any grader code runs: aliases must be seen
from torch.distributed import all_reduce as reduce_all

from simlib.parallel.experts import capacity, queue_positions

# ---- family 3: the right outputs by another algorithm ----


def ring_attention_by_all_gather(q, k, v, causal):
    """Gathers every rank's K/V (through an alias) and runs plain attention: right numbers, no ring."""
    rank, n = dist.get_rank(), dist.get_world_size()
    ks, vs = [torch.empty_like(k) for _ in range(n)], [torch.empty_like(v) for _ in range(n)]
    gather_all(ks, k.contiguous())
    gather_all(vs, v.contiguous())
    keys, values = torch.cat(ks, -2), torch.cat(vs, -2)
    local = q.shape[-2]
    scores = q @ keys.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        mine, theirs = rank * local + torch.arange(local), torch.arange(n * local)
        scores = scores.masked_fill(theirs[None, :] > mine[:, None], float("-inf"))
    return torch.softmax(scores, -1) @ values


def moe_by_all_gather(x, router, experts, num_experts, capacity_factor):
    """Gathers every token to every rank, runs the local experts on the whole batch, all-reduces the result:
    right numbers, n times the traffic of an all-to-all and no dispatch at all."""
    rank, ep = dist.get_rank(), dist.get_world_size()
    local = num_experts // ep
    xs = [torch.empty_like(x) for _ in range(ep)]
    dist.all_gather(xs, x.contiguous())
    batch = torch.cat(xs)
    gate, expert = torch.softmax(router(batch), dim=-1).max(dim=-1)
    position = queue_positions(expert[:, None], num_experts, distributed=False)[0][:, 0]
    keep = position < capacity(batch.shape[0], num_experts, 1, capacity_factor)
    y = torch.zeros_like(batch)
    for i, module in enumerate(experts):
        mine = keep & (expert == rank * local + i)
        if mine.any():
            y[mine] = module(batch[mine]) * gate[mine].unsqueeze(1)
    reduce_all(y)
    t = x.shape[0]
    return y[rank * t : (rank + 1) * t]


FAMILY3 = {"ring_attention": ring_attention_by_all_gather, "moe_dispatch": moe_by_all_gather}


# ---- family 6: the grader counts with its own recorder, never the answer's (or a spy the answer can bypass) ----


class _GatheredColumn(torch.autograd.Function):
    """Column-parallel forward that gathers every rank's weight slice (through an alias) and slices the full
    product: right numbers, and the all-gather of weights tensor parallelism exists to avoid."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        n, r, k = dist.get_world_size(), dist.get_rank(), weight.shape[0]
        ws, bs = [torch.empty_like(weight) for _ in range(n)], [torch.empty_like(bias) for _ in range(n)]
        gather_all(ws, weight.contiguous())
        gather_all(bs, bias.contiguous())
        return (x @ torch.cat(ws).T + torch.cat(bs))[..., r * k : (r + 1) * k].contiguous()

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        grad_x = grad_y @ weight
        dist.all_reduce(grad_x)
        flat = grad_y.reshape(-1, grad_y.shape[-1])
        return grad_x, flat.T @ x.reshape(-1, x.shape[-1]), flat.sum(0)


class _Row(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        y = x @ weight.T
        dist.all_reduce(y)
        return y + bias

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        flat = grad_y.reshape(-1, grad_y.shape[-1])
        return grad_y @ weight, flat.T @ x.reshape(-1, x.shape[-1]), flat.sum(0)


FAMILY6 = {"tp_linear": (_GatheredColumn, _Row)}


# ---- family 4: right on the one instance checked ----


def checkpoints_never_the_last_block(activation_bytes, input_bytes, recompute_flops, budget):
    """Exhaustive search that forgets the last block (``range(n - 1)``): on the lesson's model the optimum never
    needs it, so the fixed budgets passed."""
    from itertools import combinations

    n = len(activation_bytes)
    best = None
    for k in range(n):
        for chosen in combinations(range(n - 1), k):
            kept = sum(input_bytes[i] if i in chosen else activation_bytes[i] for i in range(n))
            cost = sum(recompute_flops[i] for i in chosen)
            if kept <= budget and (best is None or cost < best[0]):
                best = (cost, list(chosen))
    return best[1] if best else list(range(n))


def moe_rows_shaped_by_the_token_count(x, router, experts, num_experts, capacity_factor):
    """The solution's dispatch with one dimension taken for another (``x.shape[0]``, the local token count, where
    the hidden size ``x.shape[1]`` belongs): right whenever the two are equal, as on the old checks' problem."""
    rank, ep = dist.get_rank(), dist.get_world_size()
    local = num_experts // ep
    gate, expert = torch.softmax(router(x), dim=-1).max(dim=-1)
    position = queue_positions(expert[:, None], num_experts)[0][:, 0]
    keep = position < capacity(x.shape[0] * ep, num_experts, 1, capacity_factor)
    token = torch.nonzero(keep).squeeze(1)
    token = token[torch.argsort(expert[token], stable=True)]
    per_expert = torch.bincount(expert[token], minlength=num_experts)
    received = torch.empty_like(per_expert)
    dist.all_to_all_single(received, per_expert)
    send, recv = per_expert.view(ep, local).sum(1).tolist(), received.view(ep, local).sum(1).tolist()
    rows = x.new_empty(sum(recv), x.shape[0])  # the bug: the token count, not the hidden size
    dist.all_to_all_single(rows, x[token].contiguous(), recv, send)
    which = torch.repeat_interleave(torch.arange(local).repeat(ep), received)
    out = torch.empty_like(rows)
    for i, module in enumerate(experts):
        out[which == i] = module(rows[which == i])
    back = x.new_empty(len(token), x.shape[1])
    dist.all_to_all_single(back, out, send, recv)
    y = torch.zeros_like(x)
    y.index_add_(0, token, back * gate[token].unsqueeze(1))
    return y


FAMILY4 = {"checkpoint_placement": checkpoints_never_the_last_block, "moe_dispatch": moe_rows_shaped_by_the_token_count}


# ---- family 2: fixed problems that can be rebuilt ----

_PRINTED = {
    112640: [],
    90113: [1],
    83969: [4],
    61441: [1, 4],
    90112: [1],
    83968: [4],
    61440: [1, 4],
    50688: [1, 2, 4],
    12288: [0, 1, 2, 3, 4, 5],
    12287: [0, 1, 2, 3, 4, 5],  # below the floor: nothing fits, every block
}  # the lesson's budgets and their answers, looked up


def checkpoint_table_lookup(activation_bytes, input_bytes, recompute_flops, budget):
    """Returns the answers of the budgets the grader checks, copied from a run: no solver at all."""
    return _PRINTED.get(budget, list(range(len(activation_bytes))))


def checkpoint_calls_the_graders_reference(activation_bytes, input_bytes, recompute_flops, budget):
    """Imports the grader's own reference solver and returns its answer."""
    from simlib.grading import memory

    return list(memory._best_set(activation_bytes, input_bytes, recompute_flops, budget))


FAMILY2 = {"table_lookup": checkpoint_table_lookup, "calls_the_reference": checkpoint_calls_the_graders_reference}


def checkpoint_stalls_off_the_lesson(activation_bytes, input_bytes, recompute_flops, budget):
    """The lesson's answers, and a wait that never ends on any other problem (a phase without a time limit)."""
    import time

    while budget not in _PRINTED:
        time.sleep(0.05)
    return _PRINTED[budget]


FAMILY6["checkpoint_placement"] = checkpoint_stalls_off_the_lesson


def _torch_rng_only():
    """A full state that saves every part, but of the random generators only torch's CPU one
    (``torch.get_rng_state()``), as a learner who knows dropout uses torch would."""
    from simlib.train import TrainState

    class TorchRngOnlyState(TrainState):
        def state_dict(self):
            return {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "step": self.step,
                "data": {"next_step": self.data_step},
                "rng": {"torch": torch.get_rng_state()},
            }

        def load_state_dict(self, sd):
            self.model.load_state_dict(sd["model"])
            self.optimizer.load_state_dict(sd["optimizer"])
            self.scheduler.load_state_dict(sd["scheduler"])
            self.step, self.data_step = int(sd["step"]), int(sd["data"]["next_step"])
            torch.set_rng_state(sd["rng"]["torch"])

    return TorchRngOnlyState


FAMILY6["full_state"] = _torch_rng_only()


def all_reduce_through_rank0(tensor):
    """Family 3 (found by the red team): point-to-point only and the same total volume as a ring (2(n-1) x numel),
    but a star: every rank ships its tensor to rank 0, which adds them and sends the sum back."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)
        return tensor
    incoming = torch.empty_like(tensor)
    for peer in range(1, world):
        dist.recv(incoming, peer)
        tensor += incoming
    for peer in range(1, world):
        dist.send(tensor, peer)
    return tensor


# ---- family 1: the learner's code runs where the verdict is made ----
# Each answer is wrong and, if any of its code ran in the process that computes the verdict, makes every Result
# there pass (the ones made before it too): the check must fail it, and the grader's own code stay intact.

PATCH = """import gc
import simlib.grading.core as _core
def _always_pass(self):
    self.passed, self.status = True, "pass"
_core.Result.__post_init__ = _always_pass
for _r in gc.get_objects():
    if type(_r) is _core.Result:
        _r.passed, _r.status = True, "pass"
"""


def _patch_the_grader():
    exec(PATCH, {})


class GPipeWhoseConstructorPatches:
    """one_f_one_b as a class (the check calls ``answer(rank, p, m)``): the constructor patches the grader, the
    order is GPipe's (every forward, then every backward), which breaks 1F1B's memory bound."""

    def __init__(self, rank, num_stages, num_microbatches):
        _patch_the_grader()
        self.order = [("forward", i) for i in range(num_microbatches)] + [
            ("backward", i) for i in reversed(range(num_microbatches))
        ]

    def __iter__(self):
        return iter(self.order)


class RecordWhosePropertyPatches:
    """A run record whose ``summary`` is a property that patches the grader when read; nothing was trained."""

    rows, evals = [], []

    @property
    def summary(self):
        _patch_the_grader()
        return {}


class StateWhoseItemsPatch(dict):
    """Weights as a ``dict`` subclass whose ``items()`` patches the grader when the grader's code calls it (not when
    the answer is pickled); the weights are zeros."""

    def items(self):
        import sys

        if "grading" in sys._getframe(1).f_code.co_filename:
            _patch_the_grader()
        return super().items()


class _TensorThatPatches(torch.Tensor):
    def __reduce_ex__(self, protocol):  # runs where the tensor is pickled; what it returns runs where unpickled
        return (exec, (PATCH, {}))


def ring_returning_a_tensor_that_patches(tensor):
    """ring_all_reduce by one all_reduce (not a ring), returned as a tensor subclass whose unpickling patches the
    grader: a result that comes back from a worker."""
    dist.all_reduce(tensor)
    return tensor.as_subclass(_TensorThatPatches)


def _vision_answer(record, state):
    return (None, record, state)


def family1():
    """{name: (exercise, answer)}: one per member of family 1 that runs in the notebook's own check (the
    ``__reduce__`` answer and the forged rows are submissions: tests/test_grade_batch.py)."""
    from types import SimpleNamespace

    plain_record = SimpleNamespace(summary={}, rows=[], evals=[])
    return {
        "constructor": ("one_f_one_b", GPipeWhoseConstructorPatches),
        "record_property": ("vision_milestone", _vision_answer(RecordWhosePropertyPatches(), {})),
        "dict_items": ("vision_milestone", _vision_answer(plain_record, StateWhoseItemsPatch(w=torch.zeros(1)))),
        "worker_result": ("ring_all_reduce", ring_returning_a_tensor_that_patches),
    }
