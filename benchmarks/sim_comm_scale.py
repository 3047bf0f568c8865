"""Data parallelism at thousands of GPUs as the simulator now prices it: the exposed data-parallel sync of a dense 8B
with one micro-batch per replica (the case issue 52 found 60 % too slow at ~10,000 GPUs), from 64 to 16,384 H100s.

    .venv/bin/python benchmarks/sim_comm_scale.py

Four ways the same step's sync can run (``simlib.sim.grad_sync.dp_sync``, ``simlib.sim.topology.between_nodes``):
  DDP all-reduce, buckets under backward;
  distributed optimizer: reduce-scatter under backward, all-gather under the next forward (Megatron's
  --overlap-param-gather, with Megatron's bucket of max(40M, 1M × dp) parameters): only the last and the first
  bucket exposed — the whole sync once a bucket holds the whole model (dp ≥ 8,192 for an 8B);
  the same with the all-gather in FP8 (an FP8 step, --fp8-param-gather);
  the same on a fabric with in-network reduction (SHARP) — it speeds the all-reduce only.
And one bucket's inter-node all-reduce as a ring against NCCL's double binary tree (the faster is what is priced).
Writes benchmarks/results/sim_comm_scale.json and .png. Pure arithmetic: seconds.
"""

import json
import math
import pathlib
import time

from simlib import sim
from simlib.sim import collectives
from simlib.sim.plan_result import resolve_model
from simlib.sim.scale_runs import megatron_bucket_bytes

GPUS = (64, 256, 1024, 4096, 16384)


def rows():
    model = resolve_model("8B")
    hw = sim.preset("h100")
    sharp = hw.with_fabric(in_network_reduction=True)
    out = []
    for n in GPUS:
        base = sim.Strategy(dp=n, micro_batch=1, num_micro_batches=1, zero_stage=1, overlap=True, attention="flash")
        dist = base.replace(param_gather_overlap=True, bucket_bytes=megatron_bucket_bytes(n))  # Megatron's bucket
        variants = {
            "DDP all-reduce under backward (25 MB buckets)": (base, hw),
            "distributed optimizer (RS under backward, AG under forward)": (dist, hw),
            "  + FP8 all-gather (FP8 step)": (dist.replace(dtype="fp8", fp8_param_gather=True), hw),
            "DDP all-reduce with in-network reduction": (base, sharp),
        }
        row = dict(gpus=n)
        for name, (s, h) in variants.items():
            p = sim.predict(model, h, s)
            row[name] = dict(
                step=p.step_time,
                dp_exposed=p.breakdown["dp_exposed"],
                dp_total=p.breakdown["dp_comm"],
                exposed_share=p.breakdown["dp_exposed"] / p.step_time,
            )
        nodes, size = n // hw.devices_per_node, s.bucket_bytes / hw.devices_per_node  # one member per node's shard
        row["bucket all-reduce between nodes (ring, tree) s"] = (
            collectives.ring_all_reduce(size, nodes, hw.inter) if nodes > 1 else 0.0,
            collectives.tree_all_reduce(size, nodes, hw.inter) if nodes > 1 else 0.0,
        )
        out.append(row)
    return out


def figure(table, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k in table[0] if isinstance(table[0][k], dict)]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for name, (ls, mk) in zip(names, (("-", "o"), ("--", "s"), (":", "^"), ("-.", "x"))):  # DDP and SHARP overlap
        ax.plot(GPUS, [r[name]["exposed_share"] for r in table], ls=ls, marker=mk, label=name.strip())
    ax.set_xscale("log", base=2)
    ax.set_xticks(GPUS, [f"{g:,}" for g in GPUS])
    ax.set_xlabel("H100 GPUs (data parallel, one micro-batch of 8,192 tokens per replica)")
    ax.set_ylabel("exposed DP sync / step")
    ax.set_title("Llama-3-8B-shaped model: what of the data-parallel sync compute does not hide", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main():
    t0 = time.perf_counter()
    table = rows()
    here = pathlib.Path(__file__).parent / "results"
    (here / "sim_comm_scale.json").write_text(
        json.dumps(dict(benchmark="sim_comm_scale", rows=table, seconds=time.perf_counter() - t0), indent=1)
    )
    figure(table, here / "sim_comm_scale.png")
    for r in table:
        cells = "; ".join(
            f"{k.strip()}: {v['exposed_share']:.0%} of {v['step'] * 1e3:.0f} ms"
            for k, v in r.items()
            if isinstance(v, dict)
        )
        ring, tree = r["bucket all-reduce between nodes (ring, tree) s"]
        print(
            f"{r['gpus']:>6} GPUs  {cells}; one bucket between nodes: ring {ring * 1e3:.2f} ms, tree {tree * 1e3:.2f} ms"
        )
    assert all(not math.isnan(v["step"]) for r in table for v in r.values() if isinstance(v, dict))


if __name__ == "__main__":
    main()
