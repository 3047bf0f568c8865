"""Loss parity with tolerance bands: do two plans train the same model, up to summation order?

Two plans that compute the same function on the same global batches (data parallelism and tensor parallelism,
say) still differ in the last bits: floating-point addition is not associative, and each plan sums in its own
order (over ranks, over micro-batches, over shards of a matmul). Training amplifies those bits (AdamW's first
updates are about lr·sign(g)), so "equal to 1e-5" is either too strict or too loose, depending on the step.

:func:`compare` measures the band instead of guessing it: it runs plan A, then plan A again on the *same*
global batches with the samples of every batch permuted (``permutations`` times) — mathematically the same
training, only the order of the sums changes — and plan B. Per step, the band is ``factor`` times the largest
loss difference the permutations produced so far (never below a few float32 ulps of the loss); per parameter
tensor, ``factor`` times the largest difference (the norm over the tensor) the permutations left in it. B agrees
with A when every step's loss and every parameter stay inside their bands; otherwise the result names the first
step that leaves the band and (re-running both to that step) the parameter that is furthest outside it.

    result = compare(task, Plan(dp=2), Plan(tp=2), steps=10, cluster=cluster)
    result.agree, result.first_step, result.parameter, print(result)
"""

from __future__ import annotations

from dataclasses import dataclass, field

EPS32 = 2.0**-23


class _Permuted:
    """``task`` whose every global batch has its samples in another (seeded) order; all else is ``task``'s."""

    def __init__(self, task, seed: int):
        self._task, self._seed = task, seed

    def __getattr__(self, name):
        if name.startswith("__") or "_task" not in self.__dict__:  # while unpickling: nothing to delegate to yet
            raise AttributeError(name)
        return getattr(self._task, name)

    def batch(self, index, part: int = 0, parts: int = 1):
        import torch

        x, y = self._task.batch(index)
        g = torch.Generator().manual_seed(1_000_003 * (self._seed + 1) + index)
        order = torch.randperm(x.shape[0], generator=g)
        x, y = x[order], y[order]
        n = x.shape[0] // parts
        return x[part * n : (part + 1) * n], y[part * n : (part + 1) * n]


def _dense_parameters(pm, plan) -> dict:
    """The whole model's parameters (float64, CPU) on every rank; a collective under TP and PP."""
    import torch

    if plan.zero_stage == 3:
        raise ValueError(
            "parity compares whole parameters; under ZeRO-3 each rank holds a shard: compare the "
            "losses only (parameters=False), or use zero_stage <= 2"
        )
    model = pm.eval_model()
    if plan.tp > 1:
        from ..projects.gpt import model as gpt

        if not isinstance(model, gpt.GPT):
            raise ValueError(
                "the parameters of a tensor-parallel plan can be gathered for the course's GPT only: "
                "compare the losses only (parameters=False)"
            )
        state = gpt.dense_state_dict(model, pm.groups.tp_group)
    else:
        state = model.state_dict()
    return {k: v.detach().to("cpu", torch.float64).clone() for k, v in state.items()}


def run_plan(task, plan, steps: int, optim=None, permutation: int | None = None, parameters: bool = True) -> dict:
    """One rank's part of a parity run: ``steps`` steps of ``plan`` (batches permuted with seed ``permutation``
    if given); the loss of every step and, on rank 0, the whole model's parameters."""
    import torch.distributed as dist

    from ..train import OptimConfig, train

    run_task = _Permuted(task, permutation) if permutation is not None else task
    record = train(
        run_task,
        plan,
        steps=steps,
        optim=optim or OptimConfig(),
        log_every=1,
        eval_every=0,
        verbose=False,
        measure_memory=False,
        warmup=0,
    )
    params = _dense_parameters(record.model, plan) if parameters else None
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    return {"losses": [r["loss"] for r in record.rows], "params": params if rank0 else None}


