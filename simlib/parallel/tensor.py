"""Tensor parallelism: split each layer's weights over the ranks of a group (Megatron-LM).

Shoeybi et al. 2019, "Megatron-LM: Training multi-billion parameter language models using model
parallelism", sec. 3. Two autograd functions carry the idea:

    column-parallel Linear   Y_r = X W_r^T           each rank holds rows ``r`` of W (a slice of the output
                                                     features); forward needs no communication, backward
                                                     all-reduces dL/dX (Megatron's ``f``: identity / all-reduce)
    row-parallel Linear      Y = sum_r X_r W_r^T     each rank holds columns ``r`` of W (a slice of the input
                                                     features); forward all-reduces Y, backward needs none
                                                     (Megatron's ``g``: all-reduce / identity)

Column then row (the Megatron MLP, or attention split by heads) costs one all-reduce of the layer's
output (B·S·H values) in forward and one of its input gradient in backward, whatever the ffn width.
Every all-reduce is recorded in a :class:`CommLog` (calls, bytes, seconds) and, when given, as a "comm"
span of a :class:`simlib.timeline.Timeline`, so the volume can be measured against :func:`comm_volume`.

Sequence parallelism (Korthikanti et al. 2022, "Reducing activation recomputation in large transformer models",
sec. 4.2.2): between the TP regions (LayerNorms, residuals, dropout) each rank keeps only S/t of the sequence.
Entering a region all-gathers the sequence (backward: reduce-scatter), leaving it reduce-scatters the partial
sums (backward: all-gather) instead of the all-reduce: the same bytes (an all-reduce is a reduce-scatter then an
all-gather), and the activations outside the regions shrink t-fold.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..models import attend
from .comm_log import CommLog  # noqa: F401 - the one log (re-exported: tensor.CommLog, as lesson 05 uses it)


def _all_reduce(t, group, log, name):
    return log.all_reduce(t, group, name) if log is not None else (dist.all_reduce(t, group=group), t)[1]


def _gather_seq(t, group, log, name):
    return (log or CommLog()).all_gather(t, group, name)


def _scatter_seq(t, group, log, name):
    return (log or CommLog()).reduce_scatter(t, group, name)


# ── Megatron's f and g, on their own ─────────────────────────────────────────────────────────────────────
class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's ``f``: identity in forward, all-reduce of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, group, log=None):
        ctx.group, ctx.log = group, log
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad.contiguous(), ctx.group, ctx.log, "f: all-reduce dL/dx"), None, None


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's ``g``: all-reduce in forward, identity in backward."""

    @staticmethod
    def forward(ctx, x, group, log=None):
        return _all_reduce(x.contiguous().clone(), group, log, "g: all-reduce y")

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


# ── sequence parallelism: the two that replace f and g ───────────────────────────────────────────────────
class GatherFromSequenceParallel(torch.autograd.Function):
    """Entering a TP region: all-gather the sequence (dim 1) in forward; reduce-scatter dL/dx in backward
    (each rank's heads/columns give a partial dL/dx of the whole sequence; this rank keeps its summed block)."""

    @staticmethod
    def forward(ctx, x, group, log=None):
        ctx.group, ctx.log = group, log
        return _gather_seq(x, group, log, "sp: all-gather x")

    @staticmethod
    def backward(ctx, grad):
        return _scatter_seq(grad, ctx.group, ctx.log, "sp: reduce-scatter dL/dx"), None, None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """Leaving a TP region: reduce-scatter the partial sums along the sequence (dim 1) in forward, instead of
    ``g``'s all-reduce; all-gather dL/dy in backward (every rank's partial output touched the whole sequence)."""

    @staticmethod
    def forward(ctx, y, group, log=None):
        ctx.group, ctx.log = group, log
        return _scatter_seq(y, group, log, "sp: reduce-scatter y")

    @staticmethod
    def backward(ctx, grad):
        return _gather_seq(grad, ctx.group, ctx.log, "sp: all-gather dL/dy"), None, None


