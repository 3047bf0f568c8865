"""What a proof runs: one scenario per exercise, the same for a mistake and for the solution.

Each scenario takes the answer object and a spec (the ``PROVE`` dict of a mistake's file: world size, sizes,
dtype, ...) and returns plain observables: values, bytes held, collectives seen below Python (torch's profiler) and
event orders. ``grader_mistakes.py --prove`` runs it for the mistake and for the solution (distributed ones on
``simlib.Cluster`` workers, every rank) and reports where the two differ. Nothing here uses ``simlib.grading``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

LOCAL = {"one_f_one_b", "checkpoint_placement", "plan_memory"}  # run in one process, no ranks


def scenario_module(exercise: str):
    """The module that holds ``exercise``'s scenario (lessons 07-13 live in ``_scenarios_late``, the projects'
    pieces in ``_scenarios_pieces``)."""
    import _scenarios_late
    import _scenarios_pieces

    for module in (_scenarios_late, _scenarios_pieces):
        if hasattr(module, exercise):
            return module
    return __import__(__name__)


def _dtype(name):
    return getattr(torch, name or "float32")


def _values(t):
    """A tensor (or None) as plain floats, whatever its dtype."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        return repr(t)
    return t.detach().to(torch.float64).flatten().tolist()


class _Collectives:
    """The collectives and point-to-point ops that ran, seen by torch's profiler (below every Python name)."""

    WORDS = (
        "allreduce",
        "all_reduce",
        "allgather",
        "all_gather",
        "reduce_scatter",
        "alltoall",
        "all_to_all",
        "broadcast",
        "send",
        "recv",
        "gather",
        "scatter",
        "barrier",
    )

    def __enter__(self):
        self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        self.prof.__exit__(*exc)
        seen = {}
        for e in self.prof.events():
            name = e.name.lower()
            if (name.startswith("c10d::") or name.startswith("gloo:")) and any(w in name for w in self.WORDS):
                kind = name.split("::")[-1].split(":")[-1].rstrip("_")
                seen[kind] = seen.get(kind, 0) + 1
        self.seen = seen
        return False


def _seeded(seed, *shape, scale=1.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


# ── lesson 01-03 ────────────────────────────────────────────────────────────────────────────────────────────────
def ring_all_reduce(answer, spec):
    rank = dist.get_rank()
    dtype = _dtype(spec.get("dtype"))
    if dtype.is_floating_point:
        t = _seeded(100 + rank, *spec["shape"], scale=spec.get("scale", 10.0), dtype=dtype)
    else:
        t = torch.randint(-1000, 1000, spec["shape"], generator=torch.Generator().manual_seed(100 + rank)).to(dtype)
    with _Collectives() as c:
        out = answer(t)
    return dict(out=_values(out), in_place=_values(t), dtype=str(t.dtype), collectives=c.seen)


def _mlp(spec, seed=0):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)]
    if spec.get("unused"):
        layers.append(_Unused())
    model = torch.nn.Sequential(*layers).to(_dtype(spec.get("dtype")))
    if spec.get("frozen"):
        model[0].weight.requires_grad_(False)
    return model


