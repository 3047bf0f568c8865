"""ZeRO 1/2/3, FSDP2, mixed precision and recomputation: equal to one process, or a clear error.

Tolerances (fp32): parameters after 3 AdamW steps within atol 2e-6 / rtol 1e-5 of the one-process run. The
variants compute the same sums in another order (two or four half-batch means averaged; a reduce to an owner
instead of an all-reduce), ~1e-7 relative per operation; a real bug (a sum not divided by the world size, a
shard stepped twice, a parameter never broadcast) moves them by 1e-3 or more. bf16 parameters: atol 2e-2.
"""

import sys

import cloudpickle
import pytest
import torch

from simlib.lessons import memory as ze
from simlib.parallel.comm_log import CommLog

cloudpickle.register_pickle_by_value(sys.modules[__name__])

TOL = dict(atol=2e-6, rtol=1e-5)
SIZE = dict(steps=3, width=12, depth=2, global_batch=24, lr=1e-2)  # 12 → 3 x 48 x 12 params: odd shard sizes


def _equality_job(sizes):
    out = {}
    for variant in ze.VARIANTS:
        r = ze.run_memory(variant, measure_peak=False, **sizes)
        out[variant] = dict(
            params=r["params"], losses=r["losses"], states=r["states"], comm=r["comm_bytes"], numel=r["numel"]
        )
    r = ze.run_memory("zero3", measure_peak=False, checkpointing=True, **sizes)
    out["zero3+recompute"] = dict(params=r["params"], losses=r["losses"])
    return out


def _check_equal(results, world):
    ref = ze.reference(**SIZE)
    for variant, r in results[0].items():
        for name, want in ref["params"].items():
            torch.testing.assert_close(
                r["params"][name], want, **TOL, msg=lambda m, v=variant, n=name: f"{v} at {world} ranks, {n}: {m}"
            )
        mean_loss = [sum(res[variant]["losses"][s] for res in results) / world for s in range(SIZE["steps"])]
        torch.testing.assert_close(torch.tensor(mean_loss), torch.tensor(ref["losses"]), **TOL)


def test_every_variant_equals_one_process_on_2_ranks(cluster2):
    results = cluster2.run(_equality_job, SIZE)
    _check_equal(results, 2)
    r = results[0]
    n = r["ddp"]["numel"]
    # what each stage keeps (bytes after a step): ZeRO-1 shards the optimizer, ZeRO-2 + gradients, ZeRO-3 + weights
    assert r["ddp"]["states"]["optimizer"] == 8 * n
    assert sum(res["zero1"]["states"]["optimizer"] for res in results) == 8 * n  # owners hold it once in all
    assert sum(res["zero2"]["states"]["gradients"] for res in results) == 4 * n
    assert sum(res["zero3"]["states"]["weights"] for res in results) >= 4 * n  # + padding to a multiple of 2
    # communication: ZeRO-1/2 move what DDP moves; ZeRO-3 1.5x (ZeRO paper §7)
    ddp = ze.comm_volume(r["ddp"]["comm"], 2)
    assert ze.comm_volume(r["zero2"]["comm"], 2) == pytest.approx(ddp, rel=1e-3)
    assert ze.comm_volume(r["zero3"]["comm"], 2) == pytest.approx(1.5 * ddp, rel=0.02)


def test_every_variant_equals_one_process_on_4_ranks(cluster4):
    _check_equal(cluster4.run(_equality_job, SIZE), 4)


def _three_of_four(sizes):
    """World size 3 (a sub-group of a 4-rank cluster): 3 does not divide the batch's 24 rows' params."""
    import torch.distributed as dist

    group = dist.new_group([0, 1, 2])
    if dist.get_rank() == 3:
        return None
    return {
        v: ze.run_memory(v, measure_peak=False, group=group, **sizes)["params"] for v in ("zero1", "zero2", "zero3")
    }


def test_world_size_three_and_uneven_shards(cluster4):
    results = cluster4.run(_three_of_four, SIZE)
    ref = ze.reference(**SIZE)
    for params in results[0].values():
        for name, want in ref["params"].items():
            torch.testing.assert_close(params[name], want, **TOL)


