"""What the recorder learns from its process once, at construction: rank, launch, device.

torch is used only when the training process already imported it; this module never imports it.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import sys
import time

from .version import __version__


def _torch():
    return sys.modules.get("torch")


def _env_int(*names: str) -> int | None:
    for name in names:
        v = os.environ.get(name)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                continue
    return None


def detect_rank_world() -> tuple[int, int]:
    """(rank, world_size): torch.distributed when initialized, else RANK/WORLD_SIZE, else Slurm, else (0, 1)."""
    torch = _torch()
    if torch is not None:
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    rank = _env_int("RANK", "SLURM_PROCID")
    world = _env_int("WORLD_SIZE", "SLURM_NTASKS")
    return (rank if rank is not None else 0), (world if world is not None else 1)


def detect_local_rank() -> int | None:
    return _env_int("LOCAL_RANK", "SLURM_LOCALID")


def launch_info() -> dict:
    """What identifies this launch across ranks, where the environment says it."""
    info = {
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_step_id": os.environ.get("SLURM_STEP_ID"),
        "slurm_job_start_time": _env_int("SLURM_JOB_START_TIME"),
        "slurm_restart_count": _env_int("SLURM_RESTART_COUNT"),
        "torchelastic_run_id": os.environ.get("TORCHELASTIC_RUN_ID"),
        "torchelastic_restart_count": _env_int("TORCHELASTIC_RESTART_COUNT"),
    }
    return {k: v for k, v in info.items() if v is not None}


def _stamp(t: _dt.datetime) -> str:
    return t.strftime("%Y%m%dT%H%M%S.%fZ")


def make_attempt_id(now: _dt.datetime, launch: dict) -> str:
    """Unique per process launch, sorting by launch time; shared by all ranks of a Slurm launch.

    Under Slurm (with SLURM_JOB_START_TIME, Slurm >= 22.05) every rank of one launch computes
    the same id from the job's start time, job/step ids and the Slurm-requeue and torchelastic
    restart counters, so a launch's folders line up across ranks. Elsewhere nothing shared is
    known without a collective, so the id is this process's own start time (microseconds) and
    pid: unique even when a launcher reuses its ids (torchrun's default rendezvous id is the
    same on every launch). Either way it leads with a UTC timestamp; ingest orders attempts by
    meta.json's start time and groups launches itself, so it never depends on ids matching.
    """
    te = launch.get("torchelastic_restart_count")
    if "slurm_job_id" in launch and "slurm_job_start_time" in launch:
        start = _dt.datetime.fromtimestamp(launch["slurm_job_start_time"], _dt.timezone.utc)
        step = f".{launch['slurm_step_id']}" if "slurm_step_id" in launch else ""
        parts = [_stamp(start), f"slurm{launch['slurm_job_id']}{step}", f"r{launch.get('slurm_restart_count', 0):03d}"]
        if te is not None:
            parts.append(f"te{te:03d}")
        return "-".join(parts)
    parts = [_stamp(now)]
    if "slurm_job_id" in launch:
        parts.append(f"slurm{launch['slurm_job_id']}-r{launch.get('slurm_restart_count', 0):03d}")
    if te is not None:
        parts.append(f"te{te:03d}")
    parts.append(f"p{os.getpid()}")
    return "-".join(parts)


def cuda_in_use() -> bool:
    """True when this process has initialised CUDA (we never initialise it ourselves). Asked every
    memory_every_steps until it is: ``is_initialized()`` first (20 ns) and only then
    ``is_available()`` (0.7 µs on a machine without CUDA)."""
    torch = _torch()
    return bool(torch is not None and torch.cuda.is_initialized() and torch.cuda.is_available())


def cuda_memory() -> tuple[int, int, int]:
    """(allocated, peak allocated since the previous sample, reserved) bytes: the caching allocator's
    host-side counters, no device synchronisation. Resetting the peak is what makes mem_peak_bytes
    "peak since the previous sample"; it also resets what your own torch.cuda.max_memory_allocated()
    reports (memory_every_steps=0 turns sampling off)."""
    cuda = sys.modules["torch"].cuda
    stats = cuda.memory_stats_as_nested_dict()
    cuda.reset_peak_memory_stats()
    return (
        stats["allocated_bytes"]["all"]["current"],
        stats["allocated_bytes"]["all"]["peak"],
        stats["reserved_bytes"]["all"]["current"],
    )


def process_start_time() -> float | None:
    """Unix time this process started (Linux: /proc), None where unknown.

    The recorder is built after imports, model set-up and the process group: ingest's goodput
    counts that time as startup, not as downtime between launches.
    """
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime (clock ticks since boot)
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def process_identity() -> dict:
    """What tells this process apart from any other on this host, exactly (Linux): the boot (a
    reboot reuses pids), the pid namespace (a container sees only its own pids) and the start in
    clock ticks since boot (a reused pid starts later). Each None where unknown. A writer's
    meta.json keeps it, so a later clean-up (leftovers.py) can tell whether that writer still runs
    without trusting the wall clock."""
    out = {"boot_id": None, "pid_ns": None, "start_ticks": None}
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            out["boot_id"] = f.read().strip() or None
        out["pid_ns"] = os.stat("/proc/self/ns/pid").st_ino
        with open("/proc/self/stat") as f:
            out["start_ticks"] = int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        pass
    return out


def device_info() -> dict:
    if cuda_in_use():
        torch = _torch()
        idx = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        return {"type": "cuda", "index": idx, "name": props.name, "total_memory_bytes": int(props.total_memory)}
    return {"type": "cpu", "name": platform.processor() or platform.machine() or None, "total_memory_bytes": None}


def versions() -> dict:
    out = {"kforge": __version__, "python": platform.python_version()}
    for mod in ("torch", "pyarrow", "numpy"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = getattr(m, "__version__", None)
    return out


def hostname() -> str:
    return socket.gethostname()


def flight_recorder_env() -> dict:
    """PyTorch flight-recorder settings of this process (meta.json ``fr``): ``buffer_size`` (from
    TORCH_FR_BUFFER_SIZE, else TORCH_NCCL_TRACE_BUFFER_SIZE; null: off) and ``dump_file`` (the
    prefix PyTorch's watchdog writes ``<prefix><rank>`` to: TORCH_FR_DUMP_TEMP_FILE, else
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE, else its default), read by ingest's hang finding."""
    size = os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")
    try:
        n = int(size) if size else None
    except ValueError:
        n = None
    dump = os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    return {"buffer_size": n, "dump_file": dump or ("/tmp/nccl_trace_rank_" if n else None)}
