"""Devices and torch.distributed: one process per device, launched by torchrun.

`torchrun --nproc_per_node N -m vitzoo train ...` sets RANK, LOCAL_RANK and WORLD_SIZE; the process
group is NCCL on CUDA and gloo on CPU (or the caller's own, made before `fit`). Each process works on
its local rank's GPU, its current device. Rank 0 logs and writes; every rank computes. Numbers the host
holds (clock readings, a stop request) are agreed over a gloo group, so that agreeing on them never
waits for the GPU; where gloo would bind the loopback in a job of several nodes (a host name that
resolves to 127.0.1.1, as Debian and Ubuntu set it), over the NCCL group instead (`host_agreement`).

The group is made at the first `setup` and lives as long as the process: torch cannot make the default
group again in a process once it was destroyed (the second rendezvous hangs), and a script may train
several times (`fit` twice under one torchrun).

When one rank fails, the others must not wait for it: a collective that a rank never joins waits for the
group's timeout (`COLLECTIVE_TIMEOUT`, 10 minutes unless VITZOO_COLLECTIVE_TIMEOUT_MIN says otherwise),
then raises; work that may fail on one rank and not on another is followed by an agreement on whether it
failed anywhere (`all_or_none`), so every rank raises at the same point. The launcher then ends the job
(torchrun and the elastic launcher stop every rank when one exits with an error; under SLURM, srun's
--kill-on-bad-exit does).
"""

from __future__ import annotations

import atexit
import datetime
import ipaddress
import os
import socket
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from vitzoo.errors import ConfigError
from vitzoo.train import gpu_support

T = TypeVar("T")


def collective_timeout(environ: Mapping[str, str] = os.environ) -> datetime.timedelta:
    """How long a rank waits in a collective for the others before it raises: VITZOO_COLLECTIVE_TIMEOUT_MIN
    minutes (default 10: longer than rank 0 writing a checkpoint of ViT-H on a slow file system, far
    shorter than torch's 30-minute default a failed job would hold its GPUs for)."""
    text = environ.get("VITZOO_COLLECTIVE_TIMEOUT_MIN", "10")
    try:
        minutes = float(text)
    except ValueError:
        minutes = float("nan")
    if not minutes > 0:
        raise ConfigError(f"VITZOO_COLLECTIVE_TIMEOUT_MIN={text!r}: give the minutes a rank waits for the others, a "
                          "positive number (default 10)")
    return datetime.timedelta(minutes=minutes)


@dataclass
class Env:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    host_group: Any = None  # the group that agrees on numbers the host holds (None: the default group)
    host_device: torch.device = torch.device("cpu")  # where those numbers travel: the GPU over NCCL

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """`auto` is CUDA if present, else MPS, else CPU; `cuda` is the local rank's GPU, `cuda:N` GPU N;
    asking for a missing device is an error. So is a GPU this torch build has no kernels for; `auto`
    on a machine whose GPU torch cannot use (an old driver) warns before it settles for the CPU."""
    asked = name
    cuda = torch.cuda.is_available()
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if name == "auto":
        if not cuda and (why := gpu_support.cuda_unavailable()) is not None:
            warnings.warn(f"--device auto: {why}; training on the {'MPS device' if mps else 'CPU'} instead", stacklevel=2)
        name = "cuda" if cuda else "mps" if mps else "cpu"
    if torch.device(name).type == "cuda":
        if not cuda:
            why = gpu_support.cuda_unavailable()
            raise RuntimeError(f"--device {name}: " + (why if why else "no CUDA device is available (use --device auto or cpu)"))
        index, gpus = torch.device(name).index, torch.cuda.device_count()
        if index is None:
            index = own_gpu(local_rank, gpus)
        elif index >= gpus:
            raise RuntimeError(f"--device {name}: there are only {gpus} visible CUDA device(s)")
        if (why := gpu_support.unsupported_gpu(index)) is not None:
            raise RuntimeError(f"--device {asked}: {why}")
        return torch.device("cuda", index)
    if name == "mps":
        if not mps:
            raise RuntimeError("--device mps: MPS is not available (use --device auto or cpu)")
        return torch.device("mps")
    return torch.device("cpu")


