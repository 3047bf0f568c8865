"""Wrong pieces of the GPT project (solutions/10_gpt_pieces.ipynb): the bucketed gradient synchronisation and the
attention block split by heads, each a classic mistake named for it."""

import torch
import torch.distributed as dist
from torch import nn

from simlib.models import attend
from simlib.parallel.data import make_buckets
from simlib.parallel.tensor import CopyToTensorParallel, ReduceFromTensorParallel


class _Sync(nn.Module):
    """The solution's skeleton: buckets of the trainable parameters, last layer first, a hook on each."""

    world_of_group = True

    def __init__(self, module, bucket_cap_mb=25.0, group=None):
        super().__init__()
        self.module, self.group = module, group
        self.world_size = dist.get_world_size(group if self.world_of_group else None)
        self.buckets = make_buckets(module.parameters(), bucket_cap_mb)
        self.buffers = [torch.zeros(sum(p.numel() for p in b)) for b in self.buckets]
        self.slot = {}
        for i, bucket in enumerate(self.buckets):
            offset = 0
            for p in bucket:
                self.slot[p] = (i, offset)
                offset += p.numel()
                p.register_post_accumulate_grad_hook(self.on_grad_ready)
        self.reset()

    def reset(self):
        self.pending = [len(b) for b in self.buckets]
        self.handles = [None] * len(self.buckets)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def send(self, i):
        self.handles[i] = dist.all_reduce(self.buffers[i], group=self.group, async_op=True)

    def on_grad_ready(self, param):
        i, offset = self.slot[param]
        self.buffers[i][offset : offset + param.numel()].copy_(param.grad.view(-1))
        self.pending[i] -= 1
        if self.pending[i] == 0:
            self.send(i)

    def send_unfilled(self):
        for i, bucket in enumerate(self.buckets):
            if self.handles[i] is None:
                for p in bucket:
                    if p.grad is None:
                        j, offset = self.slot[p]
                        self.buffers[j][offset : offset + p.numel()].zero_()
                self.send(i)

    def copy_back(self, keep_none=True):
        for bucket, buffer, handle in zip(self.buckets, self.buffers, self.handles):
            handle.wait()
            buffer /= self.world_size
            offset = 0
            for p in bucket:
                mean = buffer[offset : offset + p.numel()].view_as(p)
                if p.grad is not None:
                    p.grad.copy_(mean)
                elif not keep_none:
                    p.grad = mean.clone()
                offset += p.numel()

    def finish_gradient_synchronization(self):
        self.send_unfilled()
        self.copy_back()
        self.reset()


class WaitsOnNoneHandle(_Sync):
    """Lesson 02's answer as it was: a bucket holding an unused parameter never filled, so its handle is None."""

    def finish_gradient_synchronization(self):
        self.copy_back()
        self.reset()


class IgnoresTheGroup(_Sync):
    """All-reduces over the whole world and divides by its size: right under Plan(dp=2), wrong under dp x tp."""

    world_of_group = False

    def send(self, i):
        self.handles[i] = dist.all_reduce(self.buffers[i], async_op=True)


class GivesUnusedAGradient(_Sync):
    """Writes the mean (a zero) into every parameter's gradient, also where p.grad was None."""

    def finish_gradient_synchronization(self):
        self.send_unfilled()
        self.copy_back(keep_none=False)
        self.reset()


class SendsEveryBucketTwice(_Sync):
    """Starts each bucket's all-reduce from the hook and again in finish (the second sum of sums, divided once more
    by the world size, is the same mean: the values pass, the messages do not)."""

    def finish_gradient_synchronization(self):
        self.send_unfilled()
        for h in self.handles:
            h.wait()
        for i in range(len(self.buckets)):
            self.buffers[i] /= self.world_size
            self.send(i)
        self.copy_back()
        self.reset()


class LessonTwoSignature(_Sync):
    """Lesson 02's signature, (module, bucket_cap_mb): no group= (refused by the slot under a dp x tp mesh)."""

    def __init__(self, module, bucket_cap_mb=25.0):
        super().__init__(module, bucket_cap_mb)


GRAD_SYNC = {
    "WaitsOnNoneHandle": WaitsOnNoneHandle,
    "IgnoresTheGroup": IgnoresTheGroup,
    "GivesUnusedAGradient": GivesUnusedAGradient,
    "SendsEveryBucketTwice": SendsEveryBucketTwice,
}


class _Attention(nn.Module):
    contiguous = False
    refuse = True
    f = True
    bias_once = True

    def __init__(self, attn, group=None):
        super().__init__()
        rank, tp = dist.get_rank(group), dist.get_world_size(group)
        if self.refuse and attn.num_heads % tp:
            raise ValueError(f"{attn.num_heads} attention heads do not divide over {tp} tensor-parallel ranks")
        self.group, self.heads, self.causal, self.tp = group, attn.num_heads // tp, attn.causal, tp
        hd = attn.hidden // attn.num_heads
        mine = slice(rank * self.heads, (rank + 1) * self.heads)
        if self.contiguous:
            n = 3 * self.heads * hd
            rows = torch.arange(rank * n, (rank + 1) * n)
        else:
            rows = torch.arange(3 * attn.hidden).view(3, attn.num_heads, hd)[:, mine].reshape(-1)
        cols = torch.arange(mine.start * hd, mine.stop * hd)
        self.qkv = nn.Linear(attn.hidden, len(rows))
        self.out = nn.Linear(len(cols), attn.hidden)
        with torch.no_grad():
            self.qkv.weight.copy_(attn.qkv.weight[rows])
            self.qkv.bias.copy_(attn.qkv.bias[rows])
            self.out.weight.copy_(attn.out.weight[:, cols])
            self.out.bias.copy_(attn.out.bias)

    def forward(self, x):
        if self.f:
            x = CopyToTensorParallel.apply(x, self.group)
        z = attend(self.qkv(x), self.heads, self.causal)
        if self.bias_once:
            return ReduceFromTensorParallel.apply(nn.functional.linear(z, self.out.weight), self.group) + self.out.bias
        return ReduceFromTensorParallel.apply(self.out(z), self.group)


class ContiguousRows(_Attention):
    """Takes one contiguous block of 3H/tp rows of the fused qkv: rank 0 gets the q of every head, no k or v."""

    contiguous = True


class NoGradientAllReduce(_Attention):
    """Forgets Megatron's f: the forward is right, dL/dx is only this rank's heads' part."""

    f = False


class BiasOnEveryRank(_Attention):
    """Adds the out bias before the all-reduce: it is summed tp times."""

    bias_once = False


class FloorsTheHeads(_Attention):
    """No refusal: heads // tp each when the heads do not divide, so a head is silently dropped."""

    refuse = False


TP_ATTENTION = {
    "ContiguousRows": ContiguousRows,
    "NoGradientAllReduce": NoGradientAllReduce,
    "BiasOnEveryRank": BiasOnEveryRank,
    "FloorsTheHeads": FloorsTheHeads,
}
