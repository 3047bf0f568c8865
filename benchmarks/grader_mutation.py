"""How many wrong answers does the grader catch? Mutation testing of every exercise's solution.

    python benchmarks/grader_mutation.py                                   # every exercise with a probe
    python benchmarks/grader_mutation.py --exercise 02_average_gradients --max-mutants 50

For an exercise: the solution's answer code (the nbgrader regions of ``solutions/NN_name.ipynb``) is mutated
with :mod:`simlib.grading.mutants` (>= 50 mutants: every single-point mutant, then two- and three-point ones
for a short answer). A mutant whose cells fail to compile or run ("import") does not count. The rest are
graded by the real grader, ``simlib.grading.check(name, answer)`` (what the exercise notebook's check cell
calls), on warm clusters of 2, 3 and 4 ranks shared by every mutant (a mutant that hangs costs the Gloo timeout
plus a restart of that cluster). Then, for a mutant the grader *passed*:

- **equivalent** (discarded): on random instances drawn here (sizes, world sizes 2, 3 and 4, values; see each
  ``_probe_*``) its outputs equal the solution's (the one-process reference's, to 1e-6 relative in float64)
  *and* every rank called the same collectives (operation, shape, peer, from the hang finder's log);
- **survived** otherwise: a wrong answer (or one that breaks the exercise's communication contract) that the
  grader passed. Survivors are listed with their mutation.

A mutant the grader fails is **caught** (by status: fail, error, timeout). Catch rate = caught / (caught +
survived). Results go to ``benchmarks/results/grader_mutation.json``, merged per exercise (a run with
``--exercise`` updates only that exercise's entry).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402

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
        x, y = torch.randn(batch, inputs, generator=g, dtype=torch.float64), torch.randn(batch, 1, generator=g,
                                                                                      dtype=torch.float64)
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
        w1, b1 = torch.randn(ffn, h, generator=g, dtype=torch.float64), torch.randn(ffn, generator=g,
                                                                                   dtype=torch.float64)
        w2, b2 = torch.randn(h, ffn, generator=g, dtype=torch.float64), torch.randn(h, generator=g,
                                                                                   dtype=torch.float64)
        x = torch.randn(b, s, h, generator=g, dtype=torch.float64).requires_grad_()
        weights = torch.randn(b, s, h, generator=g, dtype=torch.float64)
        rows = slice(rank * ffn // n, (rank + 1) * ffn // n)
        mine = [w1[rows].clone().requires_grad_(), b1[rows].clone().requires_grad_(),
                w2[:, rows].clone().requires_grad_(), b2.clone().requires_grad_()]
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
        best = min(sum(flops[i] for i in c) for k in range(n + 1) for c in combinations(range(n), k)
                   if sum(inputs[i] if i in c else acts[i] for i in range(n)) <= budget)
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
            y = answer(x[rank * tokens:(rank + 1) * tokens].clone(), moe.router,
                       torch.nn.ModuleList(moe.experts[rank * local:(rank + 1) * local]), experts, factor)
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
    width, depth, inputs, k, lr = draw.randint(2, 8), draw.randint(1, 3), draw.randint(1, 5), draw.randint(1, 4), \
        draw.choice([0.05, 0.1, 0.3])
    torch.manual_seed(seed)
    model = MLP(width, depth, in_features=inputs).double()
    ddp = DDP(model)
    counter = count_all_reduces(ddp)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed * 31 + rank)
    batches = [(torch.randn(b, inputs, generator=g, dtype=torch.float64),
                torch.randn(b, 1, generator=g, dtype=torch.float64)) for b in [draw.randint(1, 4) for _ in range(k)]]
    for _ in range(2):
        answer(ddp, opt, batches, torch.nn.functional.mse_loss)
    return dict(out=[[p.detach().clone() for p in model.parameters()],
                     [None if p.grad is None else p.grad.clone() for p in model.parameters()]],
                ops=[counter["calls"]])


def _probe_pipeline(answer, seed):
    """Stages of random depth (a Linear and tanh per layer), random width, micro-batch size and count; float32
    (what the answer's receive buffers hold); the last stage's loss, every stage's gradients and its sends/recvs."""
    import torch
    import torch.distributed as dist
    rank, draw = dist.get_rank(), random.Random(seed)
    width, b, m = draw.randint(2, 6), draw.randint(1, 3), draw.randint(1, 5)
    depths = [draw.randint(1, 3) for _ in range(dist.get_world_size())]
    torch.manual_seed(seed * 7 + rank)
    stage = torch.nn.Sequential(*[layer for _ in range(depths[rank]) for layer in (torch.nn.Linear(width, width),
                                                                                    torch.nn.Tanh())])
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(b, width, generator=g) for _ in range(m)]
    ys = [torch.randn(b, width, generator=g) for _ in range(m)]
    loss = answer(stage, xs, ys, (b, width))
    return dict(out=[loss if loss is None else torch.tensor(float(loss), dtype=torch.float64),
                     [None if p.grad is None else p.grad.clone() for p in stage.parameters()]], ops=_ops())


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
        shard = weight[rank * rows:(rank + 1) * rows].clone().requires_grad_()
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
        opt = answer_cls(model.parameters(), torch.optim.SGD, lr=draw.choice([0.05, 0.2]), momentum=0.9,
                         weight_decay=draw.choice([0.0, 0.1]))
    else:
        opt = answer_cls(model.parameters(), torch.optim.AdamW, lr=draw.choice([1e-3, 1e-2]),
                         betas=(0.8, draw.choice([0.9, 0.99])), weight_decay=draw.choice([0.0, 0.1]))
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
}
ORDER = ("07_checkpoint_placement", "02_average_gradients", "05_tp_linear", "01_ring_all_reduce",  # cheap first
         "09_moe_dispatch", "09_ring_attention", "04_one_f_one_b", "03_accumulate_no_sync", "04_pipeline_stage",
         "07_zero3_layer", "07_sharded_optimizer", "02_bucket_data_parallel",
         "09b_zero3_prefetch")


