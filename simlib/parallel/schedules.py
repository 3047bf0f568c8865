"""Pipeline schedules as data: pure functions that return each rank's ordered list of actions.

The format (stable: the executor in ``simlib.parallel.pipeline`` runs it for real, the simulator in
``simlib.sim.replay`` replays it on a cost model):

    schedule = one_f_one_b(num_stages=4, num_microbatches=8)
    schedule[rank]            # rank's actions, in the order that rank performs them
    schedule[rank][0]         # Action(op='forward', microbatch=0, chunk=0)

A schedule is a ``list`` with one entry per pipeline rank; entry ``r`` is a ``list`` of :class:`Action`.
``Action(op, microbatch, chunk=0)``, where ``op`` is one of :data:`OPS`:

    "forward"        run model chunk ``chunk`` of this rank forward on micro-batch ``microbatch``
    "backward"       backward of that forward (output gradient from the loss on the last stage, else received)
    "recv_forward"   receive the input activation of (microbatch, chunk) from the previous stage   (blocks)
    "send_forward"   send the output activation of (microbatch, chunk) to the next stage           (async)
    "recv_backward"  receive the gradient w.r.t. the output of (microbatch, chunk) from the next stage (blocks)
    "send_backward"  send the gradient w.r.t. the input of (microbatch, chunk) to the previous stage (async)

Stages: a rank holds ``num_chunks`` model chunks (1 unless interleaved). Chunk ``c`` of rank ``r`` is pipeline
stage ``s = c * num_ranks + r`` (Megatron's interleaving), so stage ``s`` sends forward to stage ``s + 1`` on rank
``(r + 1) % num_ranks``. The first stage has no ``recv_forward``/``send_backward``, the last no
``send_forward``/``recv_backward``. Every receive sits right before the compute that needs it and every send
right after the compute that produced it.

Execution rule: sends never block, receives wait until the matching send was posted. :func:`check` verifies a
schedule is complete and runs to the end under that rule (no deadlock), without any communication.

Sources: GPipe (Huang et al. 2019), 1F1B / PipeDream-Flush (Narayanan et al. 2021, "Efficient large-scale
language model training on GPU clusters using Megatron-LM", which also gives the interleaved schedule),
picotron's ``train_step_pipeline_afab`` / ``_1f1b``.
"""

from __future__ import annotations

from dataclasses import dataclass

OPS = ("forward", "backward", "recv_forward", "send_forward", "recv_backward", "send_backward")
COMPUTE_OPS = ("forward", "backward")


@dataclass(frozen=True)
class Action:
    """One step of one rank: ``op`` (see :data:`OPS`) on micro-batch ``microbatch`` of model chunk ``chunk``."""

    op: str
    microbatch: int
    chunk: int = 0

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"unknown op {self.op!r}: use one of {OPS}")

    def __repr__(self) -> str:  # short, so a printed schedule reads like a table
        c = f", c{self.chunk}" if self.chunk else ""
        return f"{self.op}({self.microbatch}{c})"


# ── building blocks ──────────────────────────────────────────────────────────────────────────────────────
def with_communication(rank: int, num_ranks: int, compute: list[tuple[str, int, int]], num_chunks: int = 1):
    """Expand a rank's compute order ``[(op, microbatch, chunk), ...]`` into actions with sends and receives.

    A forward of a stage that is not the first is preceded by ``recv_forward`` and, unless it is the last
    stage, followed by ``send_forward``; a backward mirrors that with ``recv_backward``/``send_backward``.
    """
    last_stage = num_ranks * num_chunks - 1
    actions: list[Action] = []
    for op, mb, chunk in compute:
        stage = chunk * num_ranks + rank
        if op == "forward":
            if stage > 0:
                actions.append(Action("recv_forward", mb, chunk))
            actions.append(Action("forward", mb, chunk))
            if stage < last_stage:
                actions.append(Action("send_forward", mb, chunk))
        elif op == "backward":
            if stage < last_stage:
                actions.append(Action("recv_backward", mb, chunk))
            actions.append(Action("backward", mb, chunk))
            if stage > 0:
                actions.append(Action("send_backward", mb, chunk))
        else:
            raise ValueError(f"compute order holds only forward/backward, got {op!r}")
    return actions


