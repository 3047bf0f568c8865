"""The worker side of :mod:`simlib.launch`: one process per rank, started by the elastic agent.

A worker connects back to its caller, joins the process group, then runs the functions it is sent until it is
told to stop. Its stdout and stderr (at the file-descriptor level, so C++ logs too) go to the caller as whole
lines; it dies with its caller (``PR_SET_PDEATHSIG`` plus a watchdog), in a process group of its own.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Client

import cloudpickle

from . import env, hooks, plain

MARKER = "\x00simlib-flush\x00"  # written after a call's output: all before it has been relayed


def failure_fields(exc: BaseException) -> tuple:
    """An exception as (type name, message, traceback): exact strings, all the caller reads of a failure (it never
    unpickles an exception or an object of the worker's)."""
    import traceback

    def text(make):
        try:
            return plain.exact_str(make())
        except BaseException:  # noqa: BLE001 - an exception whose __str__ fails
            return "(its message could not be printed)"

    return (
        text(lambda: type(exc).__name__),
        text(lambda: str(exc)),
        text(lambda: "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))),
    )


class Channel:
    """A connection whose sends may come from several threads."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, msg) -> None:
        with self.lock:
            self.conn.send(msg)


class _FdRelay:
    """Sends what is written to an OS-level file descriptor to the caller, one whole line at a time."""

    def __init__(self, chan: Channel, rank: int, fd: int, stream: str):
        self.chan, self.rank, self.fd, self.stream = chan, rank, fd, stream
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        self.read_end = read_end
        self.flushed = threading.Event()
        threading.Thread(target=self._pump, daemon=True, name=f"simlib-relay-{stream}").start()

    def _pump(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self.read_end, 65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                line = raw.decode("utf-8", "replace")
                if line.endswith(MARKER):
                    line = line[: -len(MARKER)]
                    if line:
                        self._send(line)
                    self.flushed.set()
                else:
                    self._send(line)

    def _send(self, line: str) -> None:
        try:
            self.chan.send(("out", self.rank, self.stream, line))
        except OSError:
            pass

    def flush(self, timeout: float = 2.0) -> None:
        self.flushed.clear()
        os.write(self.fd, (MARKER + "\n").encode())
        self.flushed.wait(timeout)


def _die_with_parent() -> None:
    """Make the kernel kill this worker when the process that started it dies (Linux)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass
    parent = os.getppid()

    def watchdog():  # portable fallback: the parent changed, so it died
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watchdog, daemon=True, name="simlib-watchdog").start()


BOOTSTRAP = (
    "import json, sys; spec = json.load(open(sys.argv[1])); "
    "sys.path[:] = spec['path'] + [p for p in sys.path if p not in spec['path']]; "
    "from simlib.worker import main; main(spec)"
)
"""What each worker runs (``python -c BOOTSTRAP spec.json``): the elastic agent starts a command, as torchrun
does, so a worker never re-imports the caller's ``__main__`` (a script without the ``__main__`` guard, a script
on standard input and ``python -c`` all work). The caller's ``sys.path`` comes first, so functions that
cloudpickle sends by reference (a module next to the caller's script) import in the worker too."""


def main(spec: dict) -> None:
    """Command entry point: ``spec`` holds the caller's address, the connection key and the settings."""
    worker_main(tuple(spec["address"]), bytes.fromhex(spec["authkey"]), spec)


def worker_main(address, authkey: bytes, spec: dict) -> None:
    """Connect to the caller, join the process group, run what the caller sends until told to stop."""
    os.environ["SIMLIB_WORKER"] = "1"
    try:
        os.setpgrp()  # own process group (the agent already starts us in a new session; then this is a no-op)
    except OSError:
        pass
    _die_with_parent()
    rank = int(os.environ["RANK"])
    chan = Channel(Client(address, authkey=authkey))
    chan.send(
        (
            "hello",
            rank,
            os.getpid(),
            int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            int(os.environ.get("SIMLIB_LAUNCHER_PID", os.getpid())),
        )
    )  # the agent's child (simlib.zygote)
    relays = []
    if spec["relay_output"]:
        sys.stdout.flush()
        sys.stderr.flush()
        relays = [_FdRelay(chan, rank, 1, "stdout"), _FdRelay(chan, rank, 2, "stderr")]
        try:
            sys.stdout.reconfigure(line_buffering=True)
            sys.stderr.reconfigure(line_buffering=True)
        except AttributeError:
            pass

    def flush_output():
        sys.stdout.flush()
        sys.stderr.flush()
        for relay in relays:
            relay.flush()

    import torch

    torch.set_num_threads(spec["threads"])
    os.environ["OMP_NUM_THREADS"] = str(spec["threads"])
    if spec["loopback"] and sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    try:
        env.init(spec["backend"], timeout=spec["timeout"], device=spec["device"])
    except BaseException as exc:  # noqa: BLE001 - reported to the caller
        flush_output()
        chan.send(("fatal", rank, failure_fields(exc)))
        sys.exit(1)  # a failure for the agent too (exit code 0 would read as "finished", with no reason given)
    hangs = hooks.tool("hang_finder") if spec.get("collective_log") else None
    if hangs is not None:  # the hang finder (simlib.debug.hangs): each collective noted before it runs
        hangs.install(spec["collective_log"], rank)
    chan.send(("ready", rank))
    while True:
        try:
            msg = chan.conn.recv()
        except (EOFError, OSError):
            break
        if msg[0] == "stop":
            break
        _, call_id, payload, plain_only = msg
        if hangs is not None:
            hangs.new_call()
        try:
            fn, args, kwargs = cloudpickle.loads(payload)
            out = fn(*args, **kwargs)
            if plain_only:  # converted here, before anything is called on it; the caller reads it restricted
                data, ok = plain.dumps(out, rank), True
            else:
                try:
                    data, ok = cloudpickle.dumps(out), True
                except Exception as exc:  # noqa: BLE001
                    raise TypeError(f"the return value of rank {rank} could not be pickled: {exc}") from exc
        except BaseException as exc:  # noqa: BLE001 - reported to the caller, the loop goes on
            data, ok = failure_fields(exc), False
        flush_output()
        chan.send(("result", rank, call_id, ok, data))
    flush_output()
    env.shutdown()
