"""Backend and device from the environment: laptop, simlib.launch, torchrun, SLURM, Colab.

One function, :func:`init`, is what a training function calls first. Under ``simlib.launch`` the
process group already exists and ``init`` just describes it; under ``torchrun`` it reads ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``...; under SLURM (``srun``) it reads ``SLURM_PROCID`` and friends; in a
plain Python process it makes a one-rank group so that the same code runs with ``world_size == 1``.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import subprocess
from dataclasses import dataclass

import torch
import torch.distributed as dist

BACKENDS = ("auto", "gloo", "nccl")
DEFAULT_TIMEOUT = 60.0  # seconds a collective may wait for its peers before it fails


def quick() -> bool:
    """Quick mode (``SIMLIB_QUICK=1``, set by the test suite): lessons use small sizes and few steps."""
    return os.environ.get("SIMLIB_QUICK", "0").lower() not in ("", "0", "false", "no")


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def threads_per_worker(world_size: int, cores: int | None = None) -> int:
    """Torch threads per worker so that ``world_size`` workers do not fight over the cores."""
    cores = cpu_count() if cores is None else cores
    return max(1, cores // max(1, world_size))


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pick_backend(backend: str = "auto", local_world_size: int = 1) -> str:
    """``"nccl"`` when every local rank can have its own GPU, else ``"gloo"``.

    Raises ``ValueError`` for an unknown name or for ``"nccl"`` without a GPU per local rank
    (NCCL refuses two ranks on one GPU).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: use one of {', '.join(map(repr, BACKENDS))}")
    gpus = gpu_count()
    if backend == "auto":
        return "nccl" if gpus >= local_world_size and gpus > 0 and dist.is_nccl_available() else "gloo"
    if backend == "nccl" and (gpus < local_world_size or not dist.is_nccl_available()):
        raise ValueError(
            f"backend 'nccl' needs one GPU per rank: {local_world_size} local ranks but {gpus} GPU(s) "
            "visible (NCCL refuses two ranks on one GPU). Use backend='gloo' (CPU) or 'auto', "
            "or lower the number of ranks per node."
        )
    return backend


def pick_device(backend: str, local_rank: int, device: str = "auto") -> torch.device:
    """The device of one local rank: ``cuda:<local_rank>`` for NCCL, else CPU (unless asked)."""
    if device != "auto":
        return torch.device(device)
    if backend == "nccl":
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


