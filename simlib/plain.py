"""Plain data across a process boundary: what a worker that ran someone else's code may send back, and how the
caller reads it without running any of that code.

``dumps(value, rank)`` runs in the worker: it converts ``value`` into exact built-in types - ``None``, ``bool``,
``int``, ``float``, ``complex``, ``str``, ``bytes``, ``list``, ``tuple``, ``dict`` (keys: numbers, strings or tuples
of them) and plain ``torch.Tensor`` (detached, contiguous CPU copies), ``torch.dtype`` - before anything is called
on it, and writes it with ``torch.save``. A few exact types of libraries convert on the way (``torch.Size`` to a
tuple, ``nn.Parameter`` to a tensor, NumPy scalars and arrays, ``OrderedDict``); anything else - a subclass of
``dict``, ``str`` or ``Tensor``, an object, a function - is refused (:class:`NotPlain`) with the rank, where it
was and its type.

``loads(data, rank)`` runs in the caller: ``torch.load(..., weights_only=True)`` (torch's restricted unpickler:
it builds no class outside its allow-list, so no code of the sender runs) and then a walk that accepts only the
exact types above. The worker's conversion is for a clear message; the guarantee is the caller's: a worker whose
code was tampered with can send any bytes, and they are refused here.

``frame_loads(data)`` reads the messages a worker sends on its connection (tuples of numbers, strings and
bytes) with an unpickler that builds no class at all.
"""

from __future__ import annotations

import io
import pickle
import sys
import warnings

__all__ = [
    "NotPlain",
    "to_plain",
    "dumps",
    "loads",
    "verify",
    "read_result",
    "pickle_loads",
    "frame_loads",
    "exact_str",
]

_ATOMS = (type(None), bool, int, float, complex, str, bytes)
_KEYS = (type(None), bool, int, float, str, bytes)
_DEPTH = 64


class NotPlain(TypeError):
    """A value that is not plain data of exact types (refused before it crosses to the grader)."""


def _name(t) -> str:
    return f"{getattr(t, '__module__', '?')}.{getattr(t, '__qualname__', getattr(t, '__name__', '?'))}"


def _refuse(rank, path, what: str) -> NotPlain:
    who = f"rank {rank}" if rank is not None else "the worker"
    return NotPlain(
        f"{who} returned {what} at {path}: only plain data of exact types crosses back to the grader "
        "(None, bool, int, float, str, bytes, list, tuple, dict and plain torch tensors; no subclasses, "
        "objects or functions)"
    )


def to_plain(value, rank=None, path: str = "the result", _depth: int = 0):
    """``value`` as plain data of exact types (see the module docstring), or :class:`NotPlain`.

    Only ``type(x)`` is looked at before a value is accepted: no method of an object of another type is called."""
    t = type(value)
    if _depth > _DEPTH:
        raise _refuse(rank, path, f"data nested deeper than {_DEPTH} levels")
    if t in _ATOMS:
        return value
    if t is list or t is tuple:
        items = [
            to_plain(v, rank, f"{path}[{i}]", _depth + 1)
            for i, v in enumerate(list.__iter__(value) if t is list else tuple.__iter__(value))
        ]
        return items if t is list else tuple(items)
    torch = sys.modules.get("torch")
    collections = sys.modules.get("collections")
    if t is dict or (
        collections is not None and t in (collections.OrderedDict, collections.defaultdict, collections.Counter)
    ):
        out = {}
        for k, v in dict.items(value):
            key = to_plain(k, rank, f"{path} (a key)", _depth + 1)
            if type(key) not in _KEYS and not (type(key) is tuple and all(type(x) in _KEYS for x in key)):
                raise _refuse(rank, path, f"a dict key of type {_name(type(k))}")
            out[key] = to_plain(v, rank, f"{path}[{k!r}]" if type(k) in _KEYS else f"{path}[...]", _depth + 1)
        return out
    if torch is not None:
        if t is torch.Tensor or t is torch.nn.Parameter:
            return torch.Tensor.detach(value).to("cpu", copy=True).contiguous()
        if t is torch.Size:
            return tuple(int(x) for x in tuple.__iter__(value))
        if t is torch.dtype:
            return value
        if t is torch.device:
            return str(value)
    numpy = sys.modules.get("numpy")
    if numpy is not None and t.__module__ == "numpy":
        if isinstance(value, numpy.generic) and value.dtype.kind in "biufc":
            return to_plain(value.item(), rank, path, _depth + 1)
        if t is numpy.ndarray and value.dtype.kind in "biuf" and torch is not None:
            return torch.from_numpy(numpy.array(value, copy=True))
    raise _refuse(rank, path, f"an object of type {_name(t)}")


