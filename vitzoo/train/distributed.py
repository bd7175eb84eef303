"""Processes, devices and stop signals: one process per device, launched by torchrun.

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; the group is NCCL on CUDA and gloo on the CPU (or the
caller's own). Rank 0 logs and writes; every rank computes. Numbers the host holds (clock readings,
a stop request) are agreed over a gloo group so that agreeing never waits for the GPU, or over NCCL
where gloo would bind the loopback in a job of several nodes (`host_agreement`). The group lives as
long as the process (torch cannot make it again once destroyed). A collective a rank never joins
raises after COLLECTIVE_TIMEOUT; work that may fail on one rank only is followed by `all_or_none`.
SIGINT, SIGTERM, SIGUSR2 (SLURM's warning) and SIGHUP stop the loop at the end of its step with a
checkpoint; a second SIGINT stops at once; a signal ignored at start (SIGHUP under nohup) stays so.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import ipaddress
import os
import re
import signal
import socket
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from vitzoo.errors import ConfigError

T = TypeVar("T")
# longer than rank 0 writing a ViT-H checkpoint on a slow file system, shorter than torch's 30 min
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)


@dataclass
class Env:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    host_group: Any = None  # the group that agrees on numbers the host holds (None: the default)
    host_device: torch.device = torch.device("cpu")  # where those numbers travel: the GPU over NCCL

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


# ---------------------------------------------------------------------------- devices
# where the NVIDIA driver announces GPUs, whether or not this torch can use them
NVIDIA_PROBES = (Path("/proc/driver/nvidia/gpus"), Path("/dev/nvidia0"))
# the oldest driver branch of each CUDA major release (its minor version compatibility)
MINIMUM_DRIVER = {"11": "450", "12": "525", "13": "580"}
ARCH = re.compile(r"(sm|compute)_(\d+)(\d)([a-z]?)")


def nvidia_gpu_present(probes: tuple[Path, ...] | None = None) -> bool:
    """Whether an NVIDIA driver announces a GPU (a folder that lists GPUs, or a device node)."""
    for probe in NVIDIA_PROBES if probes is None else probes:
        try:
            if probe.is_dir() and any(probe.iterdir()) or not probe.is_dir() and probe.exists():
                return True
        except OSError:  # unreadable: no answer from this probe
            continue
    return False


def cuda_unavailable(probes: tuple[Path, ...] | None = None) -> str | None:
    """Why torch cannot use this machine's NVIDIA GPU (CPU build, old driver); None without one."""
    if not nvidia_gpu_present(probes):
        return None
    if torch.version.cuda is None:
        return (f"this machine has an NVIDIA GPU, but torch {torch.__version__} is built without "
                "CUDA; install a CUDA build of torch")
    driver = MINIMUM_DRIVER.get(torch.version.cuda.split(".")[0])
    needed = f" (driver {driver} or newer)" if driver else ""
    return (f"this machine has an NVIDIA GPU, but torch {torch.__version__} cannot use it: most "
            f"likely the NVIDIA driver is older than this torch's CUDA {torch.version.cuda} "
            f"needs{needed}; `nvidia-smi` shows the driver's version. Update the driver, or "
            "install a torch wheel built for an older CUDA")


def runs_on(arch: str, major: int, minor: int) -> bool:
    """Whether code of `arch` (of `torch.cuda.get_arch_list()`) runs on compute capability
    major.minor: sm_XY on its major generation from minor Y on, PTX compute_XY on any GPU from X.Y
    on, an architecture-specific sm_XYa on X.Y alone."""
    match = ARCH.fullmatch(arch)
    if match is None:
        return False
    kind, built, suffix = match[1], (int(match[2]), int(match[3])), match[4]
    if suffix == "a":
        return built == (major, minor)
    if kind == "sm":
        return built[0] == major and built[1] <= minor
    return built <= (major, minor)