@dataclass(frozen=True)
class Context:
    """What a worker knows about its place in the job (course vocabulary: rank, world_size, ...)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: torch.device
    launcher: str  # "simlib", "torchrun", "slurm" or "single"
    restart_count: int = 0  # which restart this worker belongs to (TORCHELASTIC_RESTART_COUNT; 0 = first attempt)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def num_nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))


_context: Context | None = None
_timeout: float | None = None  # the collective timeout init() was given: every group simlib creates takes it


def collective_timeout() -> datetime.timedelta | None:
    """The timeout the process group was created with (``init(timeout=...)``), for groups made later
    (``dist.new_group`` would otherwise fall back to torch's 30-minute default). None outside a process group."""
    if _timeout is not None and dist.is_initialized():
        return datetime.timedelta(seconds=_timeout)
    if dist.is_initialized():  # a group made by the caller's own init_process_group: reuse its timeout
        try:
            opts = dist.distributed_c10d._get_default_group().options
            return getattr(opts, "_timeout", None)
        except Exception:  # noqa: BLE001 - older torch: fall back to torch's default
            return None
    return None


def detect_launcher(environ=None) -> str:
    environ = os.environ if environ is None else environ
    if environ.get("SIMLIB_WORKER") == "1":
        return "simlib"
    if "TORCHELASTIC_RUN_ID" in environ or ("RANK" in environ and "WORLD_SIZE" in environ):
        return "torchrun"
    if "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ and _in_slurm_step(environ):
        return "slurm"
    return "single"


def _in_slurm_step(environ) -> bool:
    """Inside a task that ``srun`` started (a job step), not the batch script itself: the batch script also sees
    ``SLURM_PROCID=0`` and ``SLURM_NTASKS=N`` (seen with Slurm 22.05), but no step id; treating it as rank 0 of
    N would wait for N - 1 peers that nothing starts."""
    return "SLURM_STEP_ID" in environ or "SLURM_STEPID" in environ


def external_world(environ=None) -> dict | None:
    """The world a launcher (torchrun, srun, or anything that set ``RANK``/``WORLD_SIZE``) already started this
    process in, or None (a laptop, a notebook, an sbatch script outside ``srun``, or a ``simlib.launch`` worker).

    Returns ``launcher``, ``rank``, ``world_size``, ``local_rank``, ``local_world_size``, ``nodes``, read without
    joining any group: what ``simlib train`` checks before it runs as that rank instead of spawning its own.
    """
    environ = os.environ if environ is None else environ
    launcher = detect_launcher(environ)
    if launcher == "torchrun":
        rank, world = int(environ.get("RANK", 0)), int(environ.get("WORLD_SIZE", 1))
        local_rank = int(environ.get("LOCAL_RANK", 0))
        local_world = int(environ.get("LOCAL_WORLD_SIZE", 0)) or None
    elif launcher == "slurm":
        rank = int(environ["SLURM_PROCID"])
        world = int(environ.get("SLURM_STEP_NUM_TASKS") or environ["SLURM_NTASKS"])
        local_rank = int(environ.get("SLURM_LOCALID", 0))
        local_world = _slurm_tasks_per_node(environ)
    else:
        return None
    local_world = local_world or world
    return dict(
        launcher=launcher,
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        nodes=max(1, -(-world // local_world)),
    )


def _slurm_tasks_per_node(environ) -> int | None:
    """Tasks on this node: ``SLURM_STEP_TASKS_PER_NODE`` (``2``, ``2(x3)``, ``2,1``: the first node's count),
    else ``SLURM_NTASKS_PER_NODE``, else tasks / nodes."""
    for key in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        value = re.match(r"\d+", environ.get(key, ""))
        if value:
            return int(value.group())
    if "SLURM_JOB_NUM_NODES" in environ and "SLURM_NTASKS" in environ:
        return int(environ["SLURM_NTASKS"]) // int(environ["SLURM_JOB_NUM_NODES"])
    return None


def check_world_size(requested: int | None, environ=None, program: str = "simlib") -> int | None:
    """The launcher's world size, or None outside a launcher; a ``requested`` size that differs is an error
    (``ValueError`` in one line saying what to do)."""
    world = external_world(environ)
    if world is None:
        return None
    if requested is not None and requested != world["world_size"]:
        how = {"slurm": f"srun -n {requested}", "torchrun": f"torchrun --nproc-per-node {requested}"}
        raise ValueError(
            f"--world-size {requested} but {world['launcher']} started a world of {world['world_size']} "
            f"(this is rank {world['rank']}): drop --world-size (the launcher decides it) or start "
            f"{requested} ranks ({how[world['launcher']]})"
        )
    return world["world_size"]


def slurm_first_host(nodelist: str) -> str:
    """First host of a SLURM node list such as ``gpu[003-005,9],cpu1`` (``scontrol`` when present)."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=10, check=True
        ).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return _slurm_first_host_fallback(nodelist)


def _slurm_first_host_fallback(nodelist: str) -> str:
    first = re.split(r",(?![^\[]*\])", nodelist)[0]
    m = re.match(r"^([^\[]+)\[([^\],-]+)", first)
    return m.group(1) + m.group(2) if m else first


def _slurm_to_env(environ) -> None:
    """Translate SLURM's variables into the torchrun ones that ``env://`` reads."""
    environ.setdefault("RANK", environ["SLURM_PROCID"])
    environ.setdefault("WORLD_SIZE", environ.get("SLURM_STEP_NUM_TASKS") or environ["SLURM_NTASKS"])
    environ.setdefault("LOCAL_RANK", environ.get("SLURM_LOCALID", "0"))
    environ.setdefault("LOCAL_WORLD_SIZE", str(_slurm_tasks_per_node(environ) or 1))
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "127.0.0.1")
    environ.setdefault("MASTER_ADDR", slurm_first_host(nodelist))
    environ.setdefault("MASTER_PORT", str(20000 + int(environ.get("SLURM_JOB_ID", "0")) % 20000))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _attempt_store(restart_count: int, rank: int, world_size: int, timeout: float) -> dict:
    """After an elastic restart, a store of this attempt's own.

    The agent's store outlives its workers, and ``env://`` uses it without a per-attempt prefix: the new workers
    then find the addresses the dead ones published, and Gloo fails with "Connection refused" (seen here on the
    first restart, about one time in two). A prefix per attempt keeps each attempt's keys apart.
    """
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=datetime.timedelta(seconds=timeout),
    )
    attempt = restart_count
    if int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1:
        # Several agents (nodes): their restart counts differ once a node is replaced (the new agent counts from
        # 0), so the attempt is counted in the shared store instead: every worker of an attempt joins once.
        attempt = (store.add("simlib/joined", 1) - 1) // world_size
    return dict(
        init_method=None, store=dist.PrefixStore(f"simlib/attempt_{attempt}", store), rank=rank, world_size=world_size
    )


def init(backend: str = "auto", timeout: float = DEFAULT_TIMEOUT, device: str = "auto") -> Context:
    """Join (or describe) the process group and return this rank's :class:`Context`.

    Idempotent: the second call returns the same context. ``timeout`` bounds how long any
    collective waits for a peer, so a mismatched collective fails instead of hanging.
    """
    global _context, _timeout
    if _context is not None and dist.is_initialized():
        return _context
    launcher = detect_launcher()
    if launcher == "slurm":
        _slurm_to_env(os.environ)
    if launcher == "single":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size if launcher == "single" else 1))
    backend = pick_backend(backend, local_world_size)
    dev = pick_device(backend, local_rank, device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    if not dist.is_initialized():
        kwargs = dict(backend=backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout))
        several_agents = int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1
        if (restart_count > 0 or several_agents) and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            kwargs.update(_attempt_store(restart_count, rank, world_size, timeout))
        if dev.type == "cuda" and backend == "nccl":
            kwargs["device_id"] = dev
        dist.init_process_group(**kwargs)
        _timeout = float(timeout)
    _context = Context(rank, world_size, local_rank, local_world_size, backend, dev, launcher, restart_count)
    return _context