def _fsdp2_gradient_ratio():
    """FSDP2 on Gloo: the gradient after one backward over ranks' halves, against one process's whole batch."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, n = dist.get_rank(), dist.get_world_size()
    model, x, y = ze.mlp_problem(8, 2, 8, 0)
    ref, _, _ = ze.mlp_problem(8, 2, 8, 0)
    mesh = init_device_mesh("cpu", (n,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    b = 8 // n
    torch.nn.functional.mse_loss(model(x[rank * b : (rank + 1) * b]), y[rank * b : (rank + 1) * b]).backward()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    got = model.blocks[0][0].weight.grad.full_tensor()
    return float(got.norm() / ref.blocks[0][0].weight.grad.norm())


def test_fsdp2_averages_gradients_on_gloo(cluster2, cluster4):
    """PyTorch issue 162338 reported FSDP2 on Gloo summing gradients (ratio = world size); torch 2.13 averages."""
    for cluster in (cluster2, cluster4):
        ratios = cluster.run(_fsdp2_gradient_ratio)
        assert ratios == pytest.approx([1.0] * cluster.world_size, rel=1e-5), ratios


def _edge_cases():
    import torch.distributed as dist
    from torch import nn

    from simlib.parallel import zero, zero3

    rank = dist.get_rank()
    out = {}
    # frozen parameters stay whole and untouched; the rest trains as in one process
    ref, x, y = ze.mlp_problem(8, 2, 8, 0)
    model, _, _ = ze.mlp_problem(8, 2, 8, 0)
    for m in (ref, model):
        m.embed.requires_grad_(False)
    z = zero3.Zero3(model)
    opt = torch.optim.SGD(z.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=0.1)
    n = dist.get_world_size()
    b = 8 // n
    nn.functional.mse_loss(z(x[rank * b : (rank + 1) * b]), y[rank * b : (rank + 1) * b]).backward()
    opt.step()
    nn.functional.mse_loss(ref(x), y).backward()
    ref_opt.step()
    full = z.full_state_dict()
    out["frozen"] = max(float((full[k] - v).abs().max()) for k, v in ref.state_dict().items())
    # mixed dtypes: one bf16 block; flat shards per dtype
    model, _, _ = ze.mlp_problem(8, 2, 8, 0)
    model.blocks[1].to(torch.bfloat16)
    z = zero3.Zero3(model)
    out["dtypes"] = sorted(str(s.dtype) for s in z.parameters())
    # errors that name the rank and the remedy
    for name, fn in {
        "lbfgs": lambda: zero3.check_elementwise(torch.optim.LBFGS, rank),
        "no_optimizer": lambda: zero.ZeroDataParallel(ze.mlp_problem(8, 1, 8, 0)[0], stage=2)(x).sum().backward(),
        "batch": lambda: ze.run_memory("zero1", global_batch=7, measure_peak=False),
        "tied": lambda: zero3.Zero3(_tied_across_blocks()),
    }.items():
        try:
            fn()
            out[name] = "no error"
        except (ValueError, RuntimeError) as exc:
            out[name] = str(exc)
    return out


def _tied_across_blocks():
    from torch import nn

    a, b = nn.Linear(4, 4), nn.Linear(4, 4)
    b.weight = a.weight
    return nn.Sequential(a, b)


def test_frozen_mixed_dtypes_and_clear_errors(cluster2):
    out = cluster2.run(_edge_cases)[1]
    assert out["frozen"] < 1e-6
    assert out["dtypes"] == ["torch.bfloat16"] * 2 + ["torch.float32"] * 4  # one flat shard per (block, dtype, decay)
    assert "rank 1" in out["lbfgs"] and "zero_stage=1 or 2" in out["lbfgs"]
    assert "rank 1" in out["no_optimizer"] and "ShardedOptimizer" in out["no_optimizer"]
    assert "rank 1" in out["batch"] and "multiple of 2" in out["batch"]
    assert "rank 1" in out["tied"] and "tied" in out["tied"]


def _cs336_style():
    """DDP + ShardedOptimizer(SGD with momentum, two parameter groups, an LR schedule) vs one process."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from simlib.parallel.zero import ShardedOptimizer

    rank, n = dist.get_rank(), dist.get_world_size()

    def groups(m):
        ps = list(m.parameters())
        return [
            dict(params=[p for p in ps if p.dim() >= 2], weight_decay=0.1),
            dict(params=[p for p in ps if p.dim() < 2], weight_decay=0.0),
        ]

    model, x, y = ze.mlp_problem(8, 2, 8, 0)
    ref, _, _ = ze.mlp_problem(8, 2, 8, 0)
    ddp = DDP(model)
    opt = ShardedOptimizer(groups(model), torch.optim.SGD, lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(groups(ref), lr=0.1, momentum=0.9)
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (s + 1)) for o in (opt, ref_opt)]
    b = 8 // n
    for _ in range(3):
        torch.nn.functional.mse_loss(ddp(x[rank * b : (rank + 1) * b]), y[rank * b : (rank + 1) * b]).backward()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        for o, s in zip((opt, ref_opt), scheds):
            o.step()
            o.zero_grad()
            s.step()
    return max(float((p - q).abs().max()) for p, q in zip(model.parameters(), ref.parameters()))