@dataclass
class Parity:
    """What :func:`compare` found. ``agree``: every loss and parameter inside its band."""

    label_a: str
    label_b: str
    losses_a: list
    losses_b: list
    band: list  # per step: how far B's loss may be from A's
    noise: list  # per step: the largest difference the permutations produced
    first_step: int | None = None  # the first step whose loss leaves the band
    parameter: str | None = None  # the parameter furthest outside its band (at first_step, or at the end)
    parameter_ratio: float | None = None  # its difference / its band
    parameters: dict = field(default_factory=dict)  # name -> (difference, band)
    quantity: str = "loss"  # what the series is (the loss, the gradient norm, ...)

    @property
    def agree(self) -> bool:
        return self.first_step is None and (self.parameter_ratio is None or self.parameter_ratio <= 1)

    def __str__(self) -> str:
        if self.agree:
            worst = max(abs(a - b) / w for a, b, w in zip(self.losses_a, self.losses_b, self.band))
            return (
                f"{self.label_b} agrees with {self.label_a} within what summation order explains: "
                f"{len(self.band)} steps, the largest {self.quantity} difference is {worst:.2f} of its band"
                + ("; every parameter inside its band" if self.parameters else "")
            )
        if self.first_step is not None:
            s = self.first_step
            text = (
                f"{self.label_b} leaves {self.label_a}'s band at step {s}: {self.quantity} {self.losses_b[s]:.6f} vs "
                f"{self.losses_a[s]:.6f} (difference {abs(self.losses_b[s] - self.losses_a[s]):.2e}, band "
                f"{self.band[s]:.2e}; reordering the sums moved it by {self.noise[s]:.2e})"
            )
            if s == 0 and self.quantity == "loss":
                text += ". Step 0's loss comes before any update: the forward pass or the data differ"
        else:
            text = f"{self.label_b}'s {self.quantity} stays in {self.label_a}'s band, but its parameters do not"
        if self.parameter is not None and self.parameter_ratio is not None and self.parameter_ratio > 1:
            where = f"after {self.first_step} steps" if self.first_step else "at the end"
            diff, band = self.parameters[self.parameter]
            text += (
                f"; {where} the parameter furthest outside its band is {self.parameter} (difference "
                f"{diff:.2e}, {self.parameter_ratio:.0f}x its band {band:.2e})"
            )
        return text


def bands(reference, twins, factor: float = 4.0, eps: float = EPS32) -> tuple[list, list]:
    """Per step of a series (losses, gradient norms): the band around ``reference`` and the noise it comes from.
    ``twins``: the same run with its sums in other orders (permuted samples). The noise at step s is the largest
    difference any twin showed up to s; the band is ``factor`` x that, plus 16 units in the last place of
    ``eps`` (the dtype's machine epsilon: 2**-23 for float32) times the value, should reordering change nothing."""
    if factor < 1:
        raise ValueError(f"factor must be >= 1 (the band is factor x the permutations' spread), got {factor}")
    if not twins:
        raise ValueError("no twins: the band comes from the same run with its sums reordered (permuted samples)")
    noise, band, running = [], [], 0.0
    for s, value in enumerate(reference):
        running = max(running, max(abs(value - t[s]) for t in twins))
        noise.append(running)
        band.append(factor * running + 16 * eps * abs(value))
    return band, noise


def verdict(
    reference,
    twins,
    other,
    label_a: str = "one process",
    label_b: str = "the plan",
    factor: float = 4.0,
    quantity: str = "loss",
    eps: float = EPS32,
) -> Parity:
    """Does the series ``other`` (per step) stay inside the band that ``twins`` (``reference`` with reordered sums)
    draw around ``reference``? A :class:`Parity` naming the first step outside it (``.agree``, ``str()``)."""
    if len(other) != len(reference) or any(len(t) != len(reference) for t in twins):
        raise ValueError(
            f"the series have different lengths: reference {len(reference)}, twins "
            f"{[len(t) for t in twins]}, {label_b} {len(other)}: run the same number of steps"
        )
    band, noise = bands(reference, twins, factor, eps)
    outside = [s for s in range(len(reference)) if not abs(reference[s] - other[s]) <= band[s]]  # NaN: outside
    return Parity(
        label_a,
        label_b,
        list(reference),
        list(other),
        band,
        noise,
        first_step=outside[0] if outside else None,
        quantity=quantity,
    )


def _run(task, plan, steps, optim, permutation, parameters, cluster):
    from ..launch import launch

    world = plan.world_size
    if cluster is not None and cluster.world_size == world:
        out = cluster.run(run_plan, task, plan, steps, optim, permutation, parameters)
    else:
        out = launch(run_plan, world, task, plan, steps, optim, permutation, parameters)
    return out[0]


