"""The hang finder's reading half: every rank's collective log, where the sequences part, and the report.

:mod:`simlib.debug.hangs` records (each collective as one tab-separated line per rank, before it runs);
this module reads those lines back (:func:`read`), finds the first collective at which the ranks differ
(:func:`first_divergence`) and writes the few lines a failed call's error carries (:func:`diagnose`,
:func:`failure_report`), with where a silent rank is now (its Python stack, :mod:`simlib.debug.stacks`).
"""

from __future__ import annotations

import os
import re
import sys

from . import stacks

_P2P = {
    "send": "dst",
    "isend": "dst",
    "send_object_list": "dst",
    "recv": "src",
    "irecv": "src",
    "recv_object_list": "src",
}


_FIELDS = ("n", "op", "group", "seq", "shape", "dtype", "site", "user", "root", "async", "t")


def _as_dict(fields) -> dict:
    r = dict(zip(_FIELDS, fields))
    r["n"], r["seq"], r["t"] = int(r["n"]), int(r["seq"]), float(r["t"])
    for key in ("shape", "dtype", "user", "root"):
        if r[key] in ("", "None"):
            r[key] = None
    r["async"] = r["async"] == "True"
    root = r.pop("root")
    if root is not None:
        name, value = root.split("=", 1)
        r[name] = None if value == "None" else int(value)
    return r


def read(directory: str, world_size: int) -> dict[int, list[dict]]:
    """Every rank's log in ``directory`` (a rank with no file has an empty list; a half-written line is skipped)."""
    logs = {}
    for rank in range(world_size):
        records = []
        try:
            with open(os.path.join(directory, f"collectives-rank{rank}.tsv")) as f:
                for line in f:
                    fields = line.rstrip("\n").split("\t")
                    if line.endswith("\n") and len(fields) == len(_FIELDS):  # skip a half-written last line
                        records.append(_as_dict(fields))
        except OSError:
            pass
        logs[rank] = records
    return logs


def _signature(r: dict) -> tuple:
    """What must agree across the ranks of a group for the k-th collective to match."""
    return (r["op"], r["shape"], r["dtype"], r.get("src"), r.get("dst"))


def _where(site: str | None, resolve) -> str:
    if not site:
        return "an unknown place"
    filename, line, func = site.rsplit(":", 2)
    if resolve is not None:
        filename = resolve(filename, int(line), func)
    label = filename if filename.startswith("Cell In") else os.path.basename(filename)
    return f"{label}:{line} in {func}"


def describe_call(r: dict, resolve=None) -> str:
    """``all_reduce(shape [1024], float32) at train.py:88 in step``."""
    parts = []
    if r.get("shape") is not None:
        parts.append(f"shape {r['shape']}" if r["shape"].startswith("[") else r["shape"])
    if r.get("dtype"):
        parts.append(r["dtype"])
    for key in ("src", "dst"):
        if r.get(key) is not None:
            parts.append(f"{key} {r[key]}")
    text = f"{r['op']}({', '.join(parts)}) at {_where(r.get('site'), resolve)}"
    if r.get("user"):
        text += f" (called from {_where(r['user'], resolve)})"
    return text


def _members(group: str, world_size: int, logs) -> list[int]:
    if group == "WORLD":
        return list(range(world_size))
    if group.startswith("ranks "):
        return [int(x) for x in group[6:].split(",")]
    return sorted(r for r, recs in logs.items() if any(x["group"] == group for x in recs))