def _same(a, b) -> bool:
    import torch
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and torch.allclose(a, b, rtol=1e-6, atol=1e-9, equal_nan=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


class _Alarm(Exception):
    pass


def _with_alarm(seconds, fn, *args, **kwargs):
    """``fn`` in this process with a limit (an in-process check of a mutant that loops forever)."""
    def ring(*_):
        raise _Alarm()
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(int(seconds))
    try:
        return fn(*args, **kwargs)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _observe(probe, worlds, answer, clusters, seeds, limit):
    """The probe's outputs on every world size and seed; None when the answer fails, hangs or overruns."""
    from simlib.launch import WorkerError
    seen = []
    for seed in seeds:
        if not worlds:
            try:
                seen.append(_with_alarm(limit, probe, answer, seed))
            except (Exception, _Alarm):  # noqa: BLE001 - a mutant that crashes is not equivalent
                return None
        for n in worlds:
            try:
                seen.append(clusters[n].call(probe, (answer, seed), timeout=limit))
            except WorkerError:
                return None
            except Exception:  # noqa: BLE001 - e.g. an answer cloudpickle cannot send
                return None
    return seen


def _clusters(worlds):
    from simlib.launch import Cluster, OversubscribedWarning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OversubscribedWarning)
        return {n: Cluster(n, timeout=5.0, threads=1, grace=2.0) for n in worlds}


