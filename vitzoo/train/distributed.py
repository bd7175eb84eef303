"""Devices and torch.distributed: one process per device, launched by torchrun.

`torchrun --nproc_per_node N -m vitzoo train ...` sets RANK, LOCAL_RANK and WORLD_SIZE; the process
group is NCCL on CUDA and gloo on CPU (or the caller's own, made before `fit`). Each process works on
its local rank's GPU, its current device. Rank 0 logs and writes; every rank computes. Numbers the host
holds (clock readings, a stop request) are agreed over a gloo group, so that agreeing on them never
waits for the GPU.

The group is made at the first `setup` and lives as long as the process: torch cannot make the default
group again in a process once it was destroyed (the second rendezvous hangs), and a script may train
several times (`fit` twice under one torchrun).
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from vitzoo.errors import ConfigError


@dataclass
class Env:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    host_group: Any = None  # the group for CPU tensors (None: the default group, when that is gloo)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """`auto` is CUDA if present, else MPS, else CPU; `cuda` is the local rank's GPU, `cuda:N` GPU N;
    asking for a missing device is an error."""
    cuda = torch.cuda.is_available()
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if name == "auto":
        name = "cuda" if cuda else "mps" if mps else "cpu"
    if torch.device(name).type == "cuda":
        if not cuda:
            raise RuntimeError(f"--device {name}: no CUDA device is available (use --device auto or cpu)")
        index, gpus = torch.device(name).index, torch.cuda.device_count()
        if index is None:
            return torch.device("cuda", own_gpu(local_rank, gpus))
        if index >= gpus:
            raise RuntimeError(f"--device {name}: there are only {gpus} visible CUDA device(s)")
        return torch.device("cuda", index)
    if name == "mps":
        if not mps:
            raise RuntimeError("--device mps: MPS is not available (use --device auto or cpu)")
        return torch.device("mps")
    return torch.device("cpu")


def own_gpu(local_rank: int, gpus: int) -> int:
    """The GPU of the process of this local rank: one each. Two processes on one GPU would only fail
    later, in NCCL's first collective ("Duplicate GPU detected"), so more processes than GPUs is an error."""
    if local_rank >= gpus:
        raise RuntimeError(f"LOCAL_RANK {local_rank} has no GPU of its own: this node runs more processes than its "
                           f"{gpus} visible CUDA device(s); start at most {gpus} (torchrun --nproc_per_node {gpus}) "
                           "or make more GPUs visible (CUDA_VISIBLE_DEVICES)")
    return local_rank


def setup(device: str) -> Env:
    """This process's rank, world and device; the process group made when torchrun started several
    processes and none exists yet. A group the caller made (its own `init_process_group`, `mp.spawn`)
    is used as it is.

    On CUDA the process's GPU becomes its current device, whoever made the group: NCCL's barrier and
    object collectives run on the current device, and with every rank on GPU 0 the first of them
    fails ("Duplicate GPU detected")."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))  # the processes torchrun started (1: none)
    joined = dist.is_initialized()
    rank = dist.get_rank() if joined else int(os.environ.get("RANK", "0"))
    world = dist.get_world_size() if joined else launched
    if launched > 1:
        refuse_one_gpu_for_all(device)
    local_rank = node_rank(rank, joined)
    dev = pick_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world > 1 and not joined:
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
        atexit.register(_destroy_group)
        rank, world = dist.get_rank(), dist.get_world_size()
    return Env(rank, world, local_rank, dev, _host_group() if dist.is_initialized() else None)


def node_rank(rank: int, joined: bool) -> int:
    """The process's rank on its node, which chooses its GPU: LOCAL_RANK, as torchrun sets it. In a
    group the caller made without it (`mp.spawn` numbers one process per GPU of one node by rank):
    the rank modulo LOCAL_WORLD_SIZE where that is set, else the rank itself."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if not joined:
        return 0
    per_node = os.environ.get("LOCAL_WORLD_SIZE")
    return rank % int(per_node) if per_node else rank


def refuse_one_gpu_for_all(device: str) -> None:
    """`--device cuda:N` in every process torchrun started would put them all on GPU N."""
    if device.startswith("cuda") and torch.device(device).index is not None:
        raise ConfigError(f"--device {device} under torchrun would put every process on GPU {torch.device(device).index}; "
                          "use --device cuda: each process then works on its local rank's GPU "
                          "(choose the GPUs with CUDA_VISIBLE_DEVICES)")


_HOST_GROUPS: list = []


def _host_group():
    """A gloo group beside an NCCL one (made once: making a group is a collective of every rank)."""
    if dist.get_backend() == "gloo":
        return None
    if not _HOST_GROUPS:
        _HOST_GROUPS.append(dist.new_group(backend="gloo"))
    return _HOST_GROUPS[0]


def _destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce(tensor: torch.Tensor, env: Env, op=None) -> torch.Tensor:
    """Sum (or `op`) over ranks, in place; a no-op for one process."""
    if env.distributed:
        dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM)
    return tensor


def host_max(values: list[float], env: Env) -> list[float]:
    """The largest of each number over ranks, for numbers the host holds: a CPU collective, no device sync."""
    if not env.distributed:
        return values
    agreed = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=env.host_group)
    return agreed.tolist()


def gather_strided(part: torch.Tensor, total: int, env: Env) -> torch.Tensor:
    """The `total` rows of which rank r holds rows r, r + W, r + 2W, ... (W the world size), on every
    rank, in order, on `part`'s device. Shares differ by at most one row: each is padded to the
    largest for all_gather (NCCL gathers device tensors)."""
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
    """Every rank's `value`, in rank order, on every rank: a pickled collective, for small objects the
    host holds (each rank's random states, in a checkpoint); a one-item list for one process."""
    if not env.distributed:
        return [value]
    values: list = [None] * env.world_size
    dist.all_gather_object(values, value)
    return values


def barrier(env: Env) -> None:
    if env.distributed:
        dist.barrier()


__all__ = ["Env", "all_reduce", "barrier", "gather_objects", "gather_strided", "host_max", "node_rank", "own_gpu",
           "pick_device", "refuse_one_gpu_for_all", "setup"]