def test_sharded_optimizer_with_ddp_param_groups_and_scheduler(cluster4):
    assert max(cluster4.run(_cs336_style)) < 1e-6


def _train_plans():
    from simlib.tasks import RegressionTask
    from simlib.train import OptimConfig, Plan, train

    optim = OptimConfig(name="adamw", lr=1e-2, weight_decay=0.1, schedule="constant", grad_clip=0.05)
    out = {}
    for label, plan in {
        "zero0": Plan(dp=2),
        "zero1": Plan(dp=2, zero_stage=1),
        "zero2": Plan(dp=2, zero_stage=2),
        "zero3": Plan(dp=2, zero_stage=3),
        "zero3+ckpt+bf16": Plan(dp=2, zero_stage=3, activation_checkpointing=True, mixed_precision="bf16"),
    }.items():
        rec = train(
            RegressionTask(width=16, depth=2, global_batch=16),
            plan,
            steps=3,
            optim=optim,
            log_every=1,
            eval_every=3,
            verbose=False,
            measure_memory=False,
        )
        out[label] = ([r["loss"] for r in rec.rows], rec.evals[-1]["eval"]["eval_loss"])
    return out


def test_trainer_plans_with_zero_equal_plain_dp(cluster2):
    """plan.zero_stage / activation_checkpointing / mixed_precision reach simlib.parallel.zero through train()."""
    out = cluster2.run(_train_plans)[0]
    base_losses, base_eval = out["zero0"]
    for label in ("zero1", "zero2", "zero3"):  # the same AdamW, weight decay on matrices, global-norm clipping
        losses, ev = out[label]
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(base_losses), **TOL)
        assert ev == pytest.approx(base_eval, rel=1e-5), label
    losses, ev = out["zero3+ckpt+bf16"]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(base_losses), atol=2e-2, rtol=2e-2)


def test_loss_scaling_overflows_then_recovers():
    from simlib.parallel.precision import fp16_underflow_share, loss_scaling_demo

    rows = loss_scaling_demo(steps=24, init_scale=2.0**24)
    skipped = [r["skipped"] for r in rows]
    assert skipped[0] and not skipped[-1], skipped
    first_good = skipped.index(False)
    assert rows[first_good]["scale"] < rows[0]["scale"]  # halved at every overflow
    assert rows[-1]["loss"] < rows[first_good]["loss"]  # and then it trains
    tiny = torch.full((1000,), 1e-8)
    assert fp16_underflow_share(tiny) == 1.0 and fp16_underflow_share(tiny, scale=2.0**16) == 0.0


