"""A submission graded in a child process of its own (``python -m simlib.grading.batch --one``): its session,
cgroup and token, the key that signs its rows, and the kill of every process of it at the end
(:func:`grade_in_child`). Used by :mod:`simlib.grading.batch`."""

from __future__ import annotations

import hmac
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .class_report import FIELDS
from .isolation import (
    _CGROUP,
    _TOKEN,
    _kill_submission,
    _mac,
    _sandboxed,
    join_cgroup,
    new_cgroup,
    remove_cgroup,
)
from .notebook_run import Row, _course_root


def _child_start(cgroup, parent: int):
    """What a grading child does between fork and exec: join the submission's cgroup, die with the grader."""
    from .isolation import die_with_parent

    def start():
        if cgroup:
            join_cgroup(cgroup)
        die_with_parent(parent)

    return start


def grade_in_child(
    path: Path, timeout: float, check_timeout: float, solutions, kernel_name: str, sandbox: str | None = None, hide=()
) -> list[Row]:
    """Grade one submission in a fresh child process (own session, own working directory holding only a copy
    of the notebook); read back plain JSON rows; kill every process of the submission at the end."""
    name = str(path)
    token = secrets.token_hex(12)
    cgroup = new_cgroup(token)  # every process of the submission is born in it (None: none can be made here)
    work = Path(tempfile.mkdtemp(prefix="simlib-grade-"))
    try:
        copy = work / path.name
        try:
            copy.write_bytes(path.read_bytes())
        except OSError as exc:
            return [Row(name, "?", "run", "the submission can be read", False, "error", detail=str(exc))]
        out = work / f"rows-{token}.json"
        command = [
            sys.executable,
            "-m",
            "simlib.grading.batch",
            "--one",
            str(copy),
            "--name",
            name,
            "--rows",
            str(out),
            "--timeout",
            str(timeout),
            "--check-timeout",
            str(check_timeout),
            "--kernel",
            kernel_name,
            "--parent",
            str(os.getpid()),
        ]
        command += ["--solutions", str(solutions)] if solutions else []
        if sandbox == "unshare":
            command = _sandboxed(command, list(hide), work, _course_root())
        elif sandbox:
            raise ValueError(f"unknown sandbox {sandbox!r}: use 'unshare' or none")
        env = {**os.environ, _TOKEN: token, **({_CGROUP: str(cgroup)} if cgroup else {})}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_course_root()), env.get("PYTHONPATH", "")) if p)
        # the notebook's run, its export and every check, with room for kernel start-up and worker launches
        limit = timeout + 180 + 20 * check_timeout
        key = secrets.token_bytes(32)  # signs the child's rows: given on its stdin, read before the kernel starts
        t0 = time.monotonic()
        child = subprocess.Popen(
            command,
            cwd=work,
            env=env,
            start_new_session=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_child_start(cgroup, os.getpid()),
        )
        try:
            log, _ = child.communicate(input=key.hex().encode() + b"\n", timeout=limit)
        except subprocess.TimeoutExpired:
            _kill_submission(child, token, cgroup)
            log = b""
            return [
                Row(
                    name,
                    "?",
                    "run",
                    f"grading finished within {limit:g} s",
                    False,
                    "timeout",
                    detail="the submission's grading process was stopped",
                    seconds=time.monotonic() - t0,
                )
            ]
        finally:
            _kill_submission(child, token, cgroup)
        try:
            signed = json.loads(out.read_text())
            mac = _mac(key, signed.get("rows")) if type(signed) is dict else None
            if mac is None or not hmac.compare_digest(str(signed.get("mac")), mac):
                raise ValueError("rows not signed by the grading process (written by the submission?)")
            rows = [Row(**{k: r[k] for k in FIELDS}) for r in json.loads(signed["rows"])]
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            tail = log.decode(errors="replace").strip().splitlines()[-3:]
            return [
                Row(
                    name,
                    "?",
                    "run",
                    "the grading process reported its rows",
                    False,
                    "error",
                    hint="the submission's code ended the process that grades it or wrote rows for itself "
                    "(or the grader failed)",
                    detail=(f"exit {child.returncode}; {type(exc).__name__}: {exc}; " + " | ".join(tail))[:500],
                    seconds=round(time.monotonic() - t0, 3),
                )
            ]
        return rows
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
        if cgroup:
            remove_cgroup(cgroup)