def own_gpu(local_rank: int, gpus: int) -> int:
    """The GPU of the process of this local rank: one each. A process that sees a single GPU works on it
    whatever its local rank: a launcher that binds one GPU to each task (SLURM's --gpu-bind, or
    --gpus-per-task) shows each its own as device 0 (two ranks that see the same one are refused once the
    group exists: `refuse_shared_gpus`). Otherwise more processes than GPUs is an error: two on one GPU
    would only fail later, in NCCL's first collective ("Duplicate GPU detected")."""
    if gpus == 1:
        return 0
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
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", timeout=collective_timeout())
        atexit.register(_destroy_group)
        rank, world = dist.get_rank(), dist.get_world_size()
    if not dist.is_initialized():
        return Env(rank, world, local_rank, dev)
    env = Env(rank, world, local_rank, dev, *host_agreement(dev, warn=local_rank == 0))
    if dev.type == "cuda" and world > 1:
        refuse_shared_gpus(gather_objects((socket.gethostname(), gpu_identity(dev)), env))
    return env


def gpu_identity(device: torch.device) -> str:
    """What tells GPUs apart across processes that number them differently: the device's UUID."""
    return str(getattr(torch.cuda.get_device_properties(device), "uuid", device.index))


def refuse_shared_gpus(identities: list[tuple[str, str]]) -> None:
    """Each rank's (host, GPU UUID), in rank order: two ranks on one GPU are a ConfigError, on every rank
    alike (NCCL would fail at its first collective with "Duplicate GPU detected", or hang)."""
    ranks: dict[tuple[str, str], list[int]] = {}
    for rank, identity in enumerate(identities):
        ranks.setdefault(tuple(identity), []).append(rank)
    shared = [(host, gpu, r) for (host, gpu), r in ranks.items() if len(r) > 1]
    if shared:
        host, gpu, together = shared[0]
        raise ConfigError(f"ranks {', '.join(map(str, together))} all work on GPU {gpu} of {host}: each process needs a GPU "
                          "of its own. Start one process per GPU (torchrun --nproc_per_node = the node's GPUs; under "
                          "SLURM one task per GPU, with --gpus-per-task=1 or --gpu-bind so each task sees its own, "
                          "or every GPU visible to every task so that LOCAL_RANK picks one)")


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


# ---------------------------------------------------------------------------- agreeing on host numbers
# the environment variables that choose gloo's network interface (TP_SOCKET_IFNAME: its TensorPipe twin)
INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def host_addresses(hostname: str) -> list[str]:
    """The addresses `hostname` resolves to, in the resolver's order (gloo binds the first that binds)."""
    return [info[4][0] for info in socket.getaddrinfo(hostname, None)]


def gloo_loopback_problem(world_size: int, environ: Mapping[str, str] = os.environ, hostname: str | None = None,
                          resolve: Callable[[str], list[str]] | None = None) -> str | None:
    """Why a gloo group of this job would hang, or None. Without GLOO_SOCKET_IFNAME, gloo binds the
    address the host name resolves to, or the loopback when it resolves to none; on a host whose name
    resolves to 127.0.1.1 (Debian's and Ubuntu's /etc/hosts) the other nodes then cannot reach it. One
    node is fine (the loopback reaches every rank): a job is on one node when LOCAL_WORLD_SIZE (set by
    torchrun) is the world size, and may span several when it is unset."""
    if any(environ.get(name) for name in INTERFACE_VARIABLES):
        return None
    per_node = environ.get("LOCAL_WORLD_SIZE")
    if world_size <= 1 or per_node and int(per_node) == world_size:
        return None
    hostname = hostname if hostname is not None else socket.gethostname()
    try:
        addresses = (resolve or host_addresses)(hostname)
    except OSError as exc:  # socket.gaierror: gloo falls back to the loopback address
        return f"the host name {hostname!r} does not resolve ({exc}), so gloo would bind the loopback"
    if not addresses:
        return f"the host name {hostname!r} resolves to no address, so gloo would bind the loopback"
    first = addresses[0].split("%")[0]  # an IPv6 address may carry its interface
    if ipaddress.ip_address(first).is_loopback:
        return f"the host name {hostname!r} resolves to the loopback address {first}, which gloo would bind"
    return None


