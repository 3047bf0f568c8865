"""The process torch's elastic agent starts for a CPU worker (``python -I -S launcher.py spec.json``): it asks
the caller's zygote (:mod:`simlib.zygote`) to fork the worker with this process's streams, environment and
working directory, passes on the signals the agent sends, and exits as the worker did. It imports nothing but
the standard library (not simlib, not torch: that is the point). If the zygote cannot be reached it runs the
worker itself, as ``python -c BOOTSTRAP`` always did.
"""

import json
import os
import signal
import socket
import struct
import sys
import time

HEADER = struct.Struct("!I")  # as simlib.zygote's wire format: a 4-byte length, then JSON


def _die_with_parent() -> None:
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _send(sock, obj, fds) -> None:
    data = json.dumps(obj).encode()
    socket.send_fds(sock, [HEADER.pack(len(data)) + data], fds)


def _recv(sock) -> dict:
    def exact(n):
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise EOFError("the zygote closed the connection")
            buf += chunk
        return buf

    (n,) = HEADER.unpack(exact(HEADER.size))
    return json.loads(exact(n))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except OSError:
        return True


def _connect(zygote: dict, wait: float = 120.0):
    """A connection to the zygote; it may still be importing (its socket appears when it is ready)."""
    deadline = time.monotonic() + wait
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(zygote["path"])
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if not _alive(zygote["pid"]) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def main(spec_file: str) -> None:
    _die_with_parent()
    with open(spec_file) as f:
        spec = json.load(f)
    for fd in (0, 1, 2):  # a stream that is not open is /dev/null for the worker, as for a fresh process
        try:
            os.fstat(fd)
        except OSError:
            os.dup2(os.open(os.devnull, os.O_RDWR), fd)
    try:
        sock = _connect(spec["zygote"])
        _send(
            sock,
            {
                "token": spec["zygote"]["token"],
                "env": dict(os.environ),
                "cwd": os.getcwd(),
                "args": [spec_file],
                "pid": os.getpid(),
            },
            [0, 1, 2],
        )
        worker = _recv(sock)["pid"]
    except (OSError, EOFError, ValueError, KeyError):  # no zygote: run the worker here, as it always ran
        os.execv(sys.executable, [sys.executable, "-c", spec["bootstrap"], spec_file])

    def forward(signum, frame):
        try:
            os.kill(worker, signum)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, forward)
    try:
        status = _recv(sock)
    except (OSError, EOFError, ValueError):  # the zygote died (killed, or out of memory): so did the worker,
        print(
            "simlib: the process this worker was forked from (simlib.zygote) was killed, and the worker with it",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGKILL)  # by the SIGKILL its parent's death sends it (PR_SET_PDEATHSIG)
    if "signal" in status:  # die as the worker died, so the agent reports the same signal
        sig = status["signal"]
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be caught: no handler to reset
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1.0)
        os._exit(128 + sig)
    os._exit(status["exit"])


if __name__ == "__main__":
    main(sys.argv[1])
