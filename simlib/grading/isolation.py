"""A submission's processes, kept apart and ended: a cgroup of its own where one can be made (every process it
starts is born there, whatever it does to its session or environment), the token every one of them carries in its
environment, the kill of its cgroup, its session and every tagged process, and the optional ``unshare`` sandbox
(no network, the course read-only, the submitted folders hidden). Used by :mod:`simlib.grading.batch`, which re-exports ``sandbox_available``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_TOKEN = "SIMLIB_GRADE_SUBMISSION"


def _tagged(token: str) -> list[int]:
    """Pids of the processes whose environment carries ``token`` (the submission's: kernels, workers, strays)."""
    found, needle = [], f"{_TOKEN}={token}".encode()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _kill_tagged(token: str) -> list[int]:
    """SIGKILL every process tagged with ``token`` (:func:`_tagged`); returns their pids."""
    pids = _tagged(token)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return pids


_CGROUP = "SIMLIB_GRADE_CGROUP"
_HIERARCHIES = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup/pids", "/sys/fs/cgroup")  # cgroup v2, v1 "pids", either


def new_cgroup(token: str) -> Path | None:
    """A control group of the submission's own, where this user may make one (root; no systemd needed): every
    process the submission starts is born in it, whatever its session, process group or environment (a cleared
    environment loses the token), so :func:`kill_cgroup` finds them all. None where no hierarchy is writable."""
    for base in map(Path, _HIERARCHIES):
        if not (base / "cgroup.procs").is_file():
            continue
        path = base / f"simlib-grade-{token}"
        try:
            path.mkdir()
        except OSError:
            continue
        if (path / "cgroup.procs").is_file():
            return path
        remove_cgroup(path)
    return None


def join_cgroup(path) -> None:
    """Move this process into ``path`` (run in the child between fork and exec: all it starts is born there).
    Where that fails (the group was removed meanwhile), the token and the session still find its processes."""
    try:
        with open(Path(path) / "cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        pass


def _members(path: Path) -> list[int]:
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def kill_cgroup(path, spare: int | None = None) -> list[int]:
    """SIGKILL every process in the cgroup ``path`` (but ``spare``), again until none is left (a fork between
    the read and the kill is caught by the next round); returns their pids."""
    path, killed = Path(path), []
    for _ in range(100):
        pids = [p for p in _members(path) if p != spare]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        killed += pids
        time.sleep(0.02)
    return killed


def remove_cgroup(path) -> None:
    try:
        Path(path).rmdir()
    except OSError:
        pass


def remove_stale_cgroups() -> None:
    """Empty submission cgroups left by a grader that was killed (its children ended, their group stayed)."""
    for base in map(Path, _HIERARCHIES):
        for path in base.glob("simlib-grade-*") if base.is_dir() else ():
            if not _members(path):
                remove_cgroup(path)


def _kill_submission(child, token: str, cgroup=None) -> None:
    """Kill every process of the submission: its cgroup's members (where it has one: nothing escapes it), the
    child's session and process group, and every process tagged with the submission's token."""
    for _ in range(3):
        pids = kill_cgroup(cgroup) if cgroup else []
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass
        pids += _kill_tagged(token)
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if not pids:
            return
        time.sleep(0.2)


def die_with_parent(parent: int) -> None:
    """In a child, between fork and exec (``preexec_fn``): the kernel kills it the moment ``parent`` dies
    (Linux ``PR_SET_PDEATHSIG``), so a grader killed while its child is still starting leaves no child behind
    (issue 51: the clean-up raced the child's start). The child hands over to :func:`end_with_parent`, which
    also ends the child's own children, once it runs. A no-op where prctl is not to be had."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _stop_dying_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def end_with_parent(parent: int, interval: float = 1.0) -> None:
    """In a grading child: when the grader ``parent`` dies (killed, or its terminal closed), kill this
    submission's processes (this process group and every process tagged with its token) and exit, instead of
    running on, orphaned, until the submission's own timeout. A daemon thread polls the parent's pid."""
    import threading

    token = os.environ.get(_TOKEN, "")

    def watch():
        first = True
        while True:
            if not first:
                time.sleep(interval)
            first = False
            try:
                os.kill(parent, 0)
                continue
            except ProcessLookupError:
                pass
            except PermissionError:  # alive, not ours to signal
                continue
            if os.environ.get(_CGROUP):
                kill_cgroup(os.environ[_CGROUP], spare=os.getpid())
            if token:
                _kill_tagged(token)
            try:
                os.killpg(os.getpgid(0), signal.SIGKILL)
            finally:
                os._exit(1)

    threading.Thread(target=watch, name="simlib-grade-parent-watch", daemon=True).start()
    _stop_dying_with_parent()  # from here on the watch ends the child's children too (a SIGKILL would not)


def sandbox_available() -> bool:
    """Whether ``sandbox="unshare"`` works here (user, mount and network namespaces)."""
    import shutil

    if not shutil.which("unshare") or not shutil.which("ip"):
        return False
    try:
        return (
            subprocess.run(["unshare", "-r", "-n", "-m", "--fork", "true"], capture_output=True, timeout=20).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def _sandboxed(command: list[str], hide: list[Path], workdir: Path, root: Path) -> list[str]:
    """``command`` inside new user, mount and network namespaces: loopback only, the course read-only, the
    submitted folders hidden (unless the working directory lies inside one)."""
    import shlex

    root = root.resolve()
    steps = [
        "ip link set lo up",
        f"mount --bind {shlex.quote(str(root))} {shlex.quote(str(root))}",
        f"mount -o remount,bind,ro {shlex.quote(str(root))}",
    ]
    for folder in hide:
        folder = folder.resolve()
        if (
            folder != root
            and folder not in workdir.resolve().parents
            and folder != workdir.resolve()
            and root not in folder.parents
        ):
            steps.append(f"mount -t tmpfs -o size=1m none {shlex.quote(str(folder))}")
    steps.append("exec " + " ".join(shlex.quote(c) for c in command))
    return ["unshare", "-r", "-n", "-m", "--fork", "sh", "-c", " && ".join(steps)]


def _mac(key: bytes, text) -> str:
    """The signature of a grading child's rows (HMAC-SHA256 with the key its grader gave it)."""
    import hashlib
    import hmac

    return hmac.new(key, str(text).encode(), hashlib.sha256).hexdigest()


def _not_dumpable() -> None:
    """Linux: no process of the same (non-root) user may read this one's memory, file descriptors or environment
    through /proc or ptrace (``PR_SET_DUMPABLE`` 0); the kernel it starts is dumpable again (execve resets it)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
        except (OSError, AttributeError):
            pass