_HOST_AGREEMENT: dict[str, Any] = {}  # decided once per process: {"group": a gloo group or None}


def host_agreement(device: torch.device, warn: bool = True) -> tuple[Any, torch.device]:
    """The group and device over which the ranks agree on numbers the host holds (`host_max`).

    The default group when it is gloo. Beside NCCL, a gloo group (made once: making a group is a
    collective of every rank), unless gloo would bind the loopback in a job of several nodes
    (`gloo_loopback_problem`) on any rank: then the NCCL group itself, on the device (correct, a
    device sync slower), said once in a warning (`warn`: this process says it). Every rank decides
    alike, agreeing over NCCL first, since only all of them together may make the gloo group."""
    if dist.get_backend() == "gloo":
        return None, torch.device("cpu")
    if not _HOST_AGREEMENT:
        problem = gloo_loopback_problem(dist.get_world_size())
        anywhere = torch.tensor([float(problem is not None)], device=device)
        dist.all_reduce(anywhere, op=dist.ReduceOp.MAX)
        if anywhere.item():
            if problem is not None and warn:
                spans = "spans" if os.environ.get("LOCAL_WORLD_SIZE") else "may span (LOCAL_WORLD_SIZE is unset)"
                warnings.warn(f"{problem}, and this job {spans} several nodes: over gloo its ranks could not reach each "
                              "other and the job would hang, so each step's agreement (step time, stop requests) goes "
                              "over the NCCL group, on the GPU (correct, slightly slower). Set GLOO_SOCKET_IFNAME to the "
                              "node's network interface (e.g. GLOO_SOCKET_IFNAME=eth0; `ip addr` lists them) to agree "
                              "on the host again", stacklevel=3)
            _HOST_AGREEMENT["group"] = None
        else:
            _HOST_AGREEMENT["group"] = dist.new_group(backend="gloo", timeout=collective_timeout())
    group = _HOST_AGREEMENT["group"]
    return group, (torch.device("cpu") if group is not None else device)


def _destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce(tensor: torch.Tensor, env: Env, op=None) -> torch.Tensor:
    """Sum (or `op`) over ranks, in place; a no-op for one process."""
    if env.distributed:
        dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM)
    return tensor


def host_max(values: list[float], env: Env) -> list[float]:
    """The largest of each number over ranks, for numbers the host holds: a CPU collective, no device
    sync (over NCCL where gloo cannot reach the other nodes: `host_agreement`)."""
    if not env.distributed:
        return values
    agreed = torch.tensor(values, dtype=torch.float64, device=env.host_device)
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


class RankFailed(RuntimeError):
    """Work that every rank did failed on another rank (whose own error says why)."""


def all_or_none(work: Callable[[], T], env: Env) -> T:
    """`work()` on every rank, then an agreement on whether it failed on any rank, before any rank goes
    on: a rank whose work failed raises its error, the others RankFailed naming the ranks that failed.
    For local work between collectives that can fail on one rank only (a damaged image in its share):
    without the agreement that rank would go on to the next collective while the others wait in this
    one's, until the group's timeout."""
    try:
        result, error = work(), None
    except Exception as exc:  # noqa: BLE001 (raised below, on every rank alike)
        result, error = None, exc
    if env.distributed:
        flags = [0.0] * env.world_size
        flags[env.rank] = float(error is not None)
        failed = [rank for rank, flag in enumerate(host_max(flags, env)) if flag]
        if failed and error is None:
            raise RankFailed(f"rank(s) {', '.join(map(str, failed))} failed (their logs say why); rank {env.rank} "
                             "stops with them")
    if error is not None:
        raise error
    return result


def barrier(env: Env) -> None:
    if env.distributed:
        dist.barrier()


__all__ = ["Env", "RankFailed", "all_or_none", "all_reduce", "collective_timeout", "gpu_identity", "refuse_shared_gpus", "barrier", "gather_objects", "gather_strided", "gloo_loopback_problem", "host_addresses",
           "host_agreement", "host_max", "node_rank", "own_gpu", "pick_device", "refuse_one_gpu_for_all", "setup"]
