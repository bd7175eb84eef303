"""Processes, devices and stop signals: one process per device, launched by torchrun.

The group is NCCL on CUDA and gloo on the CPU (or the caller's own); rank 0 logs and writes. Host
numbers (a step's time, a stop request) are agreed over gloo where it reaches every rank, so that
agreeing never waits for the GPU. Work that may fail on one rank is followed by `all_or_none`, so
that no rank waits for ever in the next collective.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import re
import signal
import socket
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from vitzoo.errors import ConfigError

COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)  # over a ViT-H checkpoint's write, under 30
NVIDIA_PROBES = (Path("/proc/driver/nvidia/gpus"), Path("/dev/nvidia0"))  # a driver's GPUs
MINIMUM_DRIVER = {"11": "450", "12": "525", "13": "580"}  # of each CUDA major release


@dataclass
class Env:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    host_group: Any = None  # where host numbers are agreed (None: the default group)
    host_device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def cuda_unavailable() -> str | None:
    """Why torch cannot use this machine's NVIDIA GPU (a CPU build, an old driver), or None."""
    if not any(os.access(p, os.R_OK) and (not p.is_dir() or any(p.iterdir()))
               for p in NVIDIA_PROBES):
        return None
    if torch.version.cuda is None:
        return "there is an NVIDIA GPU, but torch is built without CUDA; install a CUDA build"
    driver = MINIMUM_DRIVER.get(torch.version.cuda.split(".")[0], "?")
    return (f"there is an NVIDIA GPU, but its driver is likely older than torch's CUDA "
            f"{torch.version.cuda} needs (driver {driver} or newer): update it")


def runs_on(arch: str, major: int, minor: int) -> bool:
    """Whether code of `arch` runs on compute capability major.minor: sm_XY on X.Y and the later
    minors of X, PTX compute_XY on X.Y and any later GPU, sm_XYa on X.Y alone."""
    found = re.fullmatch(r"(sm|compute)_(\d+)(\d)(a?)", arch)
    if found is None:
        return False
    built, specific = (int(found[2]), int(found[3])), found[4]
    if specific:
        return built == (major, minor)
    if found[1] == "compute":
        return built <= (major, minor)
    return built[0] == major and built[1] <= minor


def unsupported_gpu(index: int) -> str | None:
    """Why this torch build has no kernels for GPU `index` (too old for it), or None."""
    arches, (major, minor) = torch.cuda.get_arch_list(), torch.cuda.get_device_capability(index)
    if not arches or torch.version.hip or any(runs_on(a, major, minor) for a in arches):
        return None
    return (f"GPU {index} ({torch.cuda.get_device_name(index)}) has compute capability "
            f"{major}.{minor}, and torch has kernels for {', '.join(arches)} only: install a "
            f"torch whose build includes sm_{major}{minor} (for an older CUDA), or --device cpu")


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """`auto`: CUDA, else MPS, else the CPU (warning of a GPU torch cannot use); `cuda`: the local
    rank's GPU, or the one GPU a process sees (SLURM's --gpu-bind); `cuda:N`: GPU N."""
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if name == "auto" and not cuda and (why := cuda_unavailable()):
        where = "MPS" if mps else "CPU"
        warnings.warn(f"--device auto: {why}; training on the {where} instead", stacklevel=2)
    device = ("cuda" if cuda else "mps" if mps else "cpu") if name == "auto" else name
    if device == "mps" and not mps:
        raise RuntimeError("--device mps: MPS is not available")
    if not device.startswith("cuda"):
        return torch.device(device)
    if not cuda:
        raise RuntimeError(f"--device {name}: {cuda_unavailable() or 'no CUDA device'}")
    index, gpus = torch.device(device).index, torch.cuda.device_count()
    if index is None and gpus > 1 and local_rank >= gpus:
        raise RuntimeError(f"LOCAL_RANK {local_rank} has no GPU of its own among the {gpus} "
                           f"visible CUDA devices: start at most {gpus} processes a node "
                           f"(torchrun --nproc_per_node {gpus})")
    index = (local_rank if gpus > 1 else 0) if index is None else index
    if index >= gpus:
        raise RuntimeError(f"--device {name}: there are only {gpus} visible CUDA devices")
    if why := unsupported_gpu(index):
        raise RuntimeError(f"--device {name}: {why}")
    return torch.device("cuda", index)


def setup(device: str) -> Env:
    """This process's rank, world and device, and the group when torchrun started several
    processes (a caller's own group is used as it is). A GPU becomes the current device."""
    joined, launched = dist.is_initialized(), int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and device.startswith("cuda") and torch.device(device).index is not None:
        raise ConfigError(f"--device {device} under torchrun puts every process on one GPU; use "
                          "--device cuda (CUDA_VISIBLE_DEVICES chooses the GPUs)")
    rank = dist.get_rank() if joined else int(os.environ.get("RANK", "0"))
    world = dist.get_world_size() if joined else launched
    # a caller's group without LOCAL_RANK (mp.spawn): the rank on its node picks the GPU
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE") or 0) or world
    local_rank = int(os.environ.get("LOCAL_RANK", rank % per_node if joined else 0))
    dev = pick_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # NCCL's barrier and object collectives run there
    if world > 1 and not joined:
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo",
                                timeout=COLLECTIVE_TIMEOUT)
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
        rank, world = dist.get_rank(), dist.get_world_size()
    if not dist.is_initialized():
        return Env(rank, world, local_rank, dev)
    env = Env(rank, world, local_rank, dev, *host_agreement(dev))
    if dev.type == "cuda" and world > 1:
        uuid = str(getattr(torch.cuda.get_device_properties(dev), "uuid", dev.index))
        refuse_shared_gpus(gather_objects((socket.gethostname(), uuid), env))
    return env