class _Unused(torch.nn.Module):
    """A head that forward never calls: its parameters get no gradient (p.grad stays None)."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(3, 2)

    def forward(self, x):
        return x


def _batch(spec, rank, size=None):
    size = size or spec.get("batch", 4)
    dtype = _dtype(spec.get("dtype"))
    return _seeded(10 + rank, size, 5, dtype=dtype), _seeded(50 + rank, size, 3, dtype=dtype)


def average_gradients(answer, spec):
    rank = dist.get_rank()
    model = _mlp(spec)
    x, y = _batch(spec, rank)
    torch.nn.functional.mse_loss(model(x), y).backward()
    with _Collectives() as c:
        answer(model)
    return dict(grads=[_values(p.grad) for p in model.parameters()], collectives=c.seen)


def bucket_data_parallel(answer, spec):
    """Weights after the steps, and a timeline: which gradients became ready while a bucket's all-reduce was in
    flight (started, not yet waited for) — the overlap the exercise is about."""
    rank = dist.get_rank()
    model = _mlp(spec, seed=rank)  # different starts: the wrapper must broadcast rank 0's
    events, real = [], dist.all_reduce

    class _Handle:
        def __init__(self, work, n):
            self.work, self.n = work, n

        def wait(self, *a, **k):
            events.append(("wait", self.n))
            return self.work.wait(*a, **k)

        def is_completed(self):
            return self.work.is_completed()

    def all_reduce(tensor, *args, async_op=False, **kwargs):
        n = len([e for e in events if e[0] == "start"])
        events.append(("start", n, bool(async_op), tensor.numel()))
        work = real(tensor, *args, async_op=async_op, **kwargs)
        return _Handle(work, n) if async_op else work

    dist.all_reduce = all_reduce
    try:
        ddp = answer(model, bucket_cap_mb=spec.get("bucket_cap_mb", 600 / 2**20))
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda p: events.append(("grad",)))
        for step in range(spec.get("steps", 2)):
            x, y = _batch(spec, rank * 10 + step)
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            events.append(("backward done",))
            ddp.finish_gradient_synchronization()
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p -= 0.1 * p.grad
                        p.grad = None
    finally:
        dist.all_reduce = real
    in_flight, overlapped = {}, 0  # bucket -> elements; elements in flight summed over the gradients made meanwhile
    for e in events:
        if e[0] == "start" and e[2]:
            in_flight[e[1]] = e[3]
        elif e[0] == "wait":
            in_flight.pop(e[1], None)
        elif e[0] == "grad":
            overlapped += sum(in_flight.values())
    return dict(
        weights=[_values(p) for p in model.parameters()],
        elements_in_flight_during_backward=overlapped,
        all_reduced_elements=sum(e[3] for e in events if e[0] == "start"),
    )


def accumulate_no_sync(answer, spec):
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    )
    opt = torch.optim.SGD(model.parameters(), lr=spec.get("lr", 0.1), momentum=spec.get("momentum", 0.0))
    seen, losses = {}, []
    for step in range(spec.get("steps", 2)):
        micro = [_batch(spec, 1000 * step + 10 * rank + i, size) for i, size in enumerate(spec["micro"])]
        with _Collectives() as c:
            answer(model, opt, micro, torch.nn.functional.mse_loss)
        for k, v in c.seen.items():
            seen[k] = seen.get(k, 0) + v
    return dict(
        weights=[_values(p) for p in model.parameters()],
        collectives=seen,
        grads_after=[
            _values(p.grad) if p.grad is not None and p.grad.abs().sum() > 0 else None for p in model.parameters()
        ],
    )


# ── lesson 04-05 ────────────────────────────────────────────────────────────────────────────────────────────────
def one_f_one_b(answer, spec):
    p, m = spec["stages"], spec["micro"]
    out = {}
    for r in range(p):
        try:
            out[r] = [_action(a) for a in answer(r, p, m)]
        except Exception as exc:  # noqa: BLE001 - an error is an observable too
            out[r] = f"{type(exc).__name__}: {exc}"
    return out


def _action(a):
    """("forward", 0) from a pair, an Action(op, microbatch) or a string like "F0"."""
    if isinstance(a, str):
        return (a[:1], int(a[1:]) if a[1:].isdigit() else a[1:])
    if hasattr(a, "op"):
        return (str(a.op), int(a.microbatch))
    return (str(a[0]), int(a[1]))


def pipeline_stage(answer, spec):
    rank, n = dist.get_rank(), dist.get_world_size()
    d, b, m = spec.get("d", 6), spec.get("batch", 2), spec.get("micro", 4)
    torch.manual_seed(0)
    sizes = [5] + [d] * (n - 1) + [3]  # the input, the activations between stages and the output differ in width
    layers = [torch.nn.Sequential(torch.nn.Linear(sizes[r], sizes[r + 1]), torch.nn.Tanh()) for r in range(n)]
    stage = layers[rank]
    inputs = [_seeded(300 + i, b, 5) for i in range(m)]  # every rank gets the lists (the skeleton reads len(inputs))
    targets = [_seeded(400 + i, b, 3) for i in range(m)]
    order, real = [], (dist.send, dist.recv)

    def send(t, dst, *a, **k):
        order.append(("send", dst, tuple(t.shape)))
        return real[0](t, dst, *a, **k)

    def recv(t, src=None, *a, **k):
        order.append(("recv", src, tuple(t.shape)))
        return real[1](t, src, *a, **k)

    dist.send, dist.recv = send, recv
    try:
        loss = answer(stage, inputs, targets, (b, d))
    finally:
        dist.send, dist.recv = real
    return dict(
        loss=loss if loss is None else round(float(loss), 6),
        grads=[_values(p.grad) for p in stage.parameters()],
        messages=order,
    )


# ── lesson 05b ──────────────────────────────────────────────────────────────────────────────────────────────────
def online_softmax(answer, spec):
    """The output of one instance per rank (each rank draws its own), its dtype and shape, and what the call made:
    whether any torch tensor (seen by a dispatch mode, below every Python name) or the Python heap (tracemalloc:
    NumPy's buffers) reached the size of the full (T x T) score matrix, and whether torch's fused attention ran."""
    import tracemalloc

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    rank = dist.get_rank() if dist.is_initialized() else 0
    b, h, t, d = spec.get("batch", 1), spec.get("heads", 2), spec.get("T", 10), spec.get("head_dim", 4)
    dtype = _dtype(spec.get("dtype"))
    q, k, v = (_seeded(s + 10 * rank, b, h, t, d, scale=spec.get("scale", 1.0), dtype=dtype) for s in (1, 2, 3))
    seen = dict(largest=0, fused=False)

    class Meter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            seen["fused"] |= "scaled_dot_product" in str(func)
            for x in tree_flatten(out)[0]:
                if isinstance(x, torch.Tensor):
                    seen["largest"] = max(seen["largest"], x.numel())
            return out

    tracemalloc.start()
    with Meter():
        out = answer(q, k, v, spec.get("causal", False), spec.get("block", 4))
    _, heap_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    full = b * h * t * t
    return dict(
        out=_values(out),
        dtype=str(out.dtype) if isinstance(out, torch.Tensor) else None,
        shape=list(out.shape) if isinstance(out, torch.Tensor) else None,
        torch_tensor_as_large_as_the_score_matrix=seen["largest"] >= full,
        heap_as_large_as_the_score_matrix=heap_peak >= full * 4,
        fused_attention_called=seen["fused"],
    )


def tp_linear(answer, spec):
    rank, n = dist.get_rank(), dist.get_world_size()
    column, row = answer
    b, s, din, dh = spec.get("batch", 2), spec.get("seq", 3), spec.get("d_in", 4), spec["d_hidden"]
    dtype = _dtype(spec.get("dtype"))
    w1, b1 = _seeded(1, dh, din, dtype=dtype), _seeded(2, dh, dtype=dtype)
    w2, b2 = _seeded(3, din, dh, dtype=dtype), _seeded(4, din, dtype=dtype)
    rows = torch.tensor_split(torch.arange(dh), n)[rank]
    w1r, b1r = w1[rows].clone().requires_grad_(), b1[rows].clone().requires_grad_()
    w2r, b2r = w2[:, rows].clone().requires_grad_(), b2.clone().requires_grad_()
    x = _seeded(5, b, s, din, dtype=dtype).requires_grad_()
    with _Collectives() as c:
        y = row.apply(torch.nn.functional.gelu(column.apply(x, w1r, b1r)), w2r, b2r)
        (y * _seeded(6, b, s, din, dtype=dtype)).sum().backward()
    return dict(
        y=_values(y),
        dx=_values(x.grad),
        dw1=_values(w1r.grad),
        db1=_values(b1r.grad),
        dw2=_values(w2r.grad),
        db2=_values(b2r.grad),
        collectives=c.seen,
    )