def test_master_weights_layout_is_2_2_12():
    from simlib.models import BlockMLP
    from simlib.parallel.precision import MasterWeightsOptimizer
    from simlib.parallel.zero import state_bytes

    model = BlockMLP(16, 2).to(torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    opt = MasterWeightsOptimizer(model.parameters(), lr=1e-3)
    model(torch.randn(4, 16, dtype=torch.bfloat16)).float().pow(2).mean().backward()
    opt.step()
    assert state_bytes(model, opt) == dict(weights=2 * n, gradients=2 * n, optimizer=12 * n)


def _recompute_peaks():
    from simlib.lessons.memory import peak_bytes
    from simlib.models import BlockMLP
    from simlib.parallel.recompute import checkpoint_blocks, uncheckpoint

    torch.manual_seed(0)
    model = BlockMLP(64, 4)
    x = torch.randn(2048, 64)  # activations (~2.6 MB a block) well above the states (~0.7 MB)

    def grads():
        model.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads()
    peak_bytes(grads)  # the first call sets glibc to return freed blocks; blocks freed before it may be reused
    peak_plain = min(peak_bytes(grads) for _ in range(2))
    chosen = checkpoint_blocks(model.blocks)
    again = grads()
    peak_ckpt = min(peak_bytes(grads) for _ in range(2))
    uncheckpoint(chosen)
    same = all(torch.equal(a, b) for a, b in zip(plain, again))
    return dict(same=same, plain=peak_plain, ckpt=peak_ckpt)


def test_recomputation_same_gradients_less_memory():
    """In a fresh process: the resident high-water mark depends on what the process allocated before."""
    import json
    import os
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    code = "import json, test_zero; print(json.dumps(test_zero._recompute_peaks()))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")]))
    out = json.loads(
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=120)
        .stdout.strip()
        .splitlines()[-1]
    )
    assert out["same"]  # bit-identical gradients: the recomputed forward is the same forward
    assert out["ckpt"] < 0.75 * out["plain"], out  # measured here: 8.3 MB vs 14.5 MB


def _zero3_policy():
    """ZeRO-3 with FSDP2's mixed-precision policy (bf16 weights gathered, fp32 reduce) beside ZeRO-3 in fp32 and
    beside torch's ``fully_shard(mp_policy=MixedPrecisionPolicy(bf16, fp32))``: bytes, dtypes, gradients."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from simlib.parallel import zero3

    rank, n = dist.get_rank(), dist.get_world_size()
    _, x, y = ze.mlp_problem(16, 2, 8, 0)
    b = 8 // n
    xs, ys = x[rank * b : (rank + 1) * b], y[rank * b : (rank + 1) * b]
    out = {}
    for label, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        model, _, _ = ze.mlp_problem(16, 2, 8, 0)
        counter = CommLog()
        z = zero3.Zero3(model, comm_counter=counter, param_dtype=dtype)
        before = z.full_state_dict()
        counter.reset()
        pred = z(xs)
        torch.nn.functional.mse_loss(pred.float(), ys).backward()
        opt = torch.optim.SGD(z.parameters(), lr=1.0)  # after one step: before - after = the averaged gradient
        out[label] = dict(
            bytes=counter.bytes_by_name(),
            pred_dtype=pred.dtype,
            shard_dtypes={str(u.shard.dtype) for u in z.units},
            grad_dtypes={str(u.shard.grad.dtype) for u in z.units},
        )
        opt.step()
        after = z.full_state_dict()
        out[label]["after_dtypes"] = {str(v.dtype) for v in after.values()}
        out[label]["grads"] = {k: before[k] - after[k] for k in before}
    # torch's FSDP2 with the same policy on the same blocks
    model, _, _ = ze.mlp_problem(16, 2, 8, 0)
    mesh = init_device_mesh("cpu", (n,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    torch.nn.functional.mse_loss(model(xs).float(), ys).backward()
    out["fsdp2"] = {k: p.grad.full_tensor() for k, p in model.named_parameters()}
    out["fsdp2_grad_dtypes"] = {str(p.grad.dtype) for p in model.parameters()}
    ref, _, _ = ze.mlp_problem(16, 2, 8, 0)
    torch.nn.functional.mse_loss(ref(x), y).backward()
    out["one_process"] = {k: p.grad for k, p in ref.named_parameters()}
    return out


def test_zero3_bf16_policy_halves_the_gather_and_matches_fsdp2(cluster2):
    """Weights cast to bf16 before the all-gather: half the gathered bytes, the reduce-scatter still fp32; the
    shards, their gradients and the state dict stay fp32; the gradients equal torch FSDP2's under the same policy
    (Gloo runs it) and the one-process fp32 gradients to bf16's precision."""
    for rank, out in enumerate(cluster2.run(_zero3_policy)):
        fp32, bf16 = out["fp32"], out["bf16"]
        assert bf16["bytes"]["all_gather"] * 2 == fp32["bytes"]["all_gather"], (bf16["bytes"], fp32["bytes"])
        assert bf16["bytes"]["reduce_scatter"] == fp32["bytes"]["reduce_scatter"], (bf16["bytes"], fp32["bytes"])
        assert bf16["pred_dtype"] == torch.bfloat16 and fp32["pred_dtype"] == torch.float32
        for key in ("shard_dtypes", "grad_dtypes", "after_dtypes"):
            assert bf16[key] == {"torch.float32"}, (rank, key, bf16[key])
        assert out["fsdp2_grad_dtypes"] == {"torch.float32"}
        for name, want in out["fsdp2"].items():
            # the same bf16 forward and backward; our step's fp32 subtraction adds ~1e-7 relative
            torch.testing.assert_close(bf16["grads"][name], want, atol=1e-6, rtol=1e-5, msg=f"rank {rank} {name}")
            torch.testing.assert_close(fp32["grads"][name], out["one_process"][name], **TOL)
            torch.testing.assert_close(bf16["grads"][name], out["one_process"][name], atol=2e-2, rtol=2e-2)


