"""Which devices each run gets and how many runs go at once: the one assignment that the plan
(`--dry-run`) estimates with and the launchers carry out.

On the CPU a run is `processes_per_run` processes (gloo) and `runs_at_once` runs share the cores; on
CUDA a run is one process per GPU of its own set and the visible GPUs are cut into disjoint sets, one run
on each. Under SLURM a run is a job of `nodes` x `gpus_per_node` GPUs and the cluster's queue decides how
many go at once.

A GPU set holds the GPUs' ids as the parent process sees them: the entries of its CUDA_VISIBLE_DEVICES
(indices, UUIDs or MIG ids), so that a suite started with CUDA_VISIBLE_DEVICES=4,5,6,7 trains on GPUs
4-7, and two suites side by side on 0-3 and 4-7 never meet.

A run's processes share its global batch: each takes `batch / (processes x micro_batch)` micro-batches a
step, so the processes must divide `batch / micro_batch` (`batch_share`). The default GPUs per run is the
count that does and keeps the most GPUs busy; a stated count that does not is refused before anything
starts (`check_divides`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from benchmarks.machine import cpu_model

LAUNCHERS = ("local", "slurm", "submitit-local")  # submitit-local: SLURM's code path on this machine


@dataclass(frozen=True)
class Assignment:
    launcher: str  # one of LAUNCHERS
    device: str  # "cpu" or "cuda"
    device_name: str  # the GPU's or the CPU's model
    processes_per_run: int  # data-parallel processes of one run: one per GPU on CUDA
    slots: tuple[tuple[str, ...], ...]  # runs going at once, each its GPUs' visible ids (() on the CPU)
    threads_per_process: int  # CPU threads of each process
    nodes: int = 1  # nodes of one run (SLURM)
    present: bool = True  # False: a plan for GPUs that are not on this machine (--gpus)
    idle_gpus: int = 0  # visible GPUs no run gets (they do not divide into --gpus-per-run)

    @property
    def runs_at_once(self) -> int | None:
        """How many runs train at the same time; None under SLURM (the queue decides)."""
        return None if self.launcher == "slurm" else len(self.slots)

    def keyed_threads(self, trains: bool) -> int | None:
        """The threads per process a run's key holds (`benchmarks.suite.Run`): a training run's on this
        machine's CPU, where they are known before it runs and enter its numbers; None on GPUs (the CPU's
        threads do not enter the GPU's sums), under SLURM (the job's CPUs decide) and for timings."""
        return self.threads_per_process if trains and self.device == "cpu" and self.launcher == "local" else None

    @property
    def gpus_per_run(self) -> int:
        return self.processes_per_run if self.device == "cuda" else 0

    def describe(self) -> str:
        where = (f"{self.processes_per_run} GPU(s) ({self.device_name})" if self.device == "cuda"
                 else f"{self.processes_per_run} CPU process(es) of {self.threads_per_process} thread(s) ({self.device_name})")
        if self.launcher == "slurm":
            return f"each run a SLURM job of {self.nodes} node(s), {where} in all; the queue decides how many go at once"
        sets = ""
        if self.device == "cuda" and self.present:
            sets = " on GPU sets " + ", ".join("{" + ",".join(map(str, s)) + "}" for s in self.slots)
        idle = f"; {self.idle_gpus} GPU(s) idle (they do not make a set of --gpus-per-run)" if self.idle_gpus else ""
        via = "" if self.launcher == "local" else f" through {self.launcher}"
        return f"{len(self.slots)} run(s) at once, each {where}{sets}{via}{idle}"


def resolve_device(device: str) -> str:
    """`auto` is CUDA where present, else the CPU (a run of several processes has no MPS path)."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind = torch.device(device).type
    if kind == "cuda" and torch.device(device).index is not None:
        raise ValueError(f"--device {device} names one GPU; the suite gives each run its own GPUs: use --device cuda "
                         "with --gpus-per-run, and CUDA_VISIBLE_DEVICES to choose which GPUs")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"--device {device}: the suite runs on cpu or cuda")
    return kind


