"""Shared by the checks of lessons 01-03: the drawn regression problem (a Hypothesis strategy; secret seed),
its single-process reference, and the diagnosis of gradients and weights against it."""

from __future__ import annotations

from .core import Result, _close, max_error

# ---- shared by lessons 01-03: a tiny regression problem and its single-process reference ----

_WORLD_SIZES = (2, 3, 4)  # 3 catches code right only for powers of two or a hard-coded world size


_BATCHES = (12, 24, 36)  # global batches that split over 2, 3 and 4 ranks
_BATCHES_5 = (20, 40, 60)  # and over 5 (average_gradients' fifth world; each world has its own problem there)


def dp_problem(frozen: bool = False, unused: bool = False, dtypes: tuple = ("float32",), batches: tuple = _BATCHES):
    """A Hypothesis strategy of lessons 01-03's regression problem: odd widths, 1-3 hidden layers, a global batch
    that splits over 2, 3 and 4 ranks, a secret seed; ``frozen``: one parameter has requires_grad=False,
    ``unused``: one parameter takes no part in the forward (both leave p.grad None); ``dtypes``: the model's and
    the data's dtype is one of these (float64: a buffer made in the default float32 rounds the gradients);
    ``batches``: the global batches drawn from (each splits into equal shards over the world sizes it is for)."""
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        dict(
            width=st.integers(3, 19),
            depth=st.integers(1, 3),
            in_features=st.integers(2, 11),
            global_batch=st.sampled_from(batches),
            seed=st.integers(0, 2**62),
            frozen=st.integers(0, 3) if frozen else st.none(),
            unused=st.just(unused),
            dtype=st.sampled_from(dtypes),
        )
    )


def alive(problem: dict, min_depth: int = 1) -> bool:
    """Every parameter that gets a gradient gets a nonzero one on ``problem`` (at least ``min_depth`` hidden layers).
    A narrow MLP can draw a hidden layer whose ReLUs are all dead: every gradient below it is zero, and an answer
    wrong on those parameters (a bucket divided once per parameter, a scale on some layers) passes there."""
    p = dict(problem, depth=max(problem["depth"], min_depth))
    return all(g is None or bool(g.any()) for g in _reference(1, 0.0, p)["grads"])


def _draw_problem(min_depth: int = 1, **kw) -> dict:
    """A problem drawn now, again while a layer is dead (:func:`alive`; 8 draws at most)."""
    from .instances import draw

    for _ in range(8):
        problem = dict(draw(dp_problem(**kw), 1)[0])
        if alive(problem, min_depth):
            break
    return problem


def _tiny_problem(problem: dict):
    import torch

    from ..models import MLP, make_regression

    torch.manual_seed(problem["seed"] % 2**31)
    model = MLP(problem["width"], problem["depth"], in_features=problem["in_features"])
    params = list(model.parameters())
    if problem.get("frozen") is not None:
        params[problem["frozen"] % len(params)].requires_grad_(False)  # a frozen layer: its p.grad stays None
    if problem.get("unused"):
        model.register_parameter("unused", torch.nn.Parameter(torch.zeros(3)))  # never in the forward: grad None
    x, y = make_regression(problem["global_batch"], problem["in_features"], seed=problem["seed"] % 2**31 + 1)
    dtype = getattr(torch, problem.get("dtype", "float32"))
    return model.to(dtype), x.to(dtype), y.to(dtype)


def _my_shard(x, y):
    import torch.distributed as dist

    from ..models import shard

    return shard(x, dist.get_rank(), dist.get_world_size()), shard(y, dist.get_rank(), dist.get_world_size())


def _reference(steps: int, lr: float, problem: dict):
    """Gradients of the first step and weights after ``steps`` SGD steps, one process, global batch."""
    import torch

    model, x, y = _tiny_problem(problem)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    grads = None
    for step in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if step == 0:
            grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        opt.step()
    names = [n for n, _ in model.named_parameters()]
    return dict(names=names, grads=grads, state=[p.detach().clone() for p in model.parameters()])


# float64's tolerance: a sum over ranks in another order differs by ~1e-16 relative, float32's rounding by ~1e-8
_TOL64 = dict(rtol=1e-10, atol=1e-12)


def _all_close(got, want, **tol) -> bool:
    """Tensor lists equal within ``tol`` (default: float32's; float64's far tighter where ``want`` is float64,
    and then a float32 tensor, or float64 values rounded through float32, are not close)."""
    import torch

    if not tol and any(w is not None and w.dtype == torch.float64 for w in want or ()):
        if got is not None and any(g is not None and g.dtype != torch.float64 for g in got):
            return False
        tol = _TOL64
    return (
        got is not None
        and len(got) == len(want)
        and all(
            (g is None and w is None) or (g is not None and w is not None and _close(g, w, **tol))
            for g, w in zip(got, want)
        )
    )