def refuse_shared_gpus(identities: list[tuple[str, str]]) -> None:
    """Each rank's (host, GPU UUID): two ranks on one GPU fail on every rank alike."""
    ranks: dict[tuple[str, str], list[str]] = {}
    for rank, identity in enumerate(identities):
        ranks.setdefault(tuple(identity), []).append(str(rank))
    for (host, gpu), together in ranks.items():
        if len(together) > 1:
            raise ConfigError(f"ranks {', '.join(together)} all work on GPU {gpu} of {host}: "
                              "start one process per GPU (under SLURM: --gpus-per-task=1)")


_HOST_GROUP: dict[str, Any] = {}  # made once a process: a group cannot be made again


def host_agreement(device: torch.device) -> tuple[Any, torch.device]:
    """The group and device of `host_max`: the default group when it is gloo; beside NCCL a gloo
    group on one node, or across nodes where GLOO_SOCKET_IFNAME names their interface (else gloo
    may bind the loopback, and hang); otherwise NCCL itself, on the device."""
    if dist.get_backend() == "gloo":
        return None, torch.device("cpu")
    if not _HOST_GROUP:
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE") or 0)
        reachable = bool(os.environ.get("GLOO_SOCKET_IFNAME")) or per_node == dist.get_world_size()
        unreachable = torch.tensor([float(not reachable)], device=device)
        dist.all_reduce(unreachable, op=dist.ReduceOp.MAX)  # all ranks decide alike
        _HOST_GROUP["group"] = None if unreachable.item() else dist.new_group(
            backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    group = _HOST_GROUP["group"]
    return group, torch.device("cpu") if group is not None else device


def all_reduce(tensor: torch.Tensor, env: Env) -> torch.Tensor:
    if env.distributed:
        dist.all_reduce(tensor)
    return tensor


def host_max(values: list[float], env: Env) -> list[float]:
    """The largest of each host number over the ranks, with no device sync."""
    if not env.distributed:
        return values
    agreed = torch.tensor(values, dtype=torch.float64, device=env.host_device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=env.host_group)
    return agreed.tolist()


def gather_strided(part: torch.Tensor, total: int, env: Env) -> torch.Tensor:
    """The `total` rows of which rank r holds rows r, r + W, ..., in order, on every rank."""
    if not env.distributed:
        return part
    world, rows = env.world_size, -(-total // env.world_size)
    padded = torch.zeros((rows, *part.shape[1:]), dtype=part.dtype, device=env.device)
    padded[: len(part)] = part.to(env.device)
    shares = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(shares, padded)
    whole = torch.empty((total, *part.shape[1:]), dtype=part.dtype, device=part.device)
    for rank, share in enumerate(shares):
        whole[rank::world] = share[: len(range(rank, total, world))].to(part.device)
    return whole


def gather_objects(value: Any, env: Env) -> list:
    """Every rank's small picklable `value`, in rank order."""
    if not env.distributed:
        return [value]
    values: list = [None] * env.world_size
    dist.all_gather_object(values, value)
    return values


class RankFailed(RuntimeError):
    """Work that every rank did failed on another rank (whose own error says why)."""


def all_or_none(work: Callable[[], Any], env: Env) -> Any:
    """`work()` on every rank, then agreement on whether it failed anywhere: the failed rank
    raises its error, the others RankFailed."""
    try:
        result, error = work(), None
    except Exception as exc:  # noqa: BLE001 (raised below, on every rank alike)
        result, error = None, exc
    failed = [0.0] * env.world_size
    failed[env.rank] = float(error is not None)
    failed = [rank for rank, flag in enumerate(host_max(failed, env)) if flag]
    if error is not None:
        raise error
    if failed:
        raise RankFailed(f"rank(s) {', '.join(map(str, failed))} failed (their logs say why)")
    return result


def barrier(env: Env) -> None:
    if env.distributed:
        dist.barrier()


@contextlib.contextmanager
def stop_signals(flag: dict):
    """SIGINT, SIGTERM, SIGUSR2 (SLURM's warning) and SIGHUP set flag["signal"] (the first
    received); a second SIGINT raises KeyboardInterrupt; one ignored on entry stays so (nohup)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if flag.get("signal") and signum == signal.SIGINT:
            raise KeyboardInterrupt
        flag.setdefault("signal", signum)

    stops = [getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGUSR2", "SIGHUP")
             if hasattr(signal, n)]
    previous = {s: signal.signal(s, handler) for s in stops
                if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