def first_divergence(logs: dict[int, list[dict]], world_size: int) -> dict | None:
    """The earliest collective (over every group) at which the ranks' sequences differ, or None.

    Returns ``{"group", "seq", "calls": {rank: record or None}, "behind": [ranks with no such call]}``.
    Point-to-point operations (``send``/``recv``) are matched per pair of ranks instead of per group.
    """
    found = []
    groups = sorted({r["group"] for recs in logs.values() for r in recs if r["op"] not in _P2P})
    for group in groups:
        members = _members(group, world_size, logs)
        seqs = {m: [r for r in logs.get(m, []) if r["group"] == group and r["op"] not in _P2P] for m in members}
        longest = max(len(s) for s in seqs.values())
        for k in range(longest):
            calls = {m: (s[k] if k < len(s) else None) for m, s in seqs.items()}
            present = [c for c in calls.values() if c is not None]
            if len(present) < len(calls) or len({_signature(c) for c in present}) > 1:
                found.append(
                    {
                        "group": group,
                        "seq": k,
                        "calls": calls,
                        "behind": [m for m, c in calls.items() if c is None],
                        "t": min(c["t"] for c in present),
                    }
                )
                break
    # point-to-point: the k-th send from a to b must meet the k-th recv on b from a
    sends, recvs = {}, {}
    for rank, recs in logs.items():
        for r in recs:
            if r["op"] in ("send", "isend") and r.get("dst") is not None:
                sends.setdefault((rank, r["dst"]), []).append((rank, r))
            elif r["op"] in ("recv", "irecv") and r.get("src") is not None:
                recvs.setdefault((r["src"], rank), []).append((rank, r))
    for pair in sorted(set(sends) | set(recvs)):
        s, v = sends.get(pair, []), recvs.get(pair, [])
        for k in range(max(len(s), len(v))):
            a, b = (s[k] if k < len(s) else None), (v[k] if k < len(v) else None)
            if a is None or b is None or (a[1]["shape"], a[1]["dtype"]) != (b[1]["shape"], b[1]["dtype"]):
                calls = {pair[0]: a[1] if a else None, pair[1]: b[1] if b else None}
                found.append(
                    {
                        "group": f"send/recv {pair[0]}->{pair[1]}",
                        "seq": k,
                        "calls": calls,
                        "behind": [m for m, c in calls.items() if c is None],
                        "t": min(c["t"] for c in calls.values() if c is not None),
                    }
                )
                break
    if not found:
        return None

    # A rank that never made a call may be stuck in another divergent call (a subgroup's all_reduce with another
    # shape keeps it from the next barrier on WORLD): that divergence is the cause, the other its consequence,
    # whichever began first on the clock.
    def stuck_elsewhere(d):
        if not d["behind"]:
            return False
        others = [o for o in found if o is not d]
        for m in d["behind"]:
            last = logs.get(m, [])[-1:] or [None]
            if not any(last[0] is not None and o["calls"].get(m) is last[0] for o in others):
                return False
        return True

    causes = [d for d in found if not stuck_elsewhere(d)] or found
    return min(causes, key=lambda d: d["t"])


def diagnose(logs: dict[int, list[dict]], world_size: int, status: dict[int, str] | None = None, resolve=None) -> str:
    """A few lines: the first collective where the ranks' sequences differ, who is behind, where each rank is.

    ``status`` says what became of each rank ("returned", "failed: ...", "still running"); ``resolve(filename,
    line, function)`` turns a worker's file name (``<dynamic-code>`` for a function sent from a notebook) into
    the learner's (``Cell In[3]``).
    """
    status = status or {}
    lines = []
    d = first_divergence(logs, world_size)
    if d is not None:
        present = {m: c for m, c in d["calls"].items() if c is not None}
        sigs = {}
        for m, c in present.items():
            sigs.setdefault(_signature(c), []).append(m)
        head = f"hang finder: the ranks' collectives part at call #{d['seq']} on group {d['group']}: "
        if d["behind"]:
            # the ranks that made the call wait in it; the others never got there
            waiting = "; ".join(f"rank {m} called {describe_call(c, resolve)}" for m, c in sorted(present.items()))
            behind = []
            for m in d["behind"]:
                last = (
                    [r for r in logs.get(m, []) if r["group"] == d["group"]]
                    if not d["group"].startswith("send")
                    else logs.get(m, [])
                )
                was = f"its last there was {describe_call(last[-1], resolve)}" if last else "it made none there"
                state = status.get(m)
                behind.append(f"rank {m} never called it ({was}" + (f"; then it {state}" if state else "") + ")")
            lines.append(head + waiting + "; " + "; ".join(behind) + ".")
            lines.append(
                f"Rank(s) {d['behind']} died before it: the others' errors follow from that."
                if all(status.get(m, "").startswith("died") for m in d["behind"])
                else f"Rank(s) {d['behind']} behind: look "
                "at what they did instead of that call (a condition on the rank, an early return, a different "
                "number of steps or buckets)."
            )
        else:
            parts = [
                f"rank{'s' if len(ms) > 1 else ''} {','.join(map(str, ms))} "
                f"{'are' if len(ms) > 1 else 'is'} in {describe_call(present[ms[0]], resolve)}"
                for ms in sigs.values()
            ]
            lines.append(head + "; ".join(parts) + ".")
            lines.append(
                "Every rank must call the same collectives, in the same order, with the same shapes and "
                "dtypes (and the same root)."
            )
    else:
        counts = {r: len(recs) for r, recs in logs.items()}
        lines.append(f"hang finder: the ranks' collectives agree as far as each got ({counts} calls by rank).")
    for rank in range(world_size):
        recs = logs.get(rank, [])
        where = f"last collective #{len(recs) - 1}: {describe_call(recs[-1], resolve)}" if recs else "no collective"
        state = status.get(rank, "")
        lines.append(f"  rank {rank}: {where}" + (f"; {state}" if state else ""))
    return "\n".join(lines)