def _check_sizes(num_stages: int, num_microbatches: int) -> None:
    for name, value in (("num_stages", num_stages), ("num_microbatches", num_microbatches)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


# ── the schedules ────────────────────────────────────────────────────────────────────────────────────────
def gpipe(num_stages: int, num_microbatches: int) -> list[list[Action]]:
    """GPipe / all-forward-all-backward (AFAB): every micro-batch forward, then every backward (in reverse).

    Each rank holds the activations of all ``num_microbatches`` micro-batches at the peak.
    """
    _check_sizes(num_stages, num_microbatches)
    m = num_microbatches
    return [
        with_communication(
            r, num_stages, [("forward", i, 0) for i in range(m)] + [("backward", i, 0) for i in reversed(range(m))]
        )
        for r in range(num_stages)
    ]


afab = gpipe


def naive(num_stages: int) -> list[list[Action]]:
    """The naive layer split: one batch (one micro-batch) passes forward through all stages, then back."""
    return gpipe(num_stages, 1)


def one_f_one_b(num_stages: int, num_microbatches: int) -> list[list[Action]]:
    """1F1B (PipeDream-Flush): warm up with ``p - rank - 1`` forwards, then alternate one forward, one backward.

    Same bubble as GPipe, but rank ``r`` holds at most ``p - r`` micro-batches' activations instead of ``m``.
    """
    _check_sizes(num_stages, num_microbatches)
    p, m = num_stages, num_microbatches
    schedule = []
    for rank in range(p):
        warmup = min(p - rank - 1, m)
        order = [("forward", i, 0) for i in range(warmup)]
        for i in range(m - warmup):  # steady state: forward of i + warmup, backward of i
            order += [("forward", i + warmup, 0), ("backward", i, 0)]
        order += [("backward", i, 0) for i in range(m - warmup, m)]  # cool-down
        schedule.append(with_communication(rank, p, order))
    return schedule


def interleaved_1f1b(num_stages: int, num_microbatches: int, num_chunks: int = 2) -> list[list[Action]]:
    """Interleaved 1F1B (Narayanan et al. 2021, sec. 2.2): each rank holds ``num_chunks`` model chunks.

    ``num_stages`` counts ranks; the model has ``num_stages * num_chunks`` stages. Micro-batches go through
    the chunks in groups of ``num_stages`` (so ``num_microbatches`` must be a multiple of ``num_stages``).
    The bubble shrinks by ``num_chunks``, at the price of ``num_chunks`` times more messages.
    """
    _check_sizes(num_stages, num_microbatches)
    p, m, v = num_stages, num_microbatches, num_chunks
    if v < 1:
        raise ValueError(f"num_chunks must be >= 1, got {v}")
    if m % p:
        raise ValueError(f"interleaved 1F1B needs num_microbatches ({m}) to be a multiple of num_stages ({p})")
    if v == 1:
        return one_f_one_b(p, m)
    total = m * v  # forwards (and backwards) per rank

    def forward_of(k):  # k-th forward of a rank -> (microbatch, chunk), as Megatron's get_model_chunk_id
        group, within = divmod(k, p * v)
        return group * p + within % p, within // p

    def backward_of(k):  # backwards visit the chunks last-first
        mb, chunk = forward_of(k)
        return mb, v - 1 - chunk

    schedule = []
    for rank in range(p):
        warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
        order = [("forward", *forward_of(k)) for k in range(warmup)]
        for k in range(total - warmup):
            order += [("forward", *forward_of(k + warmup)), ("backward", *backward_of(k))]
        order += [("backward", *backward_of(k)) for k in range(total - warmup, total)]
        schedule.append(with_communication(rank, p, order, num_chunks=v))
    return schedule


SCHEDULES = {
    "naive": lambda p, m: naive(p),
    "gpipe": gpipe,
    "afab": gpipe,
    "1f1b": one_f_one_b,
    "interleaved_1f1b": interleaved_1f1b,
}


# ── reading a schedule ───────────────────────────────────────────────────────────────────────────────────
def num_chunks(schedule) -> int:
    return 1 + max(a.chunk for actions in schedule for a in actions)


def num_microbatches(schedule) -> int:
    return 1 + max(a.microbatch for actions in schedule for a in actions)


def compute_order(actions) -> list[Action]:
    """Only the forwards and backwards of one rank's actions."""
    return [a for a in actions if a.op in COMPUTE_OPS]


def peak_activations(schedule) -> list[int]:
    """Per rank, the most micro-batches whose forward is done and backward is not (activations in flight)."""
    peaks = []
    for actions in schedule:
        alive = peak = 0
        for a in actions:
            alive += (a.op == "forward") - (a.op == "backward")
            peak = max(peak, alive)
        peaks.append(peak)
    return peaks


def bubble_fraction(num_stages: int, num_microbatches: int, num_chunks: int = 1) -> float:
    """Idle share of a step with equal stages and no comm cost: (p - 1) / (v·m + p - 1)."""
    p, m, v = num_stages, num_microbatches, num_chunks
    return (p - 1) / (v * m + p - 1)


def check(schedule) -> None:
    """Raise ``ValueError`` unless ``schedule`` is complete and deadlock-free (sends async, receives block).

    Complete: every (micro-batch, stage) has exactly one forward and one backward, on the right rank, with
    the backward after the forward, each receive before the compute that uses it and each send after the
    compute that produced it, and every send matched by one receive.
    """
    p, v, m = len(schedule), num_chunks(schedule), num_microbatches(schedule)
    last = p * v - 1
    for rank, actions in enumerate(schedule):
        want = {(op, mb, c) for op in COMPUTE_OPS for mb in range(m) for c in range(v)}
        got = [(a.op, a.microbatch, a.chunk) for a in compute_order(actions)]
        if sorted(got) != sorted(want):
            missing, extra = want - set(got), [x for x in got if got.count(x) > 1 or x not in want]
            raise ValueError(
                f"rank {rank}: compute actions incomplete (missing {sorted(missing)[:4]}, "
                f"repeated/unknown {sorted(set(extra))[:4]})"
            )
    # Unit-time event simulation: repeatedly run every rank until it blocks on a receive.
    posted: set[tuple] = set()  # messages sent: (kind, microbatch, destination stage)
    done: set[tuple] = set()  # (op, microbatch, stage) computed
    received: set[tuple] = set()
    pos = [0] * p
    progress = True
    while progress:
        progress = False
        for rank, actions in enumerate(schedule):
            while pos[rank] < len(actions):
                a = actions[pos[rank]]
                stage = a.chunk * p + rank
                if a.op == "recv_forward":
                    key = ("act", a.microbatch, stage)
                    if stage == 0:
                        raise ValueError(f"rank {rank}: {a} on the first stage")
                    if key not in posted:
                        break
                    received.add(key)
                elif a.op == "recv_backward":
                    key = ("grad", a.microbatch, stage)
                    if stage == last:
                        raise ValueError(f"rank {rank}: {a} on the last stage")
                    if key not in posted:
                        break
                    received.add(key)
                elif a.op == "forward":
                    if stage > 0 and ("act", a.microbatch, stage) not in received:
                        raise ValueError(f"rank {rank}: {a} before its recv_forward")
                    done.add(("forward", a.microbatch, stage))
                elif a.op == "backward":
                    if ("forward", a.microbatch, stage) not in done:
                        raise ValueError(f"rank {rank}: {a} before its forward")
                    if stage < last and ("grad", a.microbatch, stage) not in received:
                        raise ValueError(f"rank {rank}: {a} before its recv_backward")
                    done.add(("backward", a.microbatch, stage))
                elif a.op == "send_forward":
                    if stage == last or ("forward", a.microbatch, stage) not in done:
                        raise ValueError(f"rank {rank}: {a} before its forward (or on the last stage)")
                    posted.add(("act", a.microbatch, stage + 1))
                elif a.op == "send_backward":
                    if stage == 0 or ("backward", a.microbatch, stage) not in done:
                        raise ValueError(f"rank {rank}: {a} before its backward (or on the first stage)")
                    posted.add(("grad", a.microbatch, stage - 1))
                pos[rank] += 1
                progress = True
    stuck = {r: schedule[r][pos[r]] for r in range(p) if pos[r] < len(schedule[r])}
    if stuck:
        raise ValueError(f"deadlock: ranks wait forever at {stuck}")
    if posted != received:
        raise ValueError(f"sends never received: {sorted(posted - received)[:4]}")


def format_schedule(schedule) -> str:
    """One line per rank with the compute order, F3 = forward of micro-batch 3, B3 = its backward."""
    lines = []
    for rank, actions in enumerate(schedule):
        cells = [
            f"{a.op[0].upper()}{a.microbatch}" + (f".{a.chunk}" if num_chunks(schedule) > 1 else "")
            for a in compute_order(actions)
        ]
        lines.append(f"rank {rank}: " + " ".join(cells))
    return "\n".join(lines)
