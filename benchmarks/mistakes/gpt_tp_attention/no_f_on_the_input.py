"""Honest: forgets Megatron's f: the output is right, but dL/dx is only this rank's heads' part (not summed over the ranks)."""

import torch
import torch.distributed as dist
from torch import nn

from simlib.models import attend
from simlib.parallel.tensor import ReduceFromTensorParallel


class TPAttention(nn.Module):
    def __init__(self, attn, group=None):
        super().__init__()
        rank, tp = dist.get_rank(group), dist.get_world_size(group)
        self.group, self.causal = group, attn.causal
        if attn.num_heads % tp:
            raise ValueError(f"{attn.num_heads} attention heads do not divide over {tp} tensor-parallel ranks")
        self.heads = attn.num_heads // tp
        head_dim = attn.hidden // attn.num_heads
        mine = slice(rank * self.heads, (rank + 1) * self.heads)
        rows = torch.arange(3 * attn.hidden).view(3, attn.num_heads, head_dim)[:, mine].reshape(-1)
        cols = torch.arange(mine.start * head_dim, mine.stop * head_dim)
        self.qkv = nn.Linear(attn.hidden, len(rows))
        self.out = nn.Linear(len(cols), attn.hidden)
        with torch.no_grad():
            self.qkv.weight.copy_(attn.qkv.weight[rows])
            self.qkv.bias.copy_(attn.qkv.bias[rows])
            self.out.weight.copy_(attn.out.weight[:, cols])
            self.out.bias.copy_(attn.out.bias)

    def forward(self, x):
        z = attend(self.qkv(x), self.heads, self.causal)
        y = ReduceFromTensorParallel.apply(nn.functional.linear(z, self.out.weight), self.group)
        return y + self.out.bias


ANSWER = TPAttention
KIND = "honest"
PROVE = {"world_size": 2, "heads": 4}
