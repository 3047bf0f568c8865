"""What crossed between ranks, read from the operating system: the kernel's TCP counters of the workers' sockets.

The dispatcher recorder (:mod:`simlib.grading.contracts`) sees every collective and message whatever Python name
the answer used, but it lives in the answer's process, where code can step around a dispatch mode. This meter does
not: the grader (another process) reads, before and after a run, every established TCP socket of the workers
(``ss -tie``: Linux's ``tcp_info``, ``bytes_sent`` and ``data_segs_out`` per socket), finds which worker owns each
end, and returns the bytes and segments each rank sent to each other rank during the run. Gloo's messages between
two ranks travel on such sockets (on one machine as on several), so no answer can send data to a rank without it
showing here, nor lower what shows. (Where ``ss`` is not to be had, :func:`available` is False and checks skip
the measure, saying so.)

Two readings: pair by pair (:func:`flow_breach`: a ring or a pipeline, where the answer picks the pairs), and bytes
per rank or over all ranks (:func:`beyond`: all-to-all, all-gather, reduce-scatter, broadcast, where Gloo picks the
pairs). The second compares the answer's run with the course's own implementation run just before on the same
instance and cluster: what that run sent beyond its payload is Gloo's framing, measured, not a constant. On Gloo a
reduce-scatter moves what an all-reduce of its input moves (it is run as one), so an all-reduce where a
reduce-scatter is due shows in the dispatcher's record (:mod:`.contracts`), not here.
"""

from __future__ import annotations

import re
import shutil
import subprocess

_SOCKET = re.compile(r"^\S+\s+\S+\s+(\S+)\s+(\S+)\s.*\bino:(\d+)")


def _inodes(pids) -> dict:
    """{socket inode: pid} of the sockets ``pids`` hold (their /proc/PID/fd links): cheaper than ``ss -p``, which
    reads every process's descriptors."""
    import os

    out = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    out[int(link[8:-1])] = int(pid)
        except OSError:
            continue
    return out


def available() -> bool:
    return shutil.which("ss") is not None


def snapshot(pids) -> dict:
    """{(local address, peer address): (pid, bytes sent, data segments sent)} for the sockets of ``pids``; the bytes
    sent once each (``bytes_sent`` less ``bytes_retrans``: a busy machine's retransmissions are not the answer's)."""
    owners = _inodes(pids)
    try:
        text = subprocess.run(
            ["ss", "-tieH", "state", "established"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out, lines = {}, text.splitlines()
    for head, info in zip(lines[::2], lines[1::2]):
        m = _SOCKET.match(head)
        pid = owners.get(int(m.group(3))) if m else None
        if pid is None:
            continue
        sent = re.search(r"bytes_sent:(\d+)", info)
        again = re.search(r"bytes_retrans:(\d+)", info)
        segs = re.search(r"data_segs_out:(\d+)", info)
        once = (int(sent.group(1)) if sent else 0) - (int(again.group(1)) if again else 0)
        out[(m.group(1), m.group(2))] = (pid, once, int(segs.group(1)) if segs else 0)
    return out


def between(before: dict, after: dict, pids) -> dict:
    """{(source rank, destination rank): [bytes, segments]} sent between two snapshots; ``pids`` in rank order.
    A socket's far end belongs to the worker that owns the socket whose local address is that end."""
    rank_of = {int(p): r for r, p in enumerate(pids)}
    owner = {local: pid for (local, _), (pid, _, _) in after.items()}
    pairs: dict = {}
    for (local, peer), (pid, sent, segs) in after.items():
        dst = owner.get(peer)
        if dst is None or dst == pid:
            continue  # not a socket between two workers (the grader's own channels, the store)
        old = before.get((local, peer), (pid, 0, 0))
        key = (rank_of[pid], rank_of[dst])
        moved = pairs.setdefault(key, [0, 0])
        moved[0] += sent - old[1]
        moved[1] += segs - old[2]
    return {k: v for k, v in pairs.items() if v[0] > 0}


def flow_breach(pairs: dict, need: dict, why: str) -> str:
    """The first way the bytes on the wire (``pairs``, from :func:`between`) break an algorithm's flows: ``need``
    is {(source rank, destination rank): the fewest bytes the algorithm sends there}; data to any other pair
    (beyond a small allowance for the run's own messages) or less than needed to a pair is a breach, said in words.
    ``why``: what travels on the needed pairs (e.g. "K/V blocks")."""
    for (src, dst), (sent, segs) in sorted(pairs.items()):
        own = max((b for (s, _), b in need.items() if s == src), default=0)
        if (src, dst) not in need and sent > 0.05 * own + 4096:
            allowed = sorted(d for s, d in need if s == src)
            return (
                f"rank {src} sent {sent:,} bytes in {segs} segments to rank {dst} on the wire; the {why} go from "
                f"rank {src} to rank(s) {allowed} only"
            )
    for (src, dst), want in sorted(need.items()):
        sent = pairs.get((src, dst), [0, 0])[0]
        if sent < want:
            return f"rank {src} sent {sent:,} bytes to rank {dst} on the wire; the {why} alone are {want:,}"
    return ""


def per_rank(pairs: dict, world_size: int) -> list:
    """Bytes each rank sent to all the others (from :func:`between`)."""
    return [sum(v[0] for (src, _), v in pairs.items() if src == r) for r in range(world_size)]


# A right answer may frame its messages otherwise than the course's reference (the counts by another collective, one
# call per tensor): it may put up to this many times the reference's framing on the wire, beyond the payload
FRAMING_ALLOWANCE = 4


def beyond(answer: list, reference: list, payload: list, what: str) -> str:
    """The first rank (in words) whose bytes on the wire exceed what the exercise's collectives must move, or "".

    ``reference``: bytes per rank the course's own implementation sent on the same instance and cluster (measured
    just before); ``payload``: the bytes per rank its collectives carry, by Gloo's algorithms (all-gather: the
    shard to each other rank; reduce-scatter: an all-reduce of the input, which is how Gloo runs it; all-to-all:
    the rows for the other ranks; broadcast: a binomial tree). What the reference sent beyond its payload is
    Gloo's framing (headers, counts, acknowledgements) on this instance; rank r may send its payload plus
    :data:`FRAMING_ALLOWANCE` times that framing. A list of one element compares totals over the ranks."""
    for r, (got, ref, need) in enumerate(zip(answer, reference, payload)):
        framing = max(ref - need, 0)
        bound = max(need, ref) + (FRAMING_ALLOWANCE - 1) * framing
        if got > bound:
            who = f"rank {r}" if len(answer) > 1 else "the ranks together"
            return (
                f"{who} sent {got:,} bytes on the wire (the kernel's TCP counters); {what} are {need:,} bytes "
                f"({ref:,} with Gloo's framing, as the course's implementation sent them on this instance; "
                f"allowed {bound:,})"
            )
    return ""