class GatherSequenceReplicated(torch.autograd.Function):
    """The end of the sequence-parallel model: all-gather the sequence for a computation every rank repeats
    (the loss); backward keeps this rank's block of dL/dy, no communication (each rank counts its own tokens)."""

    @staticmethod
    def forward(ctx, x, group, log=None):
        ctx.rank, ctx.local = dist.get_rank(group), x.shape[1]
        return _gather_seq(x, group, log, "sp: all-gather output")

    @staticmethod
    def backward(ctx, grad):
        return grad[:, ctx.rank * ctx.local : (ctx.rank + 1) * ctx.local], None, None


def sequence_slice(length: int, group) -> slice:
    """This rank's block of a sequence of ``length`` under sequence parallelism over ``group``."""
    rank, size = _tp(group)
    if length % size:
        raise ValueError(
            f"rank {dist.get_rank()}: sequence parallelism splits the sequence over {size} ranks but "
            f"it has {length} positions: use a length that is a multiple of {size}"
        )
    n = length // size
    return slice(rank * n, (rank + 1) * n)


# ── the two linear layers as autograd functions ──────────────────────────────────────────────────────────
class ColumnParallelLinearFunction(torch.autograd.Function):
    """``y_r = x @ w_r.T + b_r`` with ``w_r`` this rank's output rows; backward all-reduces dL/dx."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, log=None):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.log, ctx.has_bias = group, log, bias is not None
        return nn.functional.linear(x, weight, bias)  # x @ weight.T + bias, as one fused GEMM

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = (t.to(grad_y.dtype) for t in ctx.saved_tensors)  # autocast: a bf16 dL/dy, fp32 saved tensors
        grad_x = None
        if ctx.needs_input_grad[0]:  # (the first layer's input needs none: then no all-reduce either)
            grad_x = _all_reduce((grad_y @ weight).contiguous(), ctx.group, ctx.log, "column: all-reduce dL/dx")
        grad_w = grad_y.reshape(-1, grad_y.shape[-1]).T @ x.reshape(-1, x.shape[-1])
        grad_b = grad_y.reshape(-1, grad_y.shape[-1]).sum(0) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None, None


class SequenceParallelColumnFunction(torch.autograd.Function):
    """The column-parallel Linear entered from a sequence-parallel region: all-gather ``x`` (this rank's S/t of
    the sequence), then ``x @ w_r.T + b_r``. Only the local ``x`` is kept for backward, which all-gathers it again
    (Megatron-LM does the same): the saved input is 1/t of plain TP's; dL/dx is reduce-scattered, not all-reduced.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, group, log=None):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.log, ctx.has_bias = group, log, bias is not None
        return nn.functional.linear(_gather_seq(x, group, log, "sp: all-gather x"), weight, bias)

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        full = _gather_seq(x, ctx.group, ctx.log, "sp: all-gather x again").to(grad_y.dtype)  # not kept: re-gathered
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = _scatter_seq(grad_y @ weight.to(grad_y.dtype), ctx.group, ctx.log, "sp: reduce-scatter dL/dx")
        grad_w = grad_y.reshape(-1, grad_y.shape[-1]).T @ full.reshape(-1, full.shape[-1])
        grad_b = grad_y.reshape(-1, grad_y.shape[-1]).sum(0) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None, None