def visible_gpus(count: int, environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The ids of the `count` GPUs this process sees, as a child process must name them: the entries of
    CUDA_VISIBLE_DEVICES where it is set (an index, a UUID or a MIG id each), else 0 .. count-1."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return tuple(str(i) for i in range(count))
    ids = [entry.strip() for entry in listed.split(",") if entry.strip()]
    if len(ids) < count:
        raise ValueError(f"CUDA_VISIBLE_DEVICES={listed!r} names {len(ids)} GPU(s) but {count} are visible")
    return tuple(ids[:count])  # CUDA stops at the first entry it cannot use: the count is what it kept


def batch_share(train: Mapping) -> int:
    """How many micro-batches a step of this training is: what the processes of a run must divide."""
    batch, micro = int(train["batch_size"]), train.get("micro_batch")
    if micro and batch % micro:
        raise ValueError(f"batch_size={batch} is not a multiple of micro_batch={micro}")
    return batch // micro if micro else batch


def common_share(trainings: Iterable[Mapping]) -> int:
    """The largest number every training's `batch_share` is a multiple of (0: no training)."""
    return math.gcd(*(batch_share(t) for t in trainings)) if trainings else 0


def check_divides(processes: int, share: int, what: str) -> None:
    """Refuse a run of `processes` processes whose trainings' batches they cannot share (`share`, from
    `common_share`), naming the counts that can."""
    if share and share % processes:
        fits = ", ".join(str(p) for p in range(1, share + 1) if share % p == 0 and p <= max(processes, 8))
        raise ValueError(f"{what} {processes}: every process of a run takes an equal share of its global batch's "
                         f"micro-batches, and these runs' batches hold {share} micro-batches (the greatest count common "
                         f"to all), which {processes} processes cannot share (batch_size must be a multiple of processes "
                         f"x micro_batch); choose one of {fits}")


def default_per_run(visible: int, share: int) -> int:
    """GPUs per run when none is stated: of the counts that divide `share`, the one that keeps the most
    GPUs busy, the larger on a tie (every GPU for one run where the batch allows it)."""
    fits = [p for p in range(1, visible + 1) if not share or share % p == 0]
    return max(fits, key=lambda p: (visible // p * p, p))


def assign(device: str, launcher: str = "local", *, gpus_per_run: int | None = None,
           processes_per_run: int | None = None, workers: int = 1, stated_gpus: int | None = None,
           nodes: int = 1, gpus_per_node: int | None = None, share: int = 0) -> Assignment:
    """The assignment for these options (see the module docstring). `stated_gpus`: with no GPU here,
    how many a node has (a plan for another machine); `workers`: runs at once on the CPU; `share`: what
    a run's processes must divide (`common_share` of its trainings; 0: anything)."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; choose one of {', '.join(LAUNCHERS)}")
    kind = resolve_device(device)
    threads = torch.get_num_threads()
    if kind == "cpu":
        procs = processes_per_run or 1
        if procs < 1 or workers < 1:
            raise ValueError("--processes-per-run and --workers must be at least 1")
        check_divides(procs * (nodes if launcher == "slurm" else 1), share, "--processes-per-run")
        if launcher == "slurm":
            return Assignment(launcher, "cpu", cpu_model(), procs * nodes, (), max(1, threads // procs), nodes)
        return Assignment(launcher, "cpu", cpu_model(), procs, ((),) * workers, max(1, threads // (workers * procs)))
    present = torch.cuda.is_available()
    name = torch.cuda.get_device_name(0) if present else "a GPU that is not here"
    cpus = os.cpu_count() or 1
    if launcher == "slurm":  # the compute nodes' GPUs, not this (login) node's: planned as stated (--gpu-tflops)
        per_node = gpus_per_node or stated_gpus or 8
        check_divides(per_node * nodes, share, "--nodes x --gpus-per-node =")
        return Assignment(launcher, "cuda", "a GPU of the cluster", per_node * nodes, (), 1, nodes, False)
    count = torch.cuda.device_count() if present else (stated_gpus or 8)
    ids = visible_gpus(count) if present else tuple(str(i) for i in range(count))
    per_run = gpus_per_run or default_per_run(count, share)
    if per_run < 1 or per_run > count:
        raise ValueError(f"--gpus-per-run {per_run}: this machine has {count} visible GPU(s)")
    check_divides(per_run, share, "--gpus-per-run")
    slots = tuple(ids[i * per_run:(i + 1) * per_run] for i in range(count // per_run))
    return Assignment(launcher, "cuda", name, per_run, slots, max(1, cpus // count), 1, present, count % per_run)


__all__ = ["LAUNCHERS", "Assignment", "assign", "batch_share", "check_divides", "common_share", "default_per_run",
           "resolve_device", "visible_gpus"]