def unsupported_gpu(index: int) -> str | None:
    """Why this torch build has no kernels for GPU `index` (too old), or None (ROCm, custom)."""
    arches = torch.cuda.get_arch_list()
    if not arches or getattr(torch.version, "hip", None):
        return None
    major, minor = torch.cuda.get_device_capability(index)
    if any(runs_on(arch, major, minor) for arch in arches):
        return None
    sm = f"sm_{major}{minor}"
    return (f"GPU {index} ({torch.cuda.get_device_name(index)}) has compute capability "
            f"{major}.{minor} ({sm}), but torch {torch.__version__} (CUDA {torch.version.cuda}) "
            f"has kernels for {', '.join(arches)} only, so every computation on it would fail. "
            f"Install a torch wheel whose build includes {sm} (`torch.cuda.get_arch_list()` lists "
            "a build's; wheels for an older CUDA, such as cu126, include older GPUs), or use "
            "--device cpu")


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """`auto` is CUDA if present, else MPS, else CPU (with a warning when a GPU is there that torch
    cannot use); `cuda` is the local rank's GPU, `cuda:N` GPU N; a missing device is an error."""
    asked = name
    cuda = torch.cuda.is_available()
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if name == "auto":
        if not cuda and (why := cuda_unavailable()) is not None:
            warnings.warn(f"--device auto: {why}; training on the {'MPS device' if mps else 'CPU'} "
                          "instead", stacklevel=2)
        name = "cuda" if cuda else "mps" if mps else "cpu"
    if torch.device(name).type == "cuda":
        if not cuda:
            why = cuda_unavailable() or "no CUDA device is available (use --device auto or cpu)"
            raise RuntimeError(f"--device {name}: {why}")
        index, gpus = torch.device(name).index, torch.cuda.device_count()
        if index is None:
            index = own_gpu(local_rank, gpus)
        elif index >= gpus:
            raise RuntimeError(f"--device {name}: there are only {gpus} visible CUDA device(s)")
        if (why := unsupported_gpu(index)) is not None:
            raise RuntimeError(f"--device {asked}: {why}")
        return torch.device("cuda", index)
    if name == "mps":
        if not mps:
            raise RuntimeError("--device mps: MPS is not available (use --device auto or cpu)")
        return torch.device("mps")
    return torch.device("cpu")


def own_gpu(local_rank: int, gpus: int) -> int:
    """The GPU of this local rank: one each, or the one GPU a process sees (a launcher binding a
    GPU per task); more processes than GPUs is an error here, not NCCL's later."""
    if gpus == 1:
        return 0
    if local_rank >= gpus:
        raise RuntimeError(f"LOCAL_RANK {local_rank} has no GPU of its own: this node runs more "
                           f"processes than its {gpus} visible CUDA device(s); start at most "
                           f"{gpus} (torchrun --nproc_per_node {gpus}) or make more GPUs visible "
                           "(CUDA_VISIBLE_DEVICES)")
    return local_rank


def node_rank(rank: int, joined: bool) -> int:
    """The rank on this node, which picks the GPU: LOCAL_RANK; in a group the caller made without
    it (`mp.spawn`), the rank modulo LOCAL_WORLD_SIZE where that is set, else the rank."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if not joined:
        return 0
    per_node = os.environ.get("LOCAL_WORLD_SIZE")
    return rank % int(per_node) if per_node else rank


def refuse_one_gpu_for_all(device: str) -> None:
    """`--device cuda:N` in every process torchrun started would put them all on GPU N."""
    if device.startswith("cuda") and torch.device(device).index is not None:
        raise ConfigError(f"--device {device} under torchrun would put every process on GPU "
                          f"{torch.device(device).index}; use --device cuda: each process then "
                          "works on its local rank's GPU (choose the GPUs with "
                          "CUDA_VISIBLE_DEVICES)")


def gpu_identity(device: torch.device) -> str:
    """What tells GPUs apart across processes that number them differently: the device's UUID."""
    return str(getattr(torch.cuda.get_device_properties(device), "uuid", device.index))