def verify(value, rank=None, path: str = "the result", _depth: int = 0):
    """``value`` itself if every part of it is of an exact plain type (as :func:`loads` builds them), else
    :class:`NotPlain`."""
    t = type(value)
    if _depth > _DEPTH:
        raise _refuse(rank, path, f"data nested deeper than {_DEPTH} levels")
    if t in _ATOMS:
        return value
    if t is list or t is tuple:
        for i, v in enumerate(value):
            verify(v, rank, f"{path}[{i}]", _depth + 1)
        return value
    if t is dict:
        for k, v in value.items():
            if type(k) not in _KEYS and not (type(k) is tuple and all(type(x) in _KEYS for x in k)):
                raise _refuse(rank, path, f"a dict key of type {_name(type(k))}")
            verify(v, rank, f"{path}[{k!r}]", _depth + 1)
        return value
    torch = sys.modules.get("torch")
    if torch is not None and (t is torch.Tensor or t is torch.dtype):
        return value
    raise _refuse(rank, path, f"an object of type {_name(t)}")


def dumps(value, rank=None) -> bytes:
    """In the worker: ``value`` converted by :func:`to_plain`, as ``torch.save`` bytes."""
    import torch

    buf = io.BytesIO()
    torch.save(to_plain(value, rank), buf)
    return buf.getvalue()


def loads(data, rank=None):
    """In the caller: bytes from :func:`dumps`, read by torch's restricted unpickler and checked by :func:`verify`;
    :class:`NotPlain` for anything else (no code of the sender runs here)."""
    import torch

    if type(data) is not bytes:
        raise _refuse(rank, "the message", f"a payload of type {_name(type(data))} instead of bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a pickle protocol newer than torch's default: it reads it
            value = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - the restricted unpickler refused it, or it is not torch.save data
        who = f"rank {rank}" if rank is not None else "the worker"
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "Unsupported" in ln or "GLOBAL" in ln), lines[0] if lines else "")
        raise NotPlain(
            f"{who} sent back data the grader refuses to load (only plain data of exact types is "
            f"read back): {type(exc).__name__}: {why}"[:600]
        ) from None
    return verify(value, rank)


def read_result(data, rank, plain_only: bool):
    """A worker's successful result, read in the caller: ``(True, value)``, or ``(False, RemoteFailure)`` when it is
    refused. ``plain_only``: :func:`loads`; else cloudpickle (the caller trusts the code its workers run)."""
    from .errors import RemoteFailure

    if not plain_only:
        import cloudpickle

        return True, cloudpickle.loads(data)
    try:
        return True, loads(data, rank)
    except NotPlain as exc:
        return False, RemoteFailure(rank, "NotPlain", str(exc), "")


class _NoClasses(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a message may not name a class or function ({module}.{name})")


def pickle_loads(data: bytes, what: str = "a message"):
    """Pickled plain data (numbers, strings, bytes, lists, tuples, dicts) read by an unpickler that builds no class
    at all, so nothing the writer defined runs here; :class:`NotPlain` otherwise."""
    try:
        return verify(_NoClasses(io.BytesIO(data)).load(), path=what)
    except NotPlain:
        raise
    except Exception as exc:  # noqa: BLE001 - a class named, malformed data
        raise NotPlain(f"{what} the caller refuses to read: {type(exc).__name__}: {exc}"[:600]) from None


def frame_loads(data: bytes):
    """One message from a worker's connection: a tuple of numbers, strings, bytes (and tuples of them), read by
    :func:`pickle_loads`. :class:`NotPlain` otherwise."""
    msg = pickle_loads(data)
    if type(msg) is not tuple or not msg or type(msg[0]) is not str:
        raise NotPlain(f"a message of type {type(msg).__name__} instead of a tuple")
    return msg


def exact_str(text) -> str:
    """``str(text)`` as an exact ``str`` (a subclass's characters copied; its methods never called again)."""
    return str.__str__(text if type(text) is str else str(text))
