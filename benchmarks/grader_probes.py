"""The equivalence probes of ``grader_mutation.py``: for each exercise, random instances its answer runs on (on
the workers, or in this process for a pure function), returning plain data (tensors, numbers, lists) and the
collectives each rank called, so a mutant the grader passed can be told equivalent (same outputs and calls as
the solution) or surviving (a wrong answer the grader missed).
"""

from __future__ import annotations

import random

# ---- probes: random instances, run on the workers; each returns plain data (tensors, numbers, lists) ----


def _ops():
    from simlib.debug import hangs

    return [(r["op"], r["shape"], r.get("src"), r.get("dst")) for r in hangs.history()]


def _probe_ring(answer, seed):
    """Five random 1-D and 2-D tensors (lengths 1-29, not multiples of the world size), float64."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    shapes = random.Random(seed)
    out = []
    for i in range(5):
        shape = (shapes.randint(1, 29),) if i % 2 == 0 else (shapes.randint(1, 5), shapes.randint(1, 6))
        x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed * 97 + i * 7 + rank))
        y = answer(x)
        out.append(dict(x=x.clone(), y=y.clone() if isinstance(y, torch.Tensor) else repr(y), same=y is x))
    return dict(out=out, ops=_ops())


def _probe_average(answer, seed):
    """Three random MLPs (width, depth, inputs, local batch drawn), one parameter frozen at random (grad None)."""
    import torch
    import torch.distributed as dist

    from simlib.models import MLP

    rank, draw, out = dist.get_rank(), random.Random(seed), []
    for i in range(3):
        width, depth, inputs, batch = draw.randint(2, 9), draw.randint(1, 3), draw.randint(1, 6), draw.randint(1, 5)
        torch.manual_seed(seed + i)
        model = MLP(width, depth, in_features=inputs).double()
        frozen = draw.randrange(len(list(model.parameters())))
        list(model.parameters())[frozen].requires_grad_(False)
        g = torch.Generator().manual_seed(seed * 31 + i * 5 + rank)
        x, y = (
            torch.randn(batch, inputs, generator=g, dtype=torch.float64),
            torch.randn(batch, 1, generator=g, dtype=torch.float64),
        )
        torch.nn.functional.mse_loss(model(x), y).backward()
        answer(model)
        out.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
    return dict(out=out, ops=_ops())


def _probe_tp(answer, seed):
    """Random hidden size, FFN width a multiple of the world size, batch and sequence; float64."""
    import torch
    import torch.distributed as dist

    column, row = answer
    rank, n, draw, out = dist.get_rank(), dist.get_world_size(), random.Random(seed), []
    for i in range(2):
        h, ffn, b, s = draw.randint(2, 7), n * draw.randint(1, 4), draw.randint(1, 3), draw.randint(1, 4)
        g = torch.Generator().manual_seed(seed + i)
        w1, b1 = (
            torch.randn(ffn, h, generator=g, dtype=torch.float64),
            torch.randn(ffn, generator=g, dtype=torch.float64),
        )
        w2, b2 = torch.randn(h, ffn, generator=g, dtype=torch.float64), torch.randn(h, generator=g, dtype=torch.float64)
        x = torch.randn(b, s, h, generator=g, dtype=torch.float64).requires_grad_()
        weights = torch.randn(b, s, h, generator=g, dtype=torch.float64)
        rows = slice(rank * ffn // n, (rank + 1) * ffn // n)
        mine = [
            w1[rows].clone().requires_grad_(),
            b1[rows].clone().requires_grad_(),
            w2[:, rows].clone().requires_grad_(),
            b2.clone().requires_grad_(),
        ]
        y = row.apply(torch.nn.functional.gelu(column.apply(x, mine[0], mine[1])), mine[2], mine[3])
        (y * weights).sum().backward()
        out.append([y.detach().clone(), x.grad.clone()] + [None if p.grad is None else p.grad.clone() for p in mine])
    return dict(out=out, ops=_ops())


def _probe_checkpoint(answer, seed):
    """In one process: 12 random problems of 1-7 blocks, budgets between the floor and the total; what is kept
    and recomputed (the optimum may be any of several sets: the recomputed FLOPs are what must be least)."""
    from itertools import combinations

    draw, out = random.Random(seed), []
    for _ in range(12):
        n = draw.randint(1, 7)
        acts = [draw.randint(10, 400) for _ in range(n)]
        inputs = [draw.randint(1, a) for a in acts]
        flops = [draw.randint(1, 500) for _ in range(n)]
        budget = draw.randint(sum(inputs), sum(acts))
        chosen = sorted(set(int(i) for i in answer(list(acts), list(inputs), list(flops), budget)))
        valid = all(0 <= i < n for i in chosen)
        kept = sum(inputs[i] if i in chosen else acts[i] for i in range(n)) if valid else None
        best = min(
            sum(flops[i] for i in c)
            for k in range(n + 1)
            for c in combinations(range(n), k)
            if sum(inputs[i] if i in c else acts[i] for i in range(n)) <= budget
        )
        out.append((valid, valid and kept <= budget, valid and sum(flops[i] for i in chosen) == best))
    return dict(out=out, ops=[])


def _probe_ring_attention(answer, seed):
    """Random batch, heads, positions per rank and head size, with and without the causal mask; float64."""
    import torch
    import torch.distributed as dist

    from simlib.parallel.context import shard_sequence

    rank, n, draw, out = dist.get_rank(), dist.get_world_size(), random.Random(seed), []
    for causal in (False, True):
        b, h, local, d = draw.randint(1, 2), draw.randint(1, 3), draw.randint(1, 5), draw.randint(2, 6)
        g = torch.Generator().manual_seed(seed * 13 + causal)
        q, k, v = (torch.randn(b, h, local * n, d, generator=g, dtype=torch.float64) * 3 for _ in range(3))
        y = answer(*(shard_sequence(t, rank, n).clone() for t in (q, k, v)), causal)
        out.append(y.detach().clone() if isinstance(y, torch.Tensor) else repr(y))
    return dict(out=out, ops=_ops())


def _probe_moe(answer, seed):
    """Random hidden size, experts (a multiple of the world size), tokens per rank, capacity factor."""
    import torch
    import torch.distributed as dist

    from simlib.parallel.experts import MoE

    rank, n, draw, out = dist.get_rank(), dist.get_world_size(), random.Random(seed), []
    for i in range(2):
        hidden, experts, tokens = draw.randint(2, 6), n * draw.randint(1, 3), draw.randint(1, 6)
        factor = draw.choice([0.5, 1.0, 1.5, 8.0])
        torch.manual_seed(seed + i)
        moe = MoE(hidden, experts, 1, factor, ffn=4).double()
        x = torch.randn(tokens * n, hidden, generator=torch.Generator().manual_seed(seed + i), dtype=torch.float64)
        local = experts // n
        with torch.no_grad():
            y = answer(
                x[rank * tokens : (rank + 1) * tokens].clone(),
                moe.router,
                torch.nn.ModuleList(moe.experts[rank * local : (rank + 1) * local]),
                experts,
                factor,
            )
        out.append(y.detach().clone() if isinstance(y, torch.Tensor) else repr(y))
    return dict(out=out, ops=_ops())


def _probe_one_f_one_b(answer, seed):
    """In one process: every rank's order for 10 random (stages 1-6, micro-batches 1-10) problems."""
    draw = random.Random(seed)
    sizes = [(draw.randint(1, 6), draw.randint(1, 10)) for _ in range(10)]
    return dict(out=[[list(answer(r, p, m)) for r in range(p)] for p, m in sizes], ops=[])


