"""Check for lesson 09b's exercise: prefetching in ZeRO-3 (the next block's all-gather while this one computes)."""
from __future__ import annotations

from .core import Result, _close, exercise

_STEPS = 2


def _prefetch_harness(answer_cls, steps=_STEPS):
    """Train the quick GPT for ``steps`` steps with the course's Zero3 and with ``answer_cls``; return both."""
    import torch
    import torch.distributed as dist

    from ..projects.gpt.task import GPTTask
    from ..parallel.zero3 import Zero3
    task = GPTTask.quick(num_layers=3, global_batch=12)  # 12 splits over 2, 3 and 4 ranks
    rank, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for name, cls in (("reference", Zero3), ("answer", answer_cls)):
        model = task.build_model()  # seeded: the same weights on every rank and for both
        z = cls(model, blocks=task.blocks(model))
        opt = torch.optim.AdamW(z.parameters(), lr=1e-2)
        losses = []
        for step in range(steps):
            x, y = task.batch(step, rank, n)
            opt.zero_grad()
            loss = task.loss(z(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        counts = dict(getattr(z, "counts", {}))  # before full_state_dict's own gathers
        out[name] = {"losses": losses, "params": z.full_state_dict(), "counts": counts,
                     "block_units": sum(len(b) for b in getattr(z, "blocks", [])),
                     "root_units": sum(1 for u in z.units if not u.name)}
    return out


@exercise("zero3_prefetch")
def _check_zero3_prefetch(answer, grader):
    for world_size in (2, 3, 4):
        outs = grader.run(world_size, _prefetch_harness, answer)
        ref, ans = outs[0]["reference"], outs[0]["answer"]
        bad = [k for k in ref["params"] if not _close(ans["params"][k], ref["params"][k], rtol=0, atol=1e-6)]
        yield Result(f"same losses and parameters as Zero3 on {world_size} ranks",
                     _close(ans["losses"], ref["losses"], rtol=0, atol=1e-6) and not bad,
                     hint="prefetching changes when the parameters arrive, never their values: gather each block's "
                          "own shard into its own buffer, and let the block use it only after the gather is waited "
                          "for (issue_gather keeps the handle; every gather waits on it first)",
                     detail=f"first parameter that differs: {bad[0]}" if bad else f"losses {ans['losses']}")
        counts = ans["counts"]
        expected = 2 * _STEPS * ans["block_units"]  # every block's gather, forward and backward, every step
        waited = 2 * _STEPS * ans["root_units"]     # only the root (embeddings, head) cannot be prefetched
        yield Result(f"every block's all-gather prefetched, forward and backward, on {world_size} ranks",
                     counts.get("prefetched") == expected and counts.get("waited") == waited,
                     hint="in forward, block i (i = -1 for the root) starts block i+1's gather; in backward the "
                          "order is reversed: block i starts block i-1's. A gather started for the wrong block "
                          "arrives too late or is thrown away, and its block waits from scratch",
                     detail=f"prefetched {counts.get('prefetched')} of {expected}, waited {counts.get('waited')} "
                            f"(expected {waited})")