def _uniform_ratio(got, want):
    """c when every tensor of ``got`` is c times the one in ``want`` (one c for all), else None."""
    import torch

    pairs = [(g, w) for g, w in zip(got, want) if g is not None and w is not None]
    if not pairs:
        return None
    flat_got = torch.cat([g.reshape(-1).double() for g, _ in pairs])
    flat_want = torch.cat([w.reshape(-1).double() for _, w in pairs])
    c = float(flat_got @ flat_want / (flat_want @ flat_want)) if float(flat_want @ flat_want) else 0.0
    return c if c and abs(c - 1) > 1e-3 and _close(flat_got, c * flat_want) else None


def _problem_words(problem: dict) -> str:
    """The drawn instance, as a hint shows it."""
    words = (
        f" (the problem: an MLP of width {problem['width']}, {problem['depth']} hidden layer(s), "
        f"{problem['in_features']} inputs, global batch {problem['global_batch']}"
    )
    if problem.get("frozen") is not None:
        words += ", one frozen parameter (requires_grad=False)"
    if problem.get("unused"):
        words += ", one parameter the forward never uses"
    if problem.get("dtype", "float32") != "float32":
        words += f", in {problem['dtype']}"
    return words + ")"


def dp_instance_words(instance: dict) -> str:
    """A shrunk instance (a world size and a problem, :func:`dp_shrunk`) as the hint names it."""
    words = (
        f"{instance['world']} ranks, an MLP of width {instance['width']}, {instance['depth']} hidden layer(s), "
        f"{instance['in_features']} inputs, global batch {instance['global_batch']}"
    )
    if instance.get("k") is not None:
        words += f", k = {instance['k']} micro-batches"
    if instance.get("frozen") is not None:
        words += ", one frozen parameter"
    if instance.get("unused"):
        words += ", one unused parameter"
    return words + f", {instance.get('dtype', 'float32')}"


def dp_shrunk(
    grader,
    problem: dict,
    world_size: int,
    differs,
    k: int | None = None,
    min_depth: int = 1,
    passed: tuple = (),
    worlds: tuple = _WORLD_SIZES,
) -> str:
    """The hint's words for the smallest failing instance Hypothesis finds below the drawn one: fewer ranks (among
    the check's world sizes, none above ``world_size`` and none in ``passed``, where the answer was right), a narrower and shallower MLP, a smaller batch, without the
    frozen or unused parameter or float64 where the answer fails without them. ``differs(world, problem)`` runs the
    answer and says what differed ("" where it is right); ``k``: micro-batches, a dividing count of each rank's rows
    (shrunk too). Made once per check, after a failure, at most 6 runs ("" when nothing smaller is found)."""
    from .instances import around, shrink, smallest_words

    first = dict(problem, world=world_size, k=k)
    sizes = dict(
        world=tuple(w for w in worlds if w <= world_size and w not in passed) or (world_size,),
        width=3,
        depth=min_depth,
        in_features=2,
        global_batch=tuple(sorted(set(_BATCHES + _BATCHES_5))),  # those that do not split are left out (valid)
    )
    if k is not None:
        sizes["k"] = 2

    def valid(i) -> bool:
        rows, rest = divmod(i["global_batch"], i["world"])
        return not rest and (i["k"] is None or rows % i["k"] == 0)

    strategy = around(first, sizes, dict(frozen=None, unused=False, dtype="float32"), keep=valid)

    def run(i):
        p = {key: v for key, v in i.items() if key not in ("world", "k")}
        return differs(i["world"], p) if k is None else differs(i["world"], p, i["k"])

    small, what = shrink(strategy, run, first, grader)
    return smallest_words(small, what, dp_instance_words) if small != first else ""


def only_some_sizes(passed: list, size_words: str) -> str:
    """A note for a check that passed on other sizes: the code holds only for some (hard-coded? powers of two?)."""
    if not passed:
        return ""
    return (
        f" It passed with {', '.join(passed)} but not with {size_words}: look for a number written into your "
        "code (a world size, k, an index) or arithmetic that holds only for powers of two, e.g. `x & (n - 1)` "
        "for `x % n`"
    )