def _probe_accumulate(answer, seed):
    """A random MLP under DDP, k random micro-batches of random (unequal) sizes, random lr; two steps; the
    weights, what the grads are left at, and how many all-reduces DDP made (counted by a comm hook)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from simlib.lessons.data_parallel import count_all_reduces
    from simlib.models import MLP

    rank, draw = dist.get_rank(), random.Random(seed)
    width, depth, inputs, k, lr = (
        draw.randint(2, 8),
        draw.randint(1, 3),
        draw.randint(1, 5),
        draw.randint(1, 4),
        draw.choice([0.05, 0.1, 0.3]),
    )
    torch.manual_seed(seed)
    model = MLP(width, depth, in_features=inputs).double()
    ddp = DDP(model)
    counter = count_all_reduces(ddp)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed * 31 + rank)
    batches = [
        (torch.randn(b, inputs, generator=g, dtype=torch.float64), torch.randn(b, 1, generator=g, dtype=torch.float64))
        for b in [draw.randint(1, 4) for _ in range(k)]
    ]
    for _ in range(2):
        answer(ddp, opt, batches, torch.nn.functional.mse_loss)
    return dict(
        out=[
            [p.detach().clone() for p in model.parameters()],
            [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        ],
        ops=[counter["calls"]],
    )


def _probe_pipeline(answer, seed):
    """Stages of random depth (a Linear and tanh per layer), random width, micro-batch size and count; float32
    (what the answer's receive buffers hold); the last stage's loss, every stage's gradients and its sends/recvs."""
    import torch
    import torch.distributed as dist

    rank, draw = dist.get_rank(), random.Random(seed)
    width, b, m = draw.randint(2, 6), draw.randint(1, 3), draw.randint(1, 5)
    depths = [draw.randint(1, 3) for _ in range(dist.get_world_size())]
    torch.manual_seed(seed * 7 + rank)
    stage = torch.nn.Sequential(
        *[layer for _ in range(depths[rank]) for layer in (torch.nn.Linear(width, width), torch.nn.Tanh())]
    )
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(b, width, generator=g) for _ in range(m)]
    ys = [torch.randn(b, width, generator=g) for _ in range(m)]
    loss = answer(stage, xs, ys, (b, width))
    return dict(
        out=[
            loss if loss is None else torch.tensor(float(loss), dtype=torch.float64),
            [None if p.grad is None else p.grad.clone() for p in stage.parameters()],
        ],
        ops=_ops(),
    )