def refuse_shared_gpus(identities: list[tuple[str, str]]) -> None:
    """Each rank's (host, GPU UUID), in rank order: two ranks on one GPU are a ConfigError on every
    rank alike (NCCL would fail with "Duplicate GPU detected", or hang)."""
    ranks: dict[tuple[str, str], list[int]] = {}
    for rank, identity in enumerate(identities):
        ranks.setdefault(tuple(identity), []).append(rank)
    shared = [(host, gpu, r) for (host, gpu), r in ranks.items() if len(r) > 1]
    if shared:
        host, gpu, together = shared[0]
        raise ConfigError(f"ranks {', '.join(map(str, together))} all work on GPU {gpu} of {host}: "
                          "each process needs a GPU of its own. Start one process per GPU "
                          "(torchrun --nproc_per_node = the node's GPUs; under SLURM one task per "
                          "GPU, with --gpus-per-task=1 or --gpu-bind so each task sees its own, or "
                          "every GPU visible to every task so that LOCAL_RANK picks one)")


# ---------------------------------------------------------------------------- the process group
def setup(device: str) -> Env:
    """This process's rank, world and device; the group made when torchrun started several
    processes and none exists yet (a group the caller made is used as it is). A CUDA process's GPU
    becomes its current device: NCCL's barrier and object collectives run there."""
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
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
        atexit.register(_destroy_group)
        rank, world = dist.get_rank(), dist.get_world_size()
    if not dist.is_initialized():
        return Env(rank, world, local_rank, dev)
    env = Env(rank, world, local_rank, dev, *host_agreement(dev, warn=local_rank == 0))
    if dev.type == "cuda" and world > 1:
        refuse_shared_gpus(gather_objects((socket.gethostname(), gpu_identity(dev)), env))
    return env


def _destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# the environment variables that choose gloo's network interface (TP_SOCKET_IFNAME: TensorPipe's)
INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def host_addresses(hostname: str) -> list[str]:
    """The addresses `hostname` resolves to, in the resolver's order (gloo binds the first)."""
    return [info[4][0] for info in socket.getaddrinfo(hostname, None)]


def gloo_loopback_problem(world_size: int, environ: Mapping[str, str] = os.environ,
                          hostname: str | None = None,
                          resolve: Callable[[str], list[str]] | None = None) -> str | None:
    """Why a gloo group of this job would hang, or None: without GLOO_SOCKET_IFNAME gloo binds the
    address the host name resolves to (127.0.1.1 on Debian and Ubuntu) or the loopback, which other
    nodes cannot reach. One node (LOCAL_WORLD_SIZE is the world size) is fine."""
    if any(environ.get(name) for name in INTERFACE_VARIABLES):
        return None
    per_node = environ.get("LOCAL_WORLD_SIZE")
    if world_size <= 1 or per_node and int(per_node) == world_size:
        return None
    hostname = hostname if hostname is not None else socket.gethostname()
    loopback = "so gloo would bind the loopback"
    try:
        addresses = (resolve or host_addresses)(hostname)
    except OSError as exc:  # socket.gaierror: gloo falls back to the loopback address
        return f"the host name {hostname!r} does not resolve ({exc}), {loopback}"
    if not addresses:
        return f"the host name {hostname!r} resolves to no address, {loopback}"
    first = addresses[0].split("%")[0]  # an IPv6 address may carry its interface
    if ipaddress.ip_address(first).is_loopback:
        return (f"the host name {hostname!r} resolves to the loopback address {first}, which gloo "
                "would bind")
    return None


_HOST_AGREEMENT: dict[str, Any] = {}  # decided once per process: {"group": a gloo group or None}


