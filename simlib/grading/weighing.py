"""How much memory an answer uses, however it holds it: the peak and what stays of a step (torch's profiler for
tensors, the garbage collector's objects for NumPy arrays), and the bytes a call leaves alive. The memory checks
(:mod:`simlib.grading.memory`) weigh answers with these."""

from __future__ import annotations


def _numpy_arrays() -> dict:
    """{data address: bytes} of every NumPy array that owns its data and that a Python object holds (a list, a
    dict, an attribute): found through the garbage collector's objects, so arrays kept anywhere count. (Not
    tracemalloc: under torch's profiler it crashed workers.) The referents are taken in one call and filtered by
    type in C (``compress`` over ``map``): a worker holds ~170k objects, and a Python loop over each one's
    referents took 0.3 s, twice per weighed step."""
    import functools
    import gc
    import itertools
    import operator

    import numpy as np

    nd = np.ndarray
    referents = gc.get_referents(*gc.get_objects())
    out = {}
    for r in itertools.compress(referents, map(functools.partial(operator.is_, nd), map(type, referents))):
        while isinstance(r.base, nd):
            r = r.base
        if r.flags.owndata:
            out[r.ctypes.data] = r.nbytes
    return out


def _numpy_kept(before: dict) -> int:
    return sum(n for ptr, n in _numpy_arrays().items() if ptr not in before)


def _step_memory(fn) -> tuple[int, int]:
    """(peak, kept): the most bytes live at once while ``fn()`` ran, above what was live when it started, and the
    bytes it left allocated. Torch's allocations are measured by torch's profiler with the allocator's count of
    every thread's live bytes (:func:`simlib.parallel.accumulate.profiled_peak`: a collective's buffer that
    Gloo's thread frees counts as freed), NumPy arrays held by any Python object (torch's profiler does not see
    them), so state kept anywhere - the optimizer's ``state``, the learner's own dicts, NumPy arrays, a temporary
    full copy - counts. (NumPy bytes freed within ``fn`` are not in the peak: only what it keeps.)"""
    from torch.profiler import ProfilerActivity, profile

    from ..env import quiet_profiler
    from ..parallel.accumulate import count_every_thread, profiled_peak

    quiet_profiler()  # Kineto's start/stop lines off stderr; a learner's own errors still show
    count_every_thread()
    numpy_before = _numpy_arrays()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    numpy_kept = _numpy_kept(numpy_before)
    peak, kept = profiled_peak(prof)
    return peak + numpy_kept, kept + numpy_kept


def _storages(objs) -> list:
    """(tensor, storage address, bytes) of each tensor among ``objs`` (Parameters too). A tensor whose Python
    storage torch has invalidated holds no data and is left out: reading its address raises."""
    import torch

    out = []
    for o in objs:
        if type(o) is torch.Tensor or isinstance(o, torch.nn.Parameter):
            try:
                storage = o.untyped_storage()
                out.append((o, storage.data_ptr(), storage.nbytes()))
            except RuntimeError:  # "Attempted to access the data pointer on an invalid python storage"
                continue
    return out


def _tensor_storages() -> dict:
    """{storage address: bytes} of every tensor object alive in this process (held anywhere: ctx, globals)."""
    import gc

    return {ptr: nbytes for _, ptr, nbytes in _storages(gc.get_objects())}


def _held_new_tensors(before: dict) -> int:
    """Bytes of tensors not in ``before`` that some Python object holds (a dict, ctx, a list, a module). A tensor
    only C++ holds (a collective's pending work, autograd's saved slots) is left out here: the saved ones are
    weighed by saved_tensors_hooks, and c10d lets go of its own in its own time."""
    import gc
    import types

    new = [entry for entry in _storages(gc.get_objects()) if entry[1] not in before]
    ours = {id(entry) for entry in new}  # the (tensor, address, bytes) entries above hold each tensor too
    total, seen = 0, set()
    for t, ptr, nbytes in new:
        if ptr not in seen and any(
            id(r) not in ours and not isinstance(r, types.FrameType) for r in gc.get_referrers(t)
        ):
            seen.add(ptr)
            total += nbytes
    return total


def _alive_after(fn) -> int:
    """Bytes ``fn()`` leaves allocated, however held: tensors it left alive that a Python object holds (found by the
    garbage collector, so an attribute of ``ctx``, a global or a cache counts) and NumPy arrays held by Python objects.
    Tensors kept by autograd's saved-tensor slots are weighed by saved_tensors_hooks instead."""
    before, numpy_before = _tensor_storages(), _numpy_arrays()
    fn()
    return _held_new_tensors(before) + _numpy_kept(numpy_before)