def run_exercise(notebook: str, max_mutants: int | None, seed: int, clusters: dict, limit: float) -> dict:
    from simlib import grading
    from simlib.grading import mutants as M
    name, probe, worlds = PROBES[notebook]
    answer_name = next(e["answer"] for e in _entries(notebook) if e["exercise"] == name)
    t0 = time.monotonic()
    all_mutants = M.mutate(M.answer_cells(ROOT / "solutions" / f"{notebook}.ipynb"), at_least=50, seed=seed)
    chosen = all_mutants
    if max_mutants is not None and len(all_mutants) > max_mutants:
        chosen = sorted(random.Random(seed).sample(all_mutants, max_mutants), key=lambda m: m.id)
    solution = M.load([src for src, _ in M.answer_cells(ROOT / "solutions" / f"{notebook}.ipynb")], notebook)
    verdict = grading.check(name, solution[answer_name], clusters=clusters, timeout=limit, quiet=True)
    if not verdict.passed:
        raise SystemExit(f"{notebook}: the solution itself fails the grader: {verdict.failed()[0].line()}")
    seeds = [seed * 1000 + k for k in range(2)]
    reference = _observe(probe, worlds, solution[answer_name], clusters, seeds, limit)
    assert reference is not None, f"{notebook}: the solution fails its own probe"
    rows, counts = [], dict(import_failed=0, equivalent=0, caught=0, survived=0)
    by_status: dict = {}
    for m in chosen:
        t = time.monotonic()
        row = m.to_dict()
        try:
            answer = M.load(m.sources, f"mutant {m.id}")[answer_name]
        except BaseException as exc:  # noqa: BLE001 - it does not count
            row.update(outcome="import_failed", why=f"{type(exc).__name__}: {exc}")
            counts["import_failed"] += 1
            rows.append(row)
            continue
        try:
            verdict = grading.check(name, answer, clusters=clusters, timeout=limit, quiet=True) if worlds else \
                _with_alarm(limit * 4, grading.check, name, answer, quiet=True)
            status = verdict.status
            first = next((r for r in verdict.results if not r.passed), None)
            row["check"] = first.name if first else None
        except _Alarm:
            status = "timeout (benchmark alarm)"
        if status != "pass":
            row["outcome"] = "caught"
            row["status"] = status
            by_status[status] = by_status.get(status, 0) + 1
        else:
            seen = _observe(probe, worlds, answer, clusters, seeds, limit)
            row["outcome"] = "equivalent" if seen is not None and _same(seen, reference) else "survived"
        counts[row["outcome"]] += 1
        row["seconds"] = round(time.monotonic() - t, 2)
        rows.append(row)
        print(f"  {notebook} mutant {m.id:3d} {row['outcome']:10s} {row.get('status', ''):10s} {m.description}",
              flush=True)
    judged = counts["caught"] + counts["survived"]
    return dict(exercise=name, notebook=notebook, mutants=len(chosen), generated=len(all_mutants), **counts,
                caught_by_status=by_status, catch_rate=round(counts["caught"] / judged, 4) if judged else None,
                survivors=[r for r in rows if r["outcome"] == "survived"],
                equivalents=[r["mutation"] for r in rows if r["outcome"] == "equivalent"],
                seconds=round(time.monotonic() - t0, 1), rows=rows)


def _entries(notebook):
    import nbformat

    from simlib.exercises import exercises_of
    return exercises_of(nbformat.read(str(ROOT / "solutions" / f"{notebook}.ipynb"), as_version=4))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--exercise", action="append", help=f"notebook name (repeatable); one of {sorted(PROBES)}")
    parser.add_argument("--max-mutants", type=int, default=None, help="grade at most this many (a seeded sample)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=20.0, help="the grader's limit per run, seconds")
    parser.add_argument("--out", default=str(report.RESULTS / "grader_mutation.json"))
    args = parser.parse_args(argv)
    wanted = args.exercise or list(ORDER)
    unknown = [e for e in wanted if e not in PROBES]
    if unknown:
        parser.error(f"no equivalence probe for {unknown}: known {sorted(PROBES)}")
    load = os.getloadavg()
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.exists() else dict(benchmark="grader_mutation", exercises={})
    clusters = _clusters(sorted({n for e in wanted for n in PROBES[e][2]}))
    try:
        for notebook in wanted:
            entry = run_exercise(notebook, args.max_mutants, args.seed, clusters, args.timeout)
            result["exercises"][notebook] = entry
            result["machine"] = report.machine(load, shared="the 2-core machine was shared with other sessions")
            report.write(result, out)
            rate = entry["catch_rate"]
            print(f"{notebook}: {entry['mutants']} mutants, {entry['equivalent']} equivalent, {entry['caught']} caught,"
                  f" {entry['survived']} survived, {entry['import_failed']} failed to import; catch rate "
                  f"{'n/a' if rate is None else f'{100 * rate:.1f} %'} ({entry['seconds']:.0f} s)", flush=True)
            for s in entry["survivors"]:
                print(f"    survived: {s['mutation']}")
    finally:
        for c in clusters.values():
            c.close()
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