def parameter_bands(reference, twins, other, factor: float = 4.0, eps: float = EPS32) -> dict:
    """Per parameter tensor (state dicts): ``{name: (difference, band)}``: the size (Euclidean norm) of the
    difference between ``other`` and ``reference`` in that tensor, and ``factor`` x the largest such size any twin
    (``reference`` with its sums in another order) left in it, plus 16 units in the last place of ``eps`` times
    the tensor's norm. ``other`` agrees when every difference is <= its band (:func:`worst_parameter`).

    Why a norm and not the largest element: after a few AdamW steps the largest element-wise difference is an
    extreme value — one weight whose gradient sits near zero, where rounding flips the sign of its update — and
    two correct runs land on either side of a band drawn from it (GPT, dp2 against tp2's twins, 20 steps: 1.3x
    the max-based band, 0.8x the norm-based one). The norm sums over the whole tensor and is steady, while a real
    bug (a missing all-reduce, a batch seen twice) still lands thousands of times outside."""
    if not twins:
        raise ValueError("no twins: the band comes from the same run with its sums reordered")

    def size(t):
        return float(t.double().norm())

    out = {}
    for name, a in reference.items():
        noise = max(size(a - t[name]) for t in twins)
        band = factor * noise + 16 * eps * size(a)
        out[name] = (size(a - other[name]), band)
    return out


def worst_parameter(bands: dict) -> tuple[str, float]:
    """The parameter furthest outside (or least inside) its band, and its difference / band (> 1: outside)."""

    def ratio(k):
        diff, width = bands[k]
        return diff / width if width > 0 else (0.0 if diff == 0 else float("inf"))

    name = max(bands, key=ratio)
    return name, ratio(name)


def compare(
    task,
    plan_a,
    plan_b,
    steps: int = 10,
    optim=None,
    task_b=None,
    permutations: int = 2,
    factor: float = 4.0,
    parameters: bool = True,
    locate: bool = True,
    cluster=None,
) -> Parity:
    """Run ``plan_a`` (and ``permutations`` twins of it with reordered batches) and ``plan_b`` for ``steps`` steps
    on the same global batches; return a :class:`Parity`. ``task_b``: B's task if it differs (to test the
    tool on a planted bug); ``cluster``: a warm :class:`simlib.Cluster` used for the plans of its size.
    ``locate``: when a step leaves the band, re-run to that step to name the parameter furthest outside."""
    if factor < 1:
        raise ValueError(f"factor must be >= 1 (the band is factor x the permutations' spread), got {factor}")
    if permutations < 1:
        raise ValueError(f"permutations must be >= 1 (the band comes from them), got {permutations}")

    def runs(n):
        a = _run(task, plan_a, n, optim, None, parameters, cluster)
        twins = [_run(task, plan_a, n, optim, seed, parameters, cluster) for seed in range(permutations)]
        b = _run(task_b or task, plan_b, n, optim, None, parameters, cluster)
        return a, twins, b

    a, twins, b = runs(steps)
    result = verdict(a["losses"], [t["losses"] for t in twins], b["losses"], plan_a.label, plan_b.label, factor)
    if parameters:
        if result.first_step and locate:  # the parameters that produced the first loss outside the band
            a, twins, b = runs(result.first_step)
        if not (result.first_step == 0 and locate):
            result.parameters = parameter_bands(a["params"], [t["params"] for t in twins], b["params"], factor)
            result.parameter, result.parameter_ratio = worst_parameter(result.parameters)
    return result


def check_replicas(tensor, group=None) -> str:
    """Whether a tensor that should be replicated (equal on every rank of ``group``) is: a collective. Returns
    ``"replicas agree"`` or ``"replicas differ: ..."`` naming the ranks whose copy differs from rank 0's (of the
    group) and by how much. For tensor-parallel activations, a dropout mask, parameters after a step."""
    import torch
    import torch.distributed as dist

    n = dist.get_world_size(group)
    copies = [torch.empty_like(tensor) for _ in range(n)]
    dist.all_gather(copies, tensor.contiguous(), group=group)
    diffs = {r: float((copies[r].double() - copies[0].double()).abs().max()) for r in range(1, n)}
    bad = {r: d for r, d in diffs.items() if d > 0}
    if not bad:
        return f"replicas agree ({n} ranks, {tensor.numel()} values)"
    return (
        "replicas differ: "
        + ", ".join(f"rank {r} by up to {d:.3g}" for r, d in bad.items())
        + " from rank 0 (a random draw or an input that is not the same on every rank?)"
    )