def host_agreement(device: torch.device, warn: bool = True) -> tuple[Any, torch.device]:
    """The group and device over which ranks agree on host numbers (`host_max`): the default group
    when it is gloo; beside NCCL a gloo group made once, unless gloo would bind the loopback on any
    rank (agreed over NCCL first): then NCCL itself, on the device, said in a warning (`warn`)."""
    if dist.get_backend() == "gloo":
        return None, torch.device("cpu")
    if not _HOST_AGREEMENT:
        problem = gloo_loopback_problem(dist.get_world_size())
        anywhere = torch.tensor([float(problem is not None)], device=device)
        dist.all_reduce(anywhere, op=dist.ReduceOp.MAX)
        if anywhere.item():
            if problem is not None and warn:
                spans = ("spans" if os.environ.get("LOCAL_WORLD_SIZE")
                         else "may span (LOCAL_WORLD_SIZE is unset)")
                warnings.warn(f"{problem}, and this job {spans} several nodes: over gloo its ranks "
                              "could not reach each other and the job would hang, so each step's "
                              "agreement (step time, stop requests) goes over the NCCL group, on "
                              "the GPU (correct, slightly slower). Set GLOO_SOCKET_IFNAME to the "
                              "node's network interface (e.g. GLOO_SOCKET_IFNAME=eth0; `ip addr` "
                              "lists them) to agree on the host again", stacklevel=3)
            _HOST_AGREEMENT["group"] = None
        else:
            _HOST_AGREEMENT["group"] = dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    group = _HOST_AGREEMENT["group"]
    return group, (torch.device("cpu") if group is not None else device)


# ---------------------------------------------------------------------------- collectives
def all_reduce(tensor: torch.Tensor, env: Env, op=None) -> torch.Tensor:
    """Sum (or `op`) over ranks, in place; a no-op for one process."""
    if env.distributed:
        dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM)
    return tensor


def host_max(values: list[float], env: Env) -> list[float]:
    """The largest of each host number over ranks, with no device sync (`host_agreement`)."""
    if not env.distributed:
        return values
    agreed = torch.tensor(values, dtype=torch.float64, device=env.host_device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=env.host_group)
    return agreed.tolist()


def gather_strided(part: torch.Tensor, total: int, env: Env) -> torch.Tensor:
    """The `total` rows of which rank r holds rows r, r + W, r + 2W, ..., on every rank, in order,
    on `part`'s device (each share padded to the largest for all_gather)."""
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
    """Every rank's small picklable `value`, in rank order, on every rank."""
    if not env.distributed:
        return [value]
    values: list = [None] * env.world_size
    dist.all_gather_object(values, value)
    return values


class RankFailed(RuntimeError):
    """Work that every rank did failed on another rank (whose own error says why)."""


def all_or_none(work: Callable[[], T], env: Env) -> T:
    """`work()` on every rank, then an agreement on whether it failed anywhere: a rank whose work
    failed raises its error, the others RankFailed, so that none waits in the next collective."""
    try:
        result, error = work(), None
    except Exception as exc:  # noqa: BLE001 (raised below, on every rank alike)
        result, error = None, exc
    if env.distributed:
        flags = [0.0] * env.world_size
        flags[env.rank] = float(error is not None)
        failed = [rank for rank, flag in enumerate(host_max(flags, env)) if flag]
        if failed and error is None:
            raise RankFailed(f"rank(s) {', '.join(map(str, failed))} failed (their logs say why); "
                             f"rank {env.rank} stops with them")
    if error is not None:
        raise error
    return result


def barrier(env: Env) -> None:
    if env.distributed:
        dist.barrier()


# ---------------------------------------------------------------------------- stop signals
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR2", "SIGHUP")
                     if hasattr(signal, name))


@contextlib.contextmanager
def stop_signals(flag: dict):
    """STOP_SIGNALS set flag["signal"] (the first one received); the previous handlers come back on
    exit. A second SIGINT raises KeyboardInterrupt; a signal ignored on entry stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if flag.get("signal") and signum == signal.SIGINT:
            raise KeyboardInterrupt
        flag.setdefault("signal", signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS
                if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