def _probe_zero3(answer, seed):
    """Random batch, input size and shard rows; float64; output, input grad and shard grad, and collectives."""
    import torch
    import torch.distributed as dist

    rank, n, draw, out = dist.get_rank(), dist.get_world_size(), random.Random(seed), []
    for i in range(2):
        b, fin, rows = draw.randint(1, 5), draw.randint(1, 6), draw.randint(1, 4)
        g = torch.Generator().manual_seed(seed + i)
        weight = torch.randn(rows * n, fin, generator=g, dtype=torch.float64)
        x = torch.randn(b, fin, generator=g, dtype=torch.float64) * (rank + 1)
        w = torch.randn(b, rows * n, generator=g, dtype=torch.float64)
        x.requires_grad_()
        shard = weight[rank * rows : (rank + 1) * rows].clone().requires_grad_()
        y = answer(x, shard)
        (y * w).sum().backward()
        out.append([y.detach().clone(), x.grad, shard.grad])
    return dict(out=out, ops=_ops())


def _probe_bucket(answer_cls, seed):
    """A random MLP (float32, what the buffers hold), a bucket cap that makes one to several buckets, a random
    local batch; two SGD steps: step 0's gradients, the weights after, and the collectives."""
    import torch
    import torch.distributed as dist

    from simlib.models import MLP

    rank, draw = dist.get_rank(), random.Random(seed)
    width, depth, inputs, batch = draw.randint(2, 9), draw.randint(1, 3), draw.randint(1, 6), draw.randint(1, 5)
    cap = draw.choice([4e-5, 1e-4, 25.0])
    torch.manual_seed(seed + rank)  # replicas start apart: the answer's broadcast must line them up
    model = MLP(width, depth, in_features=inputs)
    g = torch.Generator().manual_seed(seed * 31 + rank)
    x, y = torch.randn(batch, inputs, generator=g), torch.randn(batch, 1, generator=g)
    dp = answer_cls(model, bucket_cap_mb=cap)
    opt, grads = torch.optim.SGD(model.parameters(), lr=0.1), []
    for _ in range(2):
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(dp(x), y).backward()
        dp.finish_gradient_synchronization()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    return dict(out=[grads, [p.detach().clone() for p in model.parameters()]], ops=_ops())