def device() -> torch.device:
    """This rank's device inside a process group (``ctx.device``), the CPU outside one (a plain reference run)."""
    return context().device if dist.is_available() and dist.is_initialized() else torch.device("cpu")


def synchronize(dev) -> None:
    """Wait for ``dev``'s queued work before reading a host clock (a no-op on the CPU)."""
    if torch.device(dev).type == "cuda":
        torch.cuda.synchronize(dev)


def context() -> Context:
    """The current rank's context (calls :func:`init` with defaults if needed)."""
    return _context if (_context is not None and dist.is_initialized()) else init()


def shutdown() -> None:
    """Destroy the process group (safe to call twice)."""
    global _context
    if dist.is_initialized():
        dist.destroy_process_group()
    _context = None


def describe() -> dict:
    """What ``simlib doctor`` prints: versions, backends, cores, GPUs (memory, interconnect), launcher."""
    import platform

    gpus = gpu_count()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cores": cpu_count(),
        "gloo_available": dist.is_gloo_available(),
        "nccl_available": dist.is_nccl_available(),
        "nccl_version": nccl_version(),
        "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda,
        "gpus": gpus,
        "gpu_names": [torch.cuda.get_device_name(i) for i in range(gpus)],
        "gpu_memory_gib": [round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1) for i in range(gpus)],
        "interconnect": gpu_topology() if gpus else None,
        "launcher": detect_launcher(),
        "world": describe_world(),
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
        "colab": "COLAB_RELEASE_TAG" in os.environ or "COLAB_GPU" in os.environ,
        "default_backend": pick_backend("auto", max(1, gpus)),
    }


def nccl_version() -> str | None:
    """NCCL's version as torch was built with it (``"2.21.5"``), or None without CUDA/NCCL."""
    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        return None
    try:
        v = torch.cuda.nccl.version()
    except (RuntimeError, AttributeError):
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def gpu_topology(run=subprocess.run) -> str | None:
    """How the GPUs are linked, from ``nvidia-smi topo -m`` (NV# = NVLink lanes, SYS/PHB/PIX = PCIe paths).

    Returns the matrix as text, or a sentence saying why there is none (no nvidia-smi, or it failed).
    """
    try:
        out = run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20)
    except FileNotFoundError:
        return "nvidia-smi not found: interconnect unknown"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi topo -m failed: {exc}"
    if out.returncode != 0:
        return f"nvidia-smi topo -m failed: {(out.stderr or out.stdout).strip()[:200]}"
    return out.stdout.rstrip()


def describe_world(environ=None) -> str:
    """One line for ``simlib doctor``: the world a launcher started this process in, or why there is none."""
    environ = os.environ if environ is None else environ
    world = external_world(environ)
    if world is not None:
        return (
            f"rank {world['rank']} of {world['world_size']} (local rank {world['local_rank']} of "
            f"{world['local_world_size']}, {world['nodes']} node(s)) started by {world['launcher']}: "
            "`simlib train` and `simlib scaling` join this world"
        )
    if environ.get("SIMLIB_WORKER") == "1":
        return "a simlib.launch worker"
    if "SLURM_JOB_ID" in environ:
        return (
            f"SLURM job {environ['SLURM_JOB_ID']} outside a job step (the batch script): `srun simlib ...` "
            "starts one rank per task; without srun simlib spawns its own local ranks"
        )
    return "none: no launcher set RANK/WORLD_SIZE or SLURM_PROCID/SLURM_NTASKS; simlib spawns its own local ranks"


def quiet_profiler() -> None:
    """Keep Kineto's (torch.profiler's C++ side) ``USDT: ... profiler_start`` / ``profiler_stop`` lines off stderr,
    where a notebook shows them in red on every rank. Kineto reads ``KINETO_LOG_LEVEL`` once, when a process first
    profiles; its levels run VERBOSE 0, INFO 1, WARNING 2, ERROR 3, STAGE 4, USDT 5, and torch's own default
    already hides everything below USDT (seen on torch 2.13: no STAGE line, only the two USDT ones), so 6 hides
    those two and nothing torch would otherwise show. A value the user set is kept."""
    import os

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
