"""The GPU check's commands under a budget: each in a session of its own, killed with its children at its budget,
its output kept in a temporary file (so a killed command's last lines are still recorded)."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def missing(modules) -> list[str]:
    """The modules of ``modules`` this Python cannot import."""
    import importlib.util

    return [m for m in modules if importlib.util.find_spec(m) is None]


def install_hint(modules) -> str:
    names = {"sklearn": "scikit-learn"}
    return "pip install " + " ".join(names.get(m, m) for m in modules)


def start(cmd, env=None, cwd=ROOT):
    """A command in a session of its own (so a budget kills it and all its children), output to a temp file."""
    out = tempfile.TemporaryFile(mode="w+")
    path = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])  # this clone's simlib
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
    )
    return {"proc": proc, "out": out, "cmd": cmd, "t0": time.monotonic()}


def finish(job, budget: float, grace: float = 5.0) -> dict:
    """Wait for ``job`` until ``budget`` seconds after its start. Past it: SIGTERM to its session (a trainer
    writes what it has), then SIGKILL after ``grace`` seconds. A record of it."""
    proc = job["proc"]
    try:
        proc.wait(timeout=max(0.1, job["t0"] + budget - time.monotonic()))
        status = "passed" if proc.returncode == 0 else "failed"
        note = ""
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        proc.wait()
        status, note = "failed", f"killed at its budget of {budget:.0f} s\n"
    job["out"].seek(0)
    text = job["out"].read()
    job["out"].close()
    return {
        "status": status,
        "returncode": proc.returncode,
        "seconds": round(time.monotonic() - job["t0"], 1),
        "budget": budget,
        "command": " ".join(map(str, job["cmd"])),
        "output_tail": note + text[-4000:],
        "output": text,
    }


def run(cmd, budget: float, env=None) -> dict:
    record = finish(start(cmd, env), budget)
    record.pop("output")
    return record


def commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git clone)"
