"""A fake accelerator for CPU-only CI: does a runner put everything on ``ctx.device``?

On a CPU machine ``ctx.device`` is the CPU, so a runner that hard-codes the CPU passes every test there and
silently trains on the CPU of a GPU machine. :func:`guarded` runs a runner in *this* process as rank 0 of a
pretend 2-rank job whose device is ``meta`` (shapes, no data): a model, batch or buffer that the runner does not
move to ``ctx.device`` stays on the CPU and meets a meta tensor (torch raises), and every tensor handed to a
collective is checked to be on ``ctx.device``. Collectives do nothing (rank 0 talks to itself), and reading a
meta tensor's value (``float(loss)``) gives 1.0, so a whole run goes through in milliseconds.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from unittest import mock

import torch
import torch.distributed as dist

DEVICE = torch.device("meta")


class OffDevice(AssertionError):
    pass


class _Work:
    def wait(self, *a, **k):
        return True

    def is_completed(self):
        return True

    def get_future(self):
        fut = torch.futures.Future()
        fut.set_result(None)
        return fut


def _check(where, *tensors):
    for t in tensors:
        for x in t if isinstance(t, (list, tuple)) else [t]:
            if isinstance(x, torch.Tensor) and x.device != DEVICE:
                raise OffDevice(
                    f"{where} got a tensor on {x.device}, not on ctx.device ({DEVICE}): "
                    "the runner built it without ctx.device"
                )


def _collective(name):
    def fake(*args, **kwargs):
        _check(f"dist.{name}", *[a for a in args if isinstance(a, (torch.Tensor, list, tuple))])
        return _Work() if kwargs.get("async_op") or name in ("isend", "irecv") else None

    return fake


_RealGenerator = torch.Generator


class _Generator(_RealGenerator):
    def __new__(cls, device="cpu"):
        device = torch.device(device)
        return _RealGenerator.__new__(cls, "cpu" if device.type == "meta" else device)

    def __init__(self, *args, **kwargs):
        pass


def _all_gather_object(out, obj, group=None):
    for i in range(len(out)):
        out[i] = obj


@contextlib.contextmanager
def guarded(world_size: int = 2, rank: int = 0):
    """Inside: ``simlib.context()`` says device=meta, world_size ranks; collectives check devices."""
    from simlib import env

    ctx = env.Context(rank, world_size, rank, world_size, "gloo", DEVICE, "simlib")
    group = SimpleNamespace(name="fake group")
    patches = [
        mock.patch.object(env, "context", lambda: ctx),
        mock.patch.object(env, "init", lambda *a, **k: ctx),
        mock.patch.object(dist, "is_initialized", lambda: True),
        mock.patch.object(dist, "get_rank", lambda group=None: rank),
        mock.patch.object(dist, "get_world_size", lambda group=None: world_size),
        mock.patch.object(dist, "get_global_rank", lambda group, r: r),
        mock.patch.object(dist, "new_group", lambda *a, **k: group),
        mock.patch.object(dist, "barrier", lambda *a, **k: None),
        mock.patch.object(dist, "all_gather_object", _all_gather_object),
        mock.patch.object(dist, "broadcast_object_list", lambda *a, **k: None),
    ]
    for name in (
        "all_reduce",
        "broadcast",
        "all_gather",
        "all_gather_into_tensor",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "send",
        "recv",
        "isend",
        "irecv",
        "reduce",
        "all_to_all_single",
    ):
        patches.append(mock.patch.object(dist, name, _collective(name)))
    # Reading a meta tensor (a loss printed, a time, a state sent home): 1.0 for a scalar, zeros of its shape.
    real = {
        name: getattr(torch.Tensor, name)
        for name in ("__float__", "__int__", "__index__", "__bool__", "item", "tolist", "cpu")
    }
    fake = {
        "__float__": lambda t: 1.0,
        "item": lambda t: 1.0,  # 1, not 0: runners divide by times
        "__int__": lambda t: 0,
        "__index__": lambda t: 0,  # a token id read back (CUDA reads it; meta cannot)
        "__bool__": lambda t: True,  # "all finite?" reads True: the guard checks placement, not values
        "tolist": lambda t: torch.zeros(t.shape, dtype=t.dtype).tolist(),
        "cpu": lambda t, *a, **k: torch.zeros(t.shape, dtype=t.dtype),
    }
    for name in real:
        patches.append(
            mock.patch.object(
                torch.Tensor,
                name,
                (lambda name: lambda t, *a, **k: fake[name](t, *a, **k) if t.is_meta else real[name](t, *a, **k))(name),
            )
        )
    # Meta has no random generators (CUDA has): a generator asked for on meta is made on the CPU (sampling text,
    # the MFU yardstick). A CPU generator that a GPU run would hand to a CUDA op is the one thing this lets by.
    patches.append(mock.patch.object(torch, "Generator", _Generator))
    patches.append(mock.patch("simlib.train._matmul_rate", lambda device, *a, **k: 1.0))
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        yield ctx