class RowParallelLinearFunction(torch.autograd.Function):
    """``y = all_reduce(x_r @ w_r.T) + b`` with ``x_r, w_r`` this rank's input columns; backward is local."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, log=None):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        y = _all_reduce(nn.functional.linear(x, weight), group, log, "row: all-reduce y")
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = (t.to(grad_y.dtype) for t in ctx.saved_tensors)  # (autograd casts the grads back to fp32)
        grad_x = grad_y @ weight
        grad_w = grad_y.reshape(-1, grad_y.shape[-1]).T @ x.reshape(-1, x.shape[-1])
        grad_b = grad_y.reshape(-1, grad_y.shape[-1]).sum(0) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None, None


# ── modules ──────────────────────────────────────────────────────────────────────────────────────────────
def _tp(group):
    return dist.get_rank(group), dist.get_world_size(group)


def _split(n: int, tp_size: int, what: str) -> int:
    if n % tp_size:
        raise ValueError(f"{what} ({n}) is not divisible by the tensor-parallel size ({tp_size})")
    return n // tp_size


class ColumnParallelLinear(nn.Module):
    """A Linear whose output features are split over the group; the output stays split.

    ``sequence_parallel``: the input is this rank's block of the sequence, all-gathered first (backward:
    dL/dx reduce-scattered, so no all-reduce)."""

    sequence_parallel = False

    def __init__(self, in_features, out_features, group=None, bias=True, log: CommLog | None = None):
        super().__init__()
        tp_rank, tp_size = _tp(group)
        self.group, self.log = group, log
        local = _split(out_features, tp_size, "out_features")
        self.weight = nn.Parameter(torch.empty(local, in_features))
        self.bias = nn.Parameter(torch.zeros(local)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, log=None, rows=None):
        """Shard a full Linear: this rank keeps output rows ``rows`` (default: its equal block)."""
        tp_rank, tp_size = _tp(group)
        layer = cls(linear.in_features, linear.out_features, group, linear.bias is not None, log)
        layer.to(linear.weight.device)  # the shard lives where the full layer was (ctx.device)
        rows = (
            rows if rows is not None else slice(tp_rank * layer.weight.shape[0], (tp_rank + 1) * layer.weight.shape[0])
        )
        with torch.no_grad():
            layer.weight.copy_(linear.weight[rows])
            if layer.bias is not None:
                layer.bias.copy_(linear.bias[rows])
        return layer

    def forward(self, x):
        if self.sequence_parallel:  # GatherFromSequenceParallel and the Linear, keeping only the local input
            return SequenceParallelColumnFunction.apply(x, self.weight, self.bias, self.group, self.log)
        return ColumnParallelLinearFunction.apply(x, self.weight, self.bias, self.group, self.log)


class RowParallelLinear(nn.Module):
    """A Linear whose input features are split over the group; takes split input, returns the full output.

    ``sequence_parallel``: returns this rank's block of the sequence (reduce-scatter instead of all-reduce)."""

    sequence_parallel = False

    def __init__(self, in_features, out_features, group=None, bias=True, log: CommLog | None = None):
        super().__init__()
        tp_rank, tp_size = _tp(group)
        self.group, self.log = group, log
        self.weight = nn.Parameter(torch.empty(out_features, _split(in_features, tp_size, "in_features")))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None  # replicated, added once
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, log=None):
        tp_rank, tp_size = _tp(group)
        layer = cls(linear.in_features, linear.out_features, group, linear.bias is not None, log)
        layer.to(linear.weight.device)  # the shard lives where the full layer was (ctx.device)
        local = layer.weight.shape[1]
        with torch.no_grad():
            layer.weight.copy_(linear.weight[:, tp_rank * local : (tp_rank + 1) * local])
            if layer.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x):
        if self.sequence_parallel:
            y = ReduceScatterToSequenceParallel.apply(nn.functional.linear(x, self.weight), self.group, self.log)
            return y + self.bias if self.bias is not None else y
        return RowParallelLinearFunction.apply(x, self.weight, self.bias, self.group, self.log)


class TensorParallelMLP(nn.Module):
    """The Megatron MLP: column-parallel fc1, GELU on the local slice, row-parallel fc2."""

    def __init__(self, fc1: ColumnParallelLinear, fc2: RowParallelLinear):
        super().__init__()
        self.fc1, self.act, self.fc2 = fc1, nn.GELU(), fc2

    @classmethod
    def from_dense(cls, ffn, group=None, log=None):
        """Shard a :class:`simlib.models.FeedForward` (fc1, act, fc2) over ``group``."""
        return cls(
            ColumnParallelLinear.from_linear(ffn.fc1, group, log), RowParallelLinear.from_linear(ffn.fc2, group, log)
        )

    def forward(self, x):  # (B, S, H) full -> (B, S, ffn / tp) split -> (B, S, H) full
        return self.fc2(self.act(self.fc1(x)))


