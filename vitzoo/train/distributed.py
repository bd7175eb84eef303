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
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)  # over a ViT-H checkpoint's write, under 30


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


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """`auto`: CUDA, else MPS, else the CPU; `cuda`: the local rank's GPU, or the one GPU a process
    sees (SLURM's --gpu-bind); `cuda:N`: GPU N."""
    if name == "auto":
        name = ("cuda" if torch.cuda.is_available() else
                "mps" if torch.backends.mps.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank if torch.cuda.device_count() > 1 else 0)
    return device


def setup(device: str) -> Env:
    """This process's rank, world and device, and the group when torchrun started several
    processes (a caller's own group is used as it is). A GPU becomes the current device."""
    joined, launched = dist.is_initialized(), int(os.environ.get("WORLD_SIZE", "1"))
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
    return Env(rank, world, local_rank, dev, *host_agreement(dev))


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
    """The largest of each host number over the ranks, with no device sync where gloo reaches."""
    if not env.distributed:
        return values
    agreed = torch.tensor(values, dtype=torch.float64, device=env.host_device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=env.host_group)
    return agreed.tolist()


def gather_strided(part: torch.Tensor, total: int, env: Env) -> torch.Tensor:
    """The `total` rows of which rank r holds rows r, r + W, ..., in order, on every rank."""
    if not env.distributed:
        return part
    whole = torch.empty((total, *part.shape[1:]), dtype=part.dtype)
    for rank, share in enumerate(gather_objects(part.cpu(), env)):
        whole[rank :: env.world_size] = share
    return whole


def gather_objects(value: Any, env: Env) -> list:
    """Every rank's picklable `value`, in rank order."""
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
