"""Pipeline parallelism: split a model into stages and run any schedule for real over torch.distributed.

Schedules are data (see :mod:`simlib.parallel.schedules` for the format): a pure function returns each
rank's ordered actions, and the one executor here, :func:`run_schedule`, performs them with point-to-point
messages, recording every action as a span in a :class:`simlib.timeline.Timeline`:

    forward / backward   the compute of one micro-batch on one model chunk   (kinds "forward" / "backward")
    recv_*               the time a rank is blocked until its peer's tensor arrives (kind "wait"; the
                         transfer itself is included, tens of microseconds on one host)
    send_*               posting an asynchronous send (kind "comm"); the step ends waiting for the sends
                         to complete ("comm", name "send wait")

    stages = build_stages(model.net, rank, world_size)           # this rank's chunk(s) of the model
    result = run_schedule(one_f_one_b(world_size, 8)[rank], stages, inputs, targets,
                          activation_shape=(micro_batch, width), timeline=tl)

Sends use ``isend`` and receives block, the rule :func:`simlib.parallel.schedules.check` verifies, so any
checked schedule runs without deadlock. Messages carry a tag naming (kind, micro-batch, stage), so
receives match their sends whatever the order on the wire. The loss of each micro-batch is divided by the
number of micro-batches, so the gradients add up to those of the whole batch (as in picotron and Megatron).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn

from .schedules import Action, check  # noqa: F401  (re-exported: pipeline.Action)

_KIND = {
    "forward": "forward",
    "backward": "backward",
    "recv_forward": "wait",
    "recv_backward": "wait",
    "send_forward": "comm",
    "send_backward": "comm",
}


# ── splitting a model ────────────────────────────────────────────────────────────────────────────────────
def blocks_of(layers: nn.Sequential) -> list[nn.Sequential]:
    """Group a Sequential into blocks: each layer with parameters plus the parameter-free layers after it."""
    blocks: list[list[nn.Module]] = []
    for layer in layers:
        if blocks and not any(True for _ in layer.parameters()):
            blocks[-1].append(layer)
        else:
            blocks.append([layer])
    return [nn.Sequential(*b) for b in blocks]


def split_blocks(num_blocks: int, num_stages: int) -> list[range]:
    """Contiguous, as-equal-as-possible ranges of block indices; later stages get the extra blocks.

    (The last block of a model is often a small head, so an extra block there costs least.)
    """
    if num_stages > num_blocks:
        raise ValueError(f"{num_blocks} blocks do not fill {num_stages} stages")
    base, extra = divmod(num_blocks, num_stages)
    bounds, start = [], 0
    for s in range(num_stages):
        size = base + (s >= num_stages - extra)
        bounds.append(range(start, start + size))
        start += size
    return bounds


def build_stages(layers: nn.Sequential, pp_rank: int, pp_size: int, num_chunks: int = 1) -> list[nn.Sequential]:
    """This rank's model chunks: chunk ``c`` is stage ``c * pp_size + pp_rank`` of ``pp_size * num_chunks``.

    The modules are the ones in ``layers`` (not copies), so a single-process reference built from the same
    seed holds the same weights.
    """
    blocks = blocks_of(layers)
    ranges = split_blocks(len(blocks), pp_size * num_chunks)
    return [nn.Sequential(*(blocks[i] for i in ranges[c * pp_size + pp_rank])) for c in range(num_chunks)]


# ── the executor ─────────────────────────────────────────────────────────────────────────────────────────
class _ActivationMeter:
    """Counts the bytes autograd saves for backward (activations), leaving out the parameters."""

    def __init__(self, modules):
        self.param_storages = {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}
        self.bytes = 0

    def pack(self, t):
        if t.untyped_storage().data_ptr() not in self.param_storages:
            self.bytes += t.numel() * t.element_size()
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


def run_schedule(
    actions: list[Action],
    stages,
    inputs=None,
    targets=None,
    *,
    activation_shape,
    loss_fn=None,
    group=None,
    timeline=None,
    dtype=torch.float32,
) -> dict:
    """Perform one rank's ``actions`` for one training step (gradients accumulate in the stages' params).

    ``stages``: this rank's model chunks (a module or a list, one per chunk). ``inputs`` / ``targets``:
    lists of micro-batches, needed on the ranks holding the first / last stage. ``activation_shape``: the
    shape of every tensor passed between stages. ``group``: the pipeline process group (default: world).

    Returns ``loss`` (mean over micro-batches, on the rank with the last stage, else None),
    ``peak_in_flight`` (most micro-batch activations held at once) and ``peak_activation_bytes``.
    """
    stages = list(stages) if isinstance(stages, (list, tuple)) else [stages]
    loss_fn = loss_fn or nn.functional.mse_loss
    pp_rank, pp_size = dist.get_rank(group), dist.get_world_size(group)
    num_chunks = len(stages)
    last_stage = pp_size * num_chunks - 1
    num_mb = 1 + max(a.microbatch for a in actions)
    peer = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
    next_rank, prev_rank = peer((pp_rank + 1) % pp_size), peer((pp_rank - 1) % pp_size)
    meter = _ActivationMeter(stages)
    device = next((t.device for m in stages for t in m.parameters()), torch.device("cpu"))  # buffers live there

    def tag(kind, mb, stage):  # kind 0: activation into `stage`, 1: gradient into `stage`
        return (mb * (last_stage + 1) + stage) * 2 + kind

    received, inputs_of, outputs_of, saved_bytes = {}, {}, {}, {}
    sends, losses = [], []
    in_flight = peak_in_flight = peak_bytes = 0
    span = timeline.span if timeline is not None else (lambda kind, name=None: nullcontext())

    for a in actions:
        stage = a.chunk * pp_size + pp_rank
        key = (a.microbatch, a.chunk)
        name = f"{a.op[0].upper()}{a.microbatch}" + (f".{a.chunk}" if num_chunks > 1 else "")
        if a.op.startswith(("send", "recv")):
            name = f"{a.op} {a.microbatch}" + (f".{a.chunk}" if num_chunks > 1 else "")
        with span(_KIND[a.op], name=name):
            if a.op == "recv_forward":
                buf = torch.empty(activation_shape, dtype=dtype, device=device)
                dist.recv(buf, src=prev_rank, tag=tag(0, a.microbatch, stage))
                received[("act",) + key] = buf
            elif a.op == "recv_backward":
                buf = torch.empty(activation_shape, dtype=dtype, device=device)
                dist.recv(buf, src=next_rank, tag=tag(1, a.microbatch, stage))
                received[("grad",) + key] = buf
            elif a.op == "forward":
                x = inputs[a.microbatch] if stage == 0 else received.pop(("act",) + key).requires_grad_()
                before = meter.bytes
                with meter.hooks():
                    y = stages[a.chunk](x)
                    if stage == last_stage:
                        y = loss_fn(y, targets[a.microbatch]) / num_mb
                        losses.append(y.detach())
                inputs_of[key], outputs_of[key] = x, y
                saved_bytes[key] = meter.bytes - before
                in_flight += 1
                peak_in_flight = max(peak_in_flight, in_flight)
                peak_bytes = max(peak_bytes, sum(saved_bytes.values()))
            elif a.op == "send_forward":
                sends.append(
                    dist.isend(
                        outputs_of[key].detach().contiguous(), dst=next_rank, tag=tag(0, a.microbatch, stage + 1)
                    )
                )
            elif a.op == "backward":
                y = outputs_of.pop(key)
                if stage == last_stage:
                    y.backward()
                else:
                    torch.autograd.backward(y, received.pop(("grad",) + key))
                saved_bytes.pop(key)
                in_flight -= 1
                if stage == 0:
                    inputs_of.pop(key)
            elif a.op == "send_backward":
                grad = inputs_of.pop(key).grad
                sends.append(dist.isend(grad.contiguous(), dst=prev_rank, tag=tag(1, a.microbatch, stage - 1)))
    with span("comm", name="send wait"):
        for work in sends:
            work.wait()
    loss = torch.stack(losses).sum().item() if losses else None
    return dict(loss=loss, peak_in_flight=peak_in_flight, peak_activation_bytes=peak_bytes)


def microbatches(x: torch.Tensor, num_microbatches: int) -> list[torch.Tensor]:
    """Split a batch into ``num_microbatches`` equal micro-batches (along dim 0)."""
    if x.shape[0] % num_microbatches:
        raise ValueError(f"batch of {x.shape[0]} does not split into {num_microbatches} equal micro-batches")
    return list(x.chunk(num_microbatches))


def pipeline_step(
    schedule, stages, x, y, *, num_microbatches, activation_width, group=None, timeline=None, loss_fn=None
) -> dict:
    """One step of ``schedule`` (all ranks' actions) on the full batch ``x, y``: split, run this rank's part."""
    rank = dist.get_rank(group)
    xs, ys = microbatches(x, num_microbatches), microbatches(y, num_microbatches)
    return run_schedule(
        schedule[rank],
        stages,
        xs,
        ys,
        activation_shape=(xs[0].shape[0], activation_width),
        group=group,
        timeline=timeline,
        loss_fn=loss_fn,
    )
