"""A fork server for CPU workers: torch imported once per calling process, each worker forked from it.

Starting a worker costs about 1.3 s of CPU here, nearly all of it ``import torch``; a notebook, a test session
or the grader starts hundreds. The elastic agent (torch's, the engine of ``torchrun``) still starts one process
per rank, as before; on Linux, for CPU workers, that process is now a thin *launcher* (``launcher.py`` beside
this file, run as a script, so it imports neither torch nor simlib): it hands its standard streams, environment
and working directory to this process's *zygote* — a fresh ``python`` started once, which imported torch,
NumPy, cloudpickle and the worker's module and then waits — and the zygote forks the worker.

What the agent and the Cluster see does not change:
- the worker runs with the launcher's environment (``RANK``, ``MASTER_PORT``, ... and the caller's variables),
  its working directory and its stdin/stdout/stderr, in a session of its own; Python's, NumPy's and torch's
  global random generators are seeded from the OS, as a fresh process's are;
- the launcher's exit is the worker's: the same exit code, or death by the same signal; a SIGTERM, SIGINT or
  SIGHUP the agent sends the launcher is passed on to the worker; a launcher that is killed takes its worker with
  it (the worker holds the launcher's connection and kills itself when it closes);
- the worker dies with the zygote, and the zygote with the process that started it (``PR_SET_PDEATHSIG`` from
  a thread that lives as long as the process, and a watchdog).

Used only where it is safe: Linux, the Gloo backend on the CPU, ``SIMLIB_ZYGOTE`` not ``0``. A zygote imported
its modules with the environment, ``sys.path`` and working directory it was started with; a cluster started
after any of those changed gets a new zygote (the old one ends when its last worker has). If the zygote cannot
be reached, the launcher runs the worker itself (as before: slower, not different).
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.py")
PRELOAD = ("torch", "torch.distributed", "numpy", "cloudpickle", "simlib.worker", "simlib.env")
# imported one at a time while no launcher waits (a worker that needs them then finds them: ~1.2 s of CPU each)
IDLE_PRELOAD = ("simlib.train", "torch.distributed.pipelining", "torch.distributed.fsdp", "torch.nn.parallel")
# not part of what a zygote imported with: pytest's changes with every test; the elastic agent sets its own
# TORCHELASTIC_* in the caller when it starts (and passes them on); nothing reads either at import
VOLATILE = ("PYTEST_CURRENT_TEST", "TORCHELASTIC_")
_HEADER = struct.Struct("!I")

_lock = threading.Lock()
_current = None  # the _Zygote new workers fork from
_zygotes: list = []  # every zygote this process started (retired ones end with their last worker)


def enabled(backend: str, device: str) -> bool:
    """Whether a cluster with this backend and device starts its workers from a zygote."""
    return (
        sys.platform.startswith("linux")
        and hasattr(socket, "send_fds")
        and backend == "gloo"
        and str(device) in ("auto", "cpu")
        and os.environ.get("SIMLIB_ZYGOTE", "1") != "0"
    )


def _key() -> tuple:
    env = tuple(sorted((k, v) for k, v in os.environ.items() if not k.startswith(VOLATILE)))
    return sys.executable, tuple(p for p in sys.path if isinstance(p, str)), os.getcwd(), env


class _Zygote:
    def __init__(self, key: tuple):
        self.key = key
        self.dir = tempfile.mkdtemp(prefix=f"simlib-{os.getpid()}-zygote-")  # mode 0700: ours alone
        self.path = os.path.join(self.dir, "socket")
        self.token = secrets.token_hex(16)
        self.proc = None
        started = threading.Event()

        def keeper():  # the zygote's parent thread lives as long as this process: PDEATHSIG fires at its end
            try:
                self.proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        "import sys; from simlib.zygote import serve; serve(*sys.argv[1:])",
                        self.path,
                        self.token,
                        str(os.getpid()),
                        json.dumps(list(key[1])),
                    ],
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    close_fds=True,
                )
            finally:
                started.set()
            self.proc.wait()

        threading.Thread(target=keeper, daemon=True, name="simlib-zygote").start()
        started.wait()

    def retire(self) -> None:
        """No new workers from this zygote; it ends when its last worker has."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(5)
                s.connect(self.path)
                _send(s, {"token": self.token, "retire": True})
        except OSError:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()


def running() -> bool:
    """Whether a zygote for this process as it is now (environment, sys.path, cwd) is already there."""
    z = _current
    return z is not None and z.key == _key() and z.proc is not None and z.proc.poll() is None