def _diagnose_grads(outs, ref, key="grads") -> tuple[bool, str, str]:
    """(passed, detail, hint) for per-rank gradient lists against the global-batch gradient."""
    world_size = len(outs)
    want = ref["grads"]
    bad_ranks = [r for r, out in enumerate(outs) if not _all_close(out[key], want)]
    if not bad_ranks:
        return True, "", ""
    got = outs[bad_ranks[0]][key]
    if got is None or any(g is None and w is not None for g, w in zip(got, want)):
        return False, "some gradients are None", "do not set p.grad to None; average it in place"
    if any(g is not None and w is None for g, w in zip(got, want)):
        return (
            False,
            "a frozen or unused parameter got a gradient",
            (
                "a parameter with requires_grad=False, or one the forward never used, has p.grad None: leave it "
                "None (skip it: `if p.grad is not None`)"
            ),
        )
    err = max(max_error(g, w) for g, w in zip(got, want) if g is not None and w is not None)
    detail = f"max error {err:.2g} on rank(s) {bad_ranks}"
    kinds = sorted({str(w.dtype).removeprefix("torch.") for w in want if w is not None})
    if kinds == ["float64"] and _all_close(got, want, rtol=1e-5, atol=1e-6):
        return (
            False,
            detail + " (right to float32's precision only)",
            (
                "this model is float64, and your gradients come back rounded to float32: a buffer made with "
                "torch.zeros(n) or torch.empty(n) is in the default dtype (float32). Make it in the gradients' "
                "dtype (torch.zeros(n, dtype=p.grad.dtype)), or all-reduce each p.grad itself"
            ),
        )
    if _all_close(got, [None if w is None else w * world_size for w in want]):
        return (
            False,
            detail,
            (
                f"your gradients are {world_size}x the right ones: all_reduce sums over the ranks, "
                "so divide by world_size to get the mean"
            ),
        )
    if _all_close(got, [None if w is None else w / world_size for w in want]):
        return (
            False,
            detail,
            (
                f"your gradients are 1/{world_size} of the right ones: you divided by world_size "
                "twice (all_reduce with SUM then one division gives the mean; ReduceOp.AVG needs "
                "no division at all)"
            ),
        )
    if bad_ranks == list(range(1, world_size)):
        return (
            False,
            detail,
            (
                "right on rank 0 only: the other ranks do not end with the mean. Use "
                "dist.all_reduce (every rank receives the sum), not dist.reduce(dst=0), and "
                "divide on every rank, not only under `if rank == 0`"
            ),
        )
    if "local" in outs[0] and _all_close(got, outs[bad_ranks[0]]["local"], rtol=0, atol=0):
        return (
            False,
            detail,
            (
                "the gradients did not change: all_reduce works in place on the tensor you pass, "
                "so pass p.grad itself (not a copy) and divide it in place"
            ),
        )
    ratio = _uniform_ratio(got, want)
    if ratio is not None:
        return (
            False,
            detail,
            (
                f"your gradients are {ratio:.3g}x the right ones on {world_size} ranks: divide the sum "
                f"by exactly dist.get_world_size() (here {world_size}); a fixed number, or a power of "
                "two, is right only for some world sizes"
            ),
        )
    wrong = [ref["names"][i] for i, (g, w) in enumerate(zip(got, want)) if w is not None and not _close(g, w)]
    if len(wrong) < sum(w is not None for w in want):  # a frozen or unused parameter has no gradient to be wrong
        return False, detail, f"only some parameters are wrong: {', '.join(wrong)}. Average every parameter's gradient"
    return (
        False,
        detail,
        (
            "compare with the recipe: dist.all_reduce(p.grad) (op SUM, in place) on every rank, "
            "then p.grad /= world_size; skip a parameter whose p.grad is None (frozen or unused)"
        ),
    )


_DP_STEPS, _DP_LR = 2, 0.1


def _check_training(outs, ref, world_size, steps, extra_hint=""):
    ok = all(_all_close(out["state"], ref["state"]) for out in outs)
    same = all(_all_close(out["state"], outs[0]["state"], rtol=0, atol=0) for out in outs)
    detail = (
        ""
        if ok
        else "max error %.2g" % max(max_error(a, b) for out in outs for a, b in zip(out["state"], ref["state"]))
    )
    rank0_only = (
        not ok
        and _all_close(outs[0]["state"], ref["state"])
        and not any(_all_close(out["state"], ref["state"]) for out in outs[1:])
    )
    hint = (
        "right on rank 0 only: the other ranks' weights differ from the single-process run, so their gradients "
        "were not averaged (a reduce to rank 0 instead of an all-reduce? a step under `if rank == 0`?)"
        if rank0_only
        else "the ranks' weights differ from each other: the replicas drifted apart, so some "
        "gradients were not averaged across ranks"
        if not same
        else "the replicas agree with each other but not with the single-process run on the global batch"
    ) + extra_hint
    return Result(
        f"{world_size} ranks: weights after {steps} steps equal the single-process run on the global batch",
        ok,
        hint,
        detail,
    )
