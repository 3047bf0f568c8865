"""The rules a split of the work obeys, written once (torchtitan's ``ParallelDims``).

The trainer's :class:`simlib.train.Plan`, the rank grid :class:`simlib.parallel.mesh.Mesh` and the simulator's
:class:`simlib.sim.Strategy` all ask :func:`check`; none spells a rule again (``tests/test_plan_rules.py`` greps
for twins). Each rule refuses with one line: what is wrong and what would work instead.

    check(dp=2, cp=2, ep=4)                        # ep divides dp x cp
    check(dp=2, tp=2, world_size=8)                # the degrees multiply to the world size
    check(dp=2, global_batch=30, accumulation=4)   # the global batch splits into dp x accumulation x micro-batches

Pure Python (no torch): the simulator imports it without the trainer.
"""

from __future__ import annotations

__all__ = ["check", "check_sizes", "divisors", "ZERO_STAGES"]

ZERO_STAGES = (0, 1, 2, 3)  # 0: plain data parallelism; 1-3: optimizer states, + gradients, + weights sharded


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check(
    *,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    zero_stage: int = 0,
    world_size: int | None = None,
    global_batch: int | None = None,
    accumulation: int = 1,
    microbatches: int = 1,
    seq_len: int | None = None,
    sequence_parallel: bool = False,
    heads: int = 1,
    experts: int | None = None,
    owner: str = "plan",
    task: str = "",
    ep_folds_into_tp: bool = False,
    ulysses: bool = False,
) -> None:
    """Raise ``ValueError`` at the first rule these sizes break (``owner`` names the object in the messages:
    ``"plan"``, ``"mesh"``, ``"Strategy"``; ``task`` the task's name). A size left at its default is not checked
    against anything: give what you know.

    - every degree (dp, tp, pp, cp, ep, accumulation, micro-batches) is an int >= 1; ``zero_stage`` in 0..3
    - ``ep`` divides ``dp x cp``: expert parallelism shares experts out over the ranks holding tokens, adds none
    - ``world_size`` (when given) is ``dp x tp x pp x cp``
    - ``global_batch`` (when given) splits into ``dp x accumulation x microbatches`` equal parts
    - ``seq_len`` (when given) splits into the ``2 x cp`` zig-zag chunks, and over ``tp`` under sequence parallelism
    - ``experts`` (the model's mixture-of-experts experts, when known): ``ep > 1`` needs some, and they split
      over ``ep``
    - ``ep_folds_into_tp`` (the simulator's Megatron-scale plans): ``ep`` may also be a multiple of ``dp x cp``
      that divides ``tp x dp x cp`` (Megatron's MoE parallel folding)
    - ``ulysses`` (all-to-all context parallelism, with ``heads``): the heads split over ``tp x cp``
    """
    check_sizes(
        owner,
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        accumulation=accumulation,
        microbatches=microbatches,
        zero_stage=zero_stage,
    )
    _experts_divide(dp, cp, ep, tp if ep_folds_into_tp else None)
    if world_size is not None:
        _world(world_size, dp, tp, pp, cp, owner)
    if global_batch is not None:
        _batch(global_batch, dp, accumulation, microbatches)
    if seq_len is not None:
        _sequence(seq_len, cp, tp, sequence_parallel, heads)
    if experts is not None and ep > 1 and not experts:
        where = (f"model {task!r}" if owner == "Strategy" else f"task {task!r}") if task else "the model"
        also = (
            ""
            if owner == "Strategy"
            else f" (the GPT's MoE variant: --task.moe-experts {2 * ep}, GPTTask(moe_experts={2 * ep}))"
        )
        raise ValueError(
            f"ep={ep} shares out the experts of a mixture-of-experts model, but {where} is dense (no "
            f"experts): use ep=1, or a model with experts{also}"
        )
    if experts and experts % ep:
        raise ValueError(f"{experts} experts do not split over ep={ep}: use ep in {divisors(experts)}")
    if ulysses and cp > 1 and heads % (tp * cp):
        raise ValueError(f"Ulysses attention needs the {heads} heads to split over tp x cp = {tp * cp}")


def check_sizes(owner: str = "plan", zero_stage: int = 0, **degrees) -> None:
    """Only the types: every degree given is an int >= 1, ``zero_stage`` one of :data:`ZERO_STAGES` (what a
    frozen value checks on construction; how they combine is :func:`check`'s)."""
    prefix = "Plan." if owner == "plan" else ""
    for name, value in degrees.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{prefix}{name} must be an int >= 1, got {value!r}")
    if isinstance(zero_stage, bool) or zero_stage not in ZERO_STAGES:
        raise ValueError(f"{prefix}zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")


def _experts_divide(dp, cp, ep, tp=None) -> None:
    tokens = dp * cp
    if tp is not None and ep > tokens and (tp * tokens) % ep == 0:
        return  # Megatron's MoE parallel folding: the expert groups reach into the tensor-parallel ranks
    if tokens % ep:
        raise ValueError(
            f"ep={ep} does not divide the dp x cp = {tokens} ranks that hold tokens (expert "
            f"parallelism shares the experts out over them, it adds no ranks): use ep in "
            f"{divisors(tokens)}, or more dp x cp ranks"
        )


def _world(world_size, dp, tp, pp, cp, owner) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    needs = dp * tp * pp * cp
    if needs == world_size:
        return
    options = ", ".join(
        f"dp={world_size // (t * p)} tp={t} pp={p}" for t in divisors(world_size) for p in divisors(world_size // t)
    )
    cps = f" x cp={cp}" if cp > 1 else ""
    also = f" (or dp={world_size // cp} cp={cp})" if cp > 1 and world_size % cp == 0 else ""
    raise ValueError(
        f"{owner} dp={dp} x tp={tp} x pp={pp}{cps} needs {needs} ranks but the world has {world_size} "
        f"(the degrees multiply to the world size): use one of {options}{also}"
    )


def _batch(global_batch, dp, accumulation, microbatches) -> None:
    per_rank = dp * accumulation * microbatches
    if global_batch % per_rank == 0:
        return
    ok = [k for k in range(1, global_batch + 1) if global_batch % (dp * k * microbatches) == 0]
    pipe = f" x {microbatches} pipeline micro-batches" if microbatches > 1 else ""
    use = (
        f"use accumulation in {ok[:8]}{' ...' if len(ok) > 8 else ''}, or"
        if ok
        else f"no accumulation can fix that (it is not a multiple of dp x micro-batches = {dp * microbatches}): use"
    )
    raise ValueError(
        f"global batch {global_batch} does not split into dp={dp} ranks x {accumulation} accumulation "
        f"steps{pipe}: {use} a global batch that is a multiple of {per_rank}"
    )


def _sequence(seq_len, cp, tp, sequence_parallel, heads) -> None:
    if cp > 1 and seq_len % (2 * cp):
        ok = [c for c in range(1, seq_len // 2 + 1) if seq_len % (2 * c) == 0]
        raise ValueError(
            f"cp={cp}: the zig-zag split cuts each sequence into 2 x cp = {2 * cp} equal chunks, "
            f"but seq_len is {seq_len}: use cp in {ok}, or a seq_len that is a multiple of {2 * cp}"
        )
    if sequence_parallel and seq_len % tp:
        ok = [t for t in divisors(seq_len) if t > 1 and heads % t == 0]  # tp must divide the heads too
        raise ValueError(
            f"sequence_parallel=True splits each sequence over tp={tp} ranks, but seq_len is "
            f"{seq_len}: use tp in {ok[:8]}, or sequence_parallel=False"
        )
