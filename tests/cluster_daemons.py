"""A real one-node SLURM for the tests: munged, slurmctld and slurmd with their own config in a temp dir.

    with SlurmCluster(tmp_path) as slurm:          # raises SlurmUnavailable (a reason) if it cannot start
        slurm.run(["srun", "-n", "2", "hostname"])

Nothing outside the temp dir is touched: munged gets its own key and socket, the daemons their own ports, pid
files, spool, state and logs. Every daemon started is stopped by its pid (SIGTERM, then SIGKILL), jobs first,
also when a test fails. Needs Debian's ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them).
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo", "squeue", "scancel")


class SlurmUnavailable(RuntimeError):
    """SLURM cannot run here; the message says why (the test is then skipped with it)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


class SlurmCluster:
    def __init__(self, root, cpus: int = 2, start_timeout: float = 60.0):
        self.root = Path(root).resolve()
        self.cpus = cpus
        self.start_timeout = start_timeout
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.pids: dict[str, int] = {}
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, "SLURM_CONF": str(self.conf)}

    # ---- start ----
    def __enter__(self):
        missing = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
        if missing:
            raise SlurmUnavailable(
                f"SLURM is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge"
            )
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def _exe(self, name: str) -> str:
        return shutil.which(name) or str(Path("/usr/sbin", name))

    def _start(self) -> None:
        r = self.root
        for d in ("munge", "spool", "state", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        self.socket = r / "munge" / "munge.sock"
        cmd = [
            self._exe("munged"),
            f"--socket={self.socket}",
            f"--key-file={key}",
            f"--log-file={r / 'munge' / 'munged.log'}",
            f"--pid-file={r / 'munge' / 'munged.pid'}",
            f"--seed-file={r / 'munge' / 'munged.seed'}",
        ]
        if os.geteuid() == 0:
            cmd.insert(1, "--force")  # munged refuses root without it; the key and socket are this test's own
        self._daemon("munged", cmd, r / "munge" / "munged.pid", r / "munge" / "munged.log")
        user = getpass.getuser()
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=simlibtest",
                    f"SlurmctldHost={self.host}",
                    f"SlurmUser={user}",
                    f"SlurmdUser={user}",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={self.socket}",
                    "CredType=cred/munge",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "JobCompType=jobcomp/none",
                    "AccountingStorageType=accounting_storage/none",
                    "SchedulerType=sched/backfill",
                    # `sbatch --wait` polls at 2 s, then x4 while the poll is under MinJobAge / 2 (default 300 s: polls at
                    # 2, 10, 42 s, so a 12-s job was seen done at 42 s); at 4 s it polls every 2 s, and a finished job's
                    # record still outlives a poll (slurm 22.05, src/sbatch/sbatch.c, _job_wait)
                    "MinJobAge=4",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'slurmd.pid'}",
                    f"SlurmdSpoolDir={r / 'spool'}",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
                    f"NodeName={self.host} CPUs={self.cpus} RealMemory=4000 State=UNKNOWN",
                    f"PartitionName=simlib Nodes={self.host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
                    "",
                ]
            )
        )
        self._daemon(
            "slurmctld",
            [self._exe("slurmctld"), "-f", str(self.conf)],
            r / "slurmctld.pid",
            r / "log" / "slurmctld.log",
        )
        self._daemon("slurmd", [self._exe("slurmd"), "-f", str(self.conf)], r / "slurmd.pid", r / "log" / "slurmd.log")
        deadline = time.monotonic() + self.start_timeout
        state = ""
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True, timeout=30)
            state = (out.stdout + out.stderr).strip()
            if out.returncode == 0 and state.startswith("idle"):
                return
            time.sleep(0.5)
        raise SlurmUnavailable(
            f"the node did not become idle within {self.start_timeout:.0f} s (sinfo: {state!r});"
            f" slurmd log: {self._tail(r / 'log' / 'slurmd.log')}"
        )

    def _daemon(self, name: str, cmd: list, pid_file: Path, log: Path, timeout: float = 20.0) -> None:
        out = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise SlurmUnavailable(
                f"{name} did not start (exit {out.returncode}): "
                f"{(out.stderr or out.stdout).strip()[-300:]} {self._tail(log)}"
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pid_file.exists() and pid_file.read_text().strip():
                self.pids[name] = int(pid_file.read_text().split()[0])
                if _alive(self.pids[name]):
                    return
            time.sleep(0.1)
        raise SlurmUnavailable(f"{name} wrote no live pid to {pid_file} within {timeout:.0f} s: {self._tail(log)}")

    @staticmethod
    def _tail(path: Path, n: int = 3) -> str:
        try:
            return " | ".join(path.read_text().strip().splitlines()[-n:])
        except OSError:
            return "(no log)"

    # ---- use ----
    def run(self, cmd: list, timeout: float = 300.0, **kwargs) -> subprocess.CompletedProcess:
        env = {**self.env, **kwargs.pop("env", {})}
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kwargs)

    # ---- stop ----
    def stop(self) -> None:
        """Cancel this cluster's jobs, then stop every daemon this object started, by pid (slurmd first)."""
        if "slurmctld" in self.pids and _alive(self.pids["slurmctld"]):
            try:
                subprocess.run(
                    ["scancel", "--partition=simlib", "--full"], env=self.env, capture_output=True, timeout=20
                )
                deadline = time.monotonic() + 20
                while (
                    time.monotonic() < deadline
                    and subprocess.run(
                        ["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True, timeout=20
                    ).stdout.strip()
                ):
                    time.sleep(0.2)
            except (OSError, subprocess.SubprocessError):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.pids.pop(name, None)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        for pid in self._step_daemons():  # a slurmstepd outlives slurmd while it retries its last message
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _step_daemons(self) -> list[int]:
        """slurmstepd processes of this cluster: their log or working directory is inside this temp dir."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if (proc / "comm").read_text().strip() != "slurmstepd":
                    continue
                paths = [os.readlink(proc / "cwd")] + [os.readlink(fd) for fd in (proc / "fd").iterdir()]
            except OSError:
                continue
            if any(p.startswith(str(self.root)) for p in paths):
                found.append(int(proc.name))
        return found