def report(directory: str, world_size: int, status=None, resolve=None, only_if_divergent: bool = False):
    """:func:`diagnose` on the logs in ``directory``; None when there are none (or, with ``only_if_divergent``,
    when the sequences agree)."""
    logs = read(directory, world_size)
    if not any(logs.values()):
        return None
    if only_if_divergent and first_divergence(logs, world_size) is None:
        return None
    return diagnose(logs, world_size, status, resolve)


def resolver(fn):
    """``resolve(filename, line, function)`` for :func:`diagnose`: code that cloudpickle sent by value runs as
    ``<dynamic-code>`` in the workers; find its real file (a notebook cell, a script) among ``fn``'s code."""
    from ..errors import cell_name, code_objects

    codes = {}
    for code in code_objects(fn) if fn is not None else ():
        codes.setdefault(code.co_name, []).append(code)

    def resolve(filename, line, func):
        if filename == "<dynamic-code>":
            for code in codes.get(func, []):
                lines = [ln for _, _, ln in code.co_lines() if ln is not None]
                if lines and min(lines) <= line <= max(lines):
                    filename = code.co_filename
                    break
        return cell_name(filename) or filename

    return resolve


def failure_report(directory, world_size, results, failures, pending, timed_out, fn=None, pids=None):
    """What :class:`simlib.Cluster` adds to a failed call's error: the report after a timeout; after another
    failure only when the ranks' collectives differ (a mismatch that Gloo reported as an error, not a hang).

    ``pids`` (rank -> process id of the ranks still running, called before they are stopped): each is asked for
    its Python stack, and the report says where it is now (``was still running at hang.py:8 in stuck``)."""
    if not directory:
        return None
    resolve = resolver(fn)
    status = {r: "returned from the function" for r in results}
    for r, f in failures.items():
        if f.type_name == "Timeout":
            status[r] = "was still running at the call's time limit"
        elif f.type_name == "WorkerDied":
            status[r] = f"died ({f.message})"
        else:
            why = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] ", "", f.summary().split(": ", 1)[1])  # Gloo's file:line
            status[r] = "failed: " + (why.split(". ")[0] if len(why) > 100 else why)
    for r in pending:
        site = stacks.where(stacks.take((pids or {}).get(r), os.path.join(directory, f"stack-rank{r}.txt")))
        status[r] = f"was still running at {_where(site, resolve)} (stopped)" if site else "was still running (stopped)"
    try:
        return report(directory, world_size, status, resolve, only_if_divergent=not timed_out)
    except Exception as exc:  # noqa: BLE001 - the report must never hide the error it explains
        return f"hang finder: could not read the collective logs ({type(exc).__name__}: {exc})"


def main(argv=None) -> int:
    """``python -m simlib.debug.hangs DIRECTORY [WORLD_SIZE]``: the report from the logs of a hung run."""
    import glob

    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(main.__doc__)
        return 2
    directory = argv[0]
    world = int(argv[1]) if len(argv) > 1 else len(glob.glob(os.path.join(directory, "collectives-rank*.tsv")))
    text = report(directory, world)
    print(text or f"no collective logs in {directory}")
    return 0
