"""What crossed between ranks, read from the operating system: the kernel's TCP counters of the workers' sockets.

The dispatcher recorder (:mod:`simlib.grading.contracts`) sees every collective and message whatever Python name
the answer used, but it lives in the answer's process, where code can step around a dispatch mode. This meter does
not: the grader (another process) reads, before and after a run, every established TCP socket of the workers
(``ss -tie``: Linux's ``tcp_info``, ``bytes_sent`` and ``data_segs_out`` per socket), finds which worker owns each
end, and returns the bytes and segments each rank sent to each other rank during the run. Gloo's messages between
two ranks travel on such sockets (on one machine as on several), so no answer can send data to a rank without it
showing here, nor lower what shows. (Where ``ss`` is not to be had, :func:`available` is False and checks skip
the measure, saying so.)
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
    """{(local address, peer address): (pid, bytes sent, data segments sent)} for the sockets of ``pids``."""
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
        segs = re.search(r"data_segs_out:(\d+)", info)
        out[(m.group(1), m.group(2))] = (pid, int(sent.group(1)) if sent else 0, int(segs.group(1)) if segs else 0)
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
