"""How much memory an answer uses, however it holds it: the peak and what stays of a step (torch's profiler for
tensors, the garbage collector's objects for NumPy arrays), and the bytes a call leaves alive. The memory checks
(:mod:`simlib.grading.memory`) weigh answers with these."""

from __future__ import annotations


def _census() -> tuple[dict, dict]:
    """(NumPy arrays, memory outside torch's allocator) alive now, from one pass over the garbage collector's
    objects and their referents (taken in one call and filtered by type in C, ``compress`` over ``map``: a worker
    holds ~170k objects, and a Python loop over each one's referents took 0.3 s, twice per weighed step).

    NumPy: {data address: bytes} of every array that owns its data and that a Python object holds (a list, a dict,
    an attribute), so arrays kept anywhere count (not tracemalloc: under torch's profiler it crashed workers).
    Outside torch: {key: bytes} of every tensor alive whose CPU storage torch's allocator did not make
    (``torch.frombuffer`` over a bytearray, ``from_file``, shared memory: storages that cannot resize), and every
    ``bytearray`` or ``array.array`` a Python object holds (issue 47: AdamW's state kept in
    ``torch.frombuffer(bytearray(...))`` was invisible to the profiler)."""
    import array
    import functools
    import gc
    import itertools
    import operator

    import numpy as np
    import torch

    objects = gc.get_objects()
    # one pass over the referents keeps the few of the three kinds looked for (it was one pass per kind, plus one
    # for their types: half the time of a census, 12 censuses per weighed run)
    wanted = {np.ndarray, bytearray, array.array}
    referents = gc.get_referents(*objects)
    picked = list(itertools.compress(referents, map(wanted.__contains__, map(type, referents))))
    del referents
    types_of = list(map(type, picked))
    arrays, outside = {}, {}
    for r in itertools.compress(picked, map(functools.partial(operator.is_, np.ndarray), types_of)):
        while isinstance(r.base, np.ndarray):
            r = r.base
        if r.flags.owndata:
            arrays[r.ctypes.data] = r.nbytes
    tensor_types = {torch.Tensor, torch.nn.Parameter}
    for t in itertools.compress(objects, map(tensor_types.__contains__, map(type, objects))):
        try:
            storage = t.untyped_storage()
            if storage.device.type == "cpu" and not storage.resizable():  # torch's own CPU storages resize
                outside[("storage", storage.data_ptr())] = storage.nbytes()
        except (RuntimeError, NotImplementedError):  # an invalidated or a meta tensor holds no data
            continue
    for kind in (bytearray, array.array):
        for r in itertools.compress(picked, map(functools.partial(operator.is_, kind), types_of)):
            outside[(kind.__name__, id(r), len(r))] = len(r) * getattr(r, "itemsize", 1)
    return arrays, outside


def _numpy_arrays() -> dict:
    """{data address: bytes} of every NumPy array that owns its data and that a Python object holds."""
    return _census()[0]


def _numpy_kept(before: dict) -> int:
    return sum(n for ptr, n in _numpy_arrays().items() if ptr not in before)


def _step_memory(fn, census: bool = True) -> tuple[int, int]:
    """(peak, kept): the most bytes live at once while ``fn()`` ran, above what was live when it started, and the
    bytes it left allocated. Torch's allocations are measured by torch's profiler with the allocator's count of
    every thread's live bytes (:func:`simlib.parallel.accumulate.profiled_peak`: a collective's buffer that
    Gloo's thread frees counts as freed), NumPy arrays held by any Python object (torch's profiler does not see
    them), so state kept anywhere - the optimizer's ``state``, the learner's own dicts, NumPy arrays, a temporary
    full copy - counts. (NumPy bytes freed within ``fn`` are not in the peak: only what it keeps.) ``census``:
    False for the grader's own code (torch's AdamW), which keeps nothing outside torch: the profiler alone."""
    from torch.profiler import ProfilerActivity, profile

    from ..env import quiet_profiler
    from ..parallel.accumulate import count_every_thread, profiled_peak

    quiet_profiler()  # Kineto's start/stop lines off stderr; a learner's own errors still show
    count_every_thread()
    numpy_before, outside_before = _census() if census else ({}, {})
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    numpy_after, outside_after = _census() if census else ({}, {})
    numpy_kept = sum(n for ptr, n in numpy_after.items() if ptr not in numpy_before)
    outside_kept = sum(
        n
        for k, n in outside_after.items()  # a tensor over a NumPy array is counted once
        if k not in outside_before and not (k[0] == "storage" and k[1] in numpy_after)
    )
    peak, kept = profiled_peak(prof)
    return peak + numpy_kept + outside_kept, kept + numpy_kept + outside_kept


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