def _probe_sharded(answer_cls, seed):
    """A random MLP (float64), SGD with momentum or AdamW with random hyper-parameters, the same random gradients
    on every rank; three steps: the weights and the collectives."""
    import torch

    from simlib.models import MLP

    draw = random.Random(seed)
    width, depth, inputs = draw.randint(2, 9), draw.randint(1, 3), draw.randint(1, 6)
    torch.manual_seed(seed)
    model = MLP(width, depth, in_features=inputs).double()
    if draw.random() < 0.5:
        opt = answer_cls(
            model.parameters(),
            torch.optim.SGD,
            lr=draw.choice([0.05, 0.2]),
            momentum=0.9,
            weight_decay=draw.choice([0.0, 0.1]),
        )
    else:
        opt = answer_cls(
            model.parameters(),
            torch.optim.AdamW,
            lr=draw.choice([1e-3, 1e-2]),
            betas=(0.8, draw.choice([0.9, 0.99])),
            weight_decay=draw.choice([0.0, 0.1]),
        )
    g = torch.Generator().manual_seed(seed * 7)
    for _ in range(3):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g, dtype=torch.float64)
        opt.step()
    return dict(out=[p.detach().clone() for p in model.parameters()], ops=_ops())


def _probe_prefetch(answer_cls, seed):
    """The quick GPT with 1-4 layers (drawn) under the answer for two AdamW steps: losses, the full weights and
    the gathers it found in flight or had to start (``counts``: which neighbours it prefetched)."""
    import torch
    import torch.distributed as dist

    from simlib.projects.gpt.task import GPTTask

    rank, n = dist.get_rank(), dist.get_world_size()
    task = GPTTask.quick(num_layers=random.Random(seed).randint(1, 4), global_batch=12)
    model = task.build_model()
    z = answer_cls(model, blocks=task.blocks(model))
    opt, losses = torch.optim.AdamW(z.parameters(), lr=1e-2), []
    for step in range(2):
        x, y = task.batch(step, rank, n)
        opt.zero_grad()
        loss = task.loss(z(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return dict(out=[losses, dict(z.counts), z.full_state_dict()], ops=_ops())


def _probe_full_state(answer_cls, seed):
    """A regression task of drawn sizes and seed (dropout, every rank its own stream, every generator drawn):
    stop at step 6, a fresh run resumes from the step-4 checkpoint to step 12; the resumed losses by step (the
    solution's equal the uninterrupted run's, bit for bit)."""
    import tempfile

    import torch.distributed as dist

    from simlib.grading import fault_tolerance as ft
    from simlib.tasks import RegressionTask

    draw = random.Random(seed)
    task = ft._RankStreams(
        RegressionTask(
            width=draw.choice([8, 16, 24]),
            depth=draw.choice([1, 2, 3]),
            global_batch=24,
            num_samples=480,
            dropout=0.2,
            seed=seed % 1000,
        )
    )
    where = [tempfile.mkdtemp(prefix="simlib-probe-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(where, src=0)
    ft._losses(answer_cls, where[0], ft._STOP, task=task)
    return dict(out=ft._losses(answer_cls, where[0], ft._STEPS, task=task))


def _wide_plan_cases(seed: int, n: int) -> list:
    """GPT shapes and plans from a WIDER space than the grader's ``draw_cases`` (issue 47: a probe that draws from
    the check's own generator inherits its blind spots): any head count and head dim (so 5*a*s/h is rarely whole),
    any sequence length and vocabulary, any layer count that the pipeline divides, every schedule and ZeRO stage."""
    from simlib.sim import Strategy, gpt

    rng = random.Random(seed)
    cases = []
    while len(cases) < n:
        heads, tp, pp = rng.randint(1, 48), rng.choice([1, 2, 3, 4, 8]), rng.choice([1, 2, 3, 4])
        layers = pp * rng.randint(1, 16)
        if heads % tp:
            continue
        model = gpt(
            layers, heads * rng.randint(8, 200), heads, seq_len=rng.randint(16, 8192), vocab=rng.randint(100, 260_000)
        )
        s = Strategy(
            dp=rng.randint(1, 96),
            tp=tp,
            pp=pp,
            micro_batch=rng.randint(1, 8),
            num_micro_batches=rng.randint(1, 24),
            zero_stage=rng.choice([0, 1, 2, 3]),
            recompute=rng.choice(["none", "selective", "full"]),
            schedule=rng.choice(["1f1b", "gpipe"]),
            sequence_parallel=tp > 1 and rng.random() < 0.8,
        )
        cases.append((model, s))
    return cases


def _probe_plan_memory(answer, seed):
    """40 GPT shapes and plans from a wider space than the grader's (``_wide_plan_cases``); every part's bytes."""
    from simlib.grading.planner import PARTS

    out = []
    for model, s in _wide_plan_cases(10_000 + seed, 40):
        got = answer(model, s)
        out.append(
            [float(got[k]) for k in PARTS] if isinstance(got, dict) and all(k in got for k in PARTS) else repr(got)
        )
    return dict(out=out)


# exercise notebook -> (grading name, probe, world sizes the probe runs on; () = in this process)
PROBES = {
    "01_ring_all_reduce": ("ring_all_reduce", _probe_ring, (2, 3, 4)),
    "02_average_gradients": ("average_gradients", _probe_average, (2, 3, 4)),
    "05_tp_linear": ("tp_linear", _probe_tp, (2, 3, 4)),
    "07_checkpoint_placement": ("checkpoint_placement", _probe_checkpoint, ()),
    "09_ring_attention": ("ring_attention", _probe_ring_attention, (2, 3, 4)),
    "09_moe_dispatch": ("moe_dispatch", _probe_moe, (2, 3, 4)),
    "04_one_f_one_b": ("one_f_one_b", _probe_one_f_one_b, ()),
    "03_accumulate_no_sync": ("accumulate_no_sync", _probe_accumulate, (2, 3, 4)),
    "04_pipeline_stage": ("pipeline_stage", _probe_pipeline, (2, 3, 4)),
    "07_zero3_layer": ("zero3_linear", _probe_zero3, (2, 3, 4)),
    "02_bucket_data_parallel": ("bucket_data_parallel", _probe_bucket, (2, 3, 4)),
    "07_sharded_optimizer": ("sharded_optimizer", _probe_sharded, (2, 3, 4)),
    "09b_zero3_prefetch": ("zero3_prefetch", _probe_prefetch, (2, 3, 4)),
    "13_plan_memory": ("plan_memory", _probe_plan_memory, ()),
    "08_full_state": ("full_state", _probe_full_state, (2,)),
}
ORDER = (
    "07_checkpoint_placement",
    "02_average_gradients",
    "05_tp_linear",
    "01_ring_all_reduce",  # cheap first
    "09_moe_dispatch",
    "09_ring_attention",
    "04_one_f_one_b",
    "03_accumulate_no_sync",
    "04_pipeline_stage",
    "07_zero3_layer",
    "07_sharded_optimizer",
    "02_bucket_data_parallel",
    "09b_zero3_prefetch",
    "13_plan_memory",
    "08_full_state",
)