def _prefetch_policy(steps=3):
    """Zero3 and Zero3Prefetch on the quick GPT (3 blocks), fp32 and under the bf16 policy: per step the loss,
    the shards' gradients and the bytes all-gathered; the prefetch counts."""
    import torch.distributed as dist

    from simlib.parallel.zero3 import Zero3
    from simlib.parallel.zero_prefetch import Zero3Prefetch
    from simlib.projects.gpt.task import GPTTask

    task = GPTTask.quick(num_layers=3, global_batch=8)
    rank, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for label, cls, dtype in (
        ("zero3 bf16", Zero3, torch.bfloat16),
        ("prefetch bf16", Zero3Prefetch, torch.bfloat16),
        ("prefetch fp32", Zero3Prefetch, None),
    ):
        model = task.build_model()  # seeded: the same weights for all three
        counter = CommLog()
        z = cls(model, blocks=task.blocks(model), comm_counter=counter, param_dtype=dtype)
        opt = torch.optim.AdamW(z.parameters(), lr=1e-2)
        run = dict(losses=[], grads=[], gathered=[], logits_dtype=None)
        for step in range(steps):
            x, y = task.batch(step, rank, n)
            counter.reset()
            opt.zero_grad()
            logits = z(x)
            loss = task.loss(logits, y)
            loss.backward()
            run["gathered"].append(counter.bytes_by_name()["all_gather"])
            run["losses"].append(loss.detach().clone())
            run["grads"].append([u.shard.grad.clone() for u in z.units])
            run["logits_dtype"] = logits.dtype
            opt.step()
        run["counts"] = dict(getattr(z, "counts", {}))
        run["block_units"] = sum(len(b) for b in getattr(z, "blocks", []))
        run["root_units"] = sum(1 for u in z.units if not u.name)
        out[label] = run
    return out


def test_zero3_prefetch_takes_the_bf16_policy(cluster2):
    """Zero3Prefetch under FSDP2's policy (bf16 gathered, fp32 reduce): bit-equal losses and gradients to Zero3
    under the same policy (prefetching changes when the weights arrive, not what they are), half the fp32
    gather's bytes every step, and every block's gather, forward and backward, found in flight."""
    steps = 3
    for rank, out in enumerate(cluster2.run(_prefetch_policy, steps)):
        ref, pre, fp32 = out["zero3 bf16"], out["prefetch bf16"], out["prefetch fp32"]
        assert pre["logits_dtype"] == torch.bfloat16 and fp32["logits_dtype"] == torch.float32
        for step in range(steps):
            assert torch.equal(pre["losses"][step], ref["losses"][step]), (rank, step, pre["losses"], ref["losses"])
            for i, (g, want) in enumerate(zip(pre["grads"][step], ref["grads"][step])):
                assert g.dtype == torch.float32 and torch.equal(g, want), (rank, step, i, (g - want).abs().max())
            assert pre["gathered"][step] == ref["gathered"][step], (rank, step)
            assert 2 * pre["gathered"][step] == fp32["gathered"][step], (rank, step, pre["gathered"], fp32["gathered"])
        assert not torch.equal(pre["losses"][-1], fp32["losses"][-1])  # the policy did change the computation
        assert pre["block_units"] > 0
        assert pre["counts"] == {
            "prefetched": 2 * steps * pre["block_units"],
            "waited": 2 * steps * pre["root_units"],
        }, (rank, pre["counts"])