class TensorParallelAttention(nn.Module):
    """Self-attention split by heads: each rank computes ``num_heads / tp`` heads end to end.

    The fused QKV projection is column-parallel (this rank's heads' rows of q, k and v), the heads need
    nothing from other ranks, and the output projection is row-parallel.
    """

    def __init__(self, qkv: ColumnParallelLinear, out: RowParallelLinear, local_heads: int, causal: bool = True):
        super().__init__()
        self.qkv, self.out, self.local_heads, self.causal = qkv, out, local_heads, causal

    @classmethod
    def from_dense(cls, attn, group=None, log=None):
        """Shard a :class:`simlib.models.SelfAttention` by heads."""
        tp_rank, tp_size = _tp(group)
        local_heads = _split(attn.num_heads, tp_size, "num_heads")
        head_dim = attn.hidden // attn.num_heads
        heads = torch.arange(tp_rank * local_heads, (tp_rank + 1) * local_heads)
        # qkv rows are laid out (3, heads, head_dim): pick this rank's heads in each of q, k, v
        rows = torch.arange(3 * attn.hidden).view(3, attn.num_heads, head_dim)[:, heads].reshape(-1)
        qkv = ColumnParallelLinear.from_linear(attn.qkv, group, log, rows=rows)
        return cls(qkv, RowParallelLinear.from_linear(attn.out, group, log), local_heads, attn.causal)

    def forward(self, x):  # (B, S, H) -> (B, S, 3H / tp) -> (B, S, H / tp) -> (B, S, H)
        return self.out(attend(self.qkv(x), self.local_heads, self.causal))


def tensor_parallel_attention(attn, group=None, log=None) -> TensorParallelAttention:
    """The course's own piece at the GPT's ``tp_attention`` slot (``simlib.projects.gpt``): ``attn`` (a
    :class:`simlib.models.SelfAttention`) split by heads over ``group``."""
    return TensorParallelAttention.from_dense(attn, group, log)


def comm_volume(batch: int, seq: int, hidden: int, tp_size: int, bytes_per_element: int = 4) -> dict:
    """All-reduce traffic of one column+row block (MLP or attention) per step, forward and backward.

    ``payload``: bytes each all-reduce reduces (B·S·H values); ``per_rank``: bytes each rank sends in a
    ring all-reduce, 2(t-1)/t of the payload (nccl-tests' bus-bandwidth factor); two all-reduces a step.
    """
    payload = batch * seq * hidden * bytes_per_element
    ring = 2 * (tp_size - 1) / tp_size
    return dict(all_reduces=2, payload_bytes=payload, step_payload_bytes=2 * payload, per_rank_bytes=2 * ring * payload)


def dtensor_parallelize(module: nn.Module, plan: dict, tp_size: int | None = None):
    """The same split with PyTorch's DTensor: ``parallelize_module`` on a 1-D CPU/GPU mesh of the world.

    ``plan`` maps submodule names to "colwise" / "rowwise", e.g. ``{"fc1": "colwise", "fc2": "rowwise"}``.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp_size = tp_size or dist.get_world_size()
    device = "cuda" if next(module.parameters()).is_cuda else "cpu"
    mesh = init_device_mesh(device, (tp_size,))
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    return parallelize_module(module, mesh, {name: styles[s]() for name, s in plan.items()})


def materialize(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a DTensor module's output (an ``AsyncCollectiveTensor`` must be waited on first).

    For comparisons only: the waited tensor is cut from the autograd graph.
    """
    return t.wait() if hasattr(t, "wait") else t