def address() -> dict:
    """The zygote workers started now fork from (started, or replaced, here): ``{"path", "token", "pid"}``."""
    global _current
    key = _key()
    with _lock:
        z = _current
        if z is not None and (z.key != key or z.proc is None or z.proc.poll() is not None):
            if z.proc is not None and z.proc.poll() is None:
                z.retire()
            z = _current = None
        if z is None:
            if not _zygotes:
                atexit.register(_stop_all)
            z = _current = _Zygote(key)
            _zygotes.append(z)
        return {"path": z.path, "token": z.token, "pid": z.proc.pid}


def _stop_all() -> None:
    """At exit: end every zygote and reap it (its CPU time is then counted as this process's children's)."""
    stop()
    for z in _zygotes:
        if z.proc is not None and z.proc.poll() is None:
            z.proc.kill()
            z.proc.wait()


def stop() -> None:
    """End the zygote (its running workers end with it); the next cluster starts a new one."""
    global _current
    with _lock:
        z, _current = _current, None
    if z is not None and z.proc is not None and z.proc.poll() is None:
        z.proc.kill()
        z.proc.wait()


# ── wire format (shared with launcher.py, which repeats these few lines: it imports nothing of simlib) ──
def _send(sock, obj, fds=()) -> None:
    data = json.dumps(obj).encode()
    if fds:
        socket.send_fds(sock, [_HEADER.pack(len(data)) + data], list(fds))
    else:
        sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock, n: int, first: bytes = b"") -> bytes:
    buf = first
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return buf


def _recv(sock, maxfds: int = 0):
    """One message (and the file descriptors sent with it); reads exactly its bytes, nothing of the next one."""
    if maxfds:
        head, fds, _, _ = socket.recv_fds(sock, _HEADER.size, maxfds)
    else:
        head, fds = sock.recv(_HEADER.size), []
    if not head:
        raise EOFError("connection closed")
    (n,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, head))
    return json.loads(_recv_exact(sock, n)), fds


# ── the zygote process ──
def _die_with(parent: int) -> None:
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent:
        os._exit(1)


def serve(path: str, token: str, parent: str, sys_path: str) -> None:
    """The zygote's main loop: import, then fork a worker for each launcher that connects (single-threaded in
    Python: nothing but this loop runs here when it forks)."""
    import importlib
    import select
    import warnings

    parent = int(parent)
    _die_with(parent)
    sys.path[:] = json.loads(sys_path) + [p for p in sys.path if p not in json.loads(sys_path)]
    warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
    for name in PRELOAD:
        importlib.import_module(name)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    children, retiring, idle = {}, False, list(IDLE_PRELOAD)
    while True:
        ready, _, _ = select.select([server] if not retiring else [], [], [], 0 if idle else 0.05 if children else 0.5)
        if os.getppid() != parent:
            os._exit(1)
        if not ready and idle:
            try:
                importlib.import_module(idle.pop(0))
            except Exception:  # noqa: BLE001 - only a head start: a worker imports what it needs itself
                pass
        if ready:
            conn, _ = server.accept()
            try:
                conn.settimeout(10)
                request, fds = _recv(conn, maxfds=3)
                conn.settimeout(None)
                if request.get("token") != token:
                    raise ValueError("wrong token")
            except (OSError, EOFError, ValueError):
                conn.close()
                continue
            if request.get("retire"):
                retiring = True
                server.close()
                conn.close()
            else:
                pid = os.fork()
                if pid == 0:
                    server.close()
                    for other in children.values():
                        other.close()
                    _worker(conn, fds, request)  # never returns
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                try:
                    _send(conn, {"pid": pid})
                except OSError:
                    pass
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                try:
                    _send(
                        conn,
                        {"signal": os.WTERMSIG(status)}
                        if os.WIFSIGNALED(status)
                        else {"exit": os.waitstatus_to_exitcode(status)},
                    )
                except OSError:
                    pass
                conn.close()
        if retiring and not children:
            os._exit(0)


def _worker(conn, fds, request) -> None:
    """In the forked child: become the launcher's worker, run it, exit with its status."""
    import atexit
    import traceback

    code = 1
    try:
        os.setsid()
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ["SIMLIB_LAUNCHER_PID"] = str(request["pid"])  # the agent's child: its exit is this worker's
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # a fresh process seeds its generators from the OS; a fork would share the zygote's (Python's random
        # reseeds itself at a fork; NumPy's and torch's default generators do not)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        if "torch" in sys.modules:
            sys.modules["torch"].seed()
        sys.argv = ["-c", *request["args"]]

        def launcher_gone():  # the launcher holds the other end: it closes when the launcher dies
            try:
                while conn.recv(1 << 12):
                    pass
            except OSError:
                pass
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=launcher_gone, daemon=True, name="simlib-launcher-watch").start()
        spec = json.load(open(request["args"][0]))
        sys.path[:] = spec["path"] + [p for p in sys.path if p not in spec["path"]]
        from simlib.worker import main

        main(spec)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback on stderr, exit code 1
        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
