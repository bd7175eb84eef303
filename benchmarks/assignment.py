"""Which devices each run gets and how many runs go at once: the one assignment that the plan
(`--dry-run`) estimates with and the runner (benchmarks/runner.py) carries out.

On the CPU a run is `processes_per_run` gloo processes and `workers` runs share the cores; on CUDA
a run is one process per GPU of its own set, the visible GPUs cut into disjoint sets, one run on
each. A set holds the GPUs' ids as the parent process sees them (its CUDA_VISIBLE_DEVICES: indices,
UUIDs or MIG ids), so that a suite started on GPUs 4-7 trains on 4-7. Under SLURM a run is a job of
`nodes` x `gpus_per_node`, and the queue decides how many go at once. A run's processes share its
global batch's micro-batches equally: a count that cannot is refused before anything starts.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Iterable, Mapping

import torch

from benchmarks.machine import cpu_model

LAUNCHERS = ("local", "slurm")


@dataclass(frozen=True)
class Assignment:
    launcher: str  # one of LAUNCHERS
    device: str  # "cpu" or "cuda"
    device_name: str  # the GPU's or the CPU's model
    processes_per_run: int  # data-parallel processes of one run: one per GPU on CUDA
    slots: tuple[tuple[str, ...], ...]  # runs going at once, each its GPUs' ids (() on a CPU)
    threads_per_process: int
    nodes: int = 1  # nodes of one run (SLURM)
    present: bool = True  # False: a plan for GPUs that are not on this machine (--gpus)
    idle_gpus: int = 0  # visible GPUs no run gets (they do not divide into --gpus-per-run)

    @property
    def runs_at_once(self) -> int | None:  # None under SLURM: the queue decides
        return None if self.launcher == "slurm" else len(self.slots)

    def keyed_threads(self, trains: bool) -> int | None:
        """The threads a run's key holds (benchmarks.suite.Run): a training run's on this machine's
        CPU, where they enter its numbers; None on GPUs, under SLURM and for timings."""
        local_cpu = self.device == "cpu" and self.launcher == "local"
        return self.threads_per_process if trains and local_cpu else None

    def alone(self) -> Assignment:
        """A timing ablation's: one process, one run at a time, every thread of the assignment."""
        threads = max(self.threads_per_process * self.processes_per_run, 1)
        return replace(self, processes_per_run=1, nodes=1, slots=self.slots[:1] or ((),),
                       threads_per_process=threads)

    def describe(self) -> str:
        where = (f"{self.processes_per_run} GPU(s) ({self.device_name})" if self.device == "cuda"
                 else f"{self.processes_per_run} CPU process(es) of {self.threads_per_process} "
                 f"thread(s) ({self.device_name})")
        if self.launcher == "slurm":
            return f"each run a SLURM job of {self.nodes} node(s), {where} in all (queued)"
        sets = ", ".join("{" + ",".join(map(str, s)) + "}" for s in self.slots)
        sets = f" on GPU sets {sets}" if self.device == "cuda" and self.present else ""
        idle = f"; {self.idle_gpus} GPU(s) idle (they make no set of --gpus-per-run)"
        idle = idle if self.idle_gpus else ""
        return f"{len(self.slots)} run(s) at once, each {where}{sets}{idle}"


def visible_gpus(count: int) -> tuple[str, ...]:
    """The ids of the `count` GPUs this process sees, as a child must name them: the entries of
    CUDA_VISIBLE_DEVICES (indices, UUIDs or MIG ids) where it is set, else 0 .. count-1."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return tuple(str(i) for i in range(count))
    # CUDA stops at the first entry it cannot use: the count is what it kept
    return tuple(entry.strip() for entry in listed.split(",") if entry.strip())[:count]


def batch_share(train: Mapping) -> int:
    """How many micro-batches a step of this training is: what a run's processes must divide."""
    batch, micro = int(train["batch_size"]), train.get("micro_batch")
    if micro and batch % micro:
        raise ValueError(f"batch_size={batch} is not a multiple of micro_batch={micro}")
    return batch // micro if micro else batch


def common_share(trainings: Iterable[Mapping]) -> int:
    """The largest number every training's `batch_share` is a multiple of (0: no training)."""
    return math.gcd(*(batch_share(t) for t in trainings))


def check_divides(processes: int, share: int, what: str) -> None:
    """Refuse a run of `processes` processes that cannot share its batches' micro-batches."""
    if share and share % processes:
        fits = [str(p) for p in range(1, share + 1) if share % p == 0 and p <= max(processes, 8)]
        raise ValueError(f"{what} {processes}: each process of a run takes an equal share of its "
                         f"batch's micro-batches, and these runs' batches hold {share} "
                         "micro-batches (batch_size must be a multiple of processes x "
                         f"micro_batch); choose one of {', '.join(fits)}")


def default_per_run(visible: int, share: int) -> int:
    """GPUs per run when none is stated: of the counts that divide `share`, the one that keeps the
    most GPUs busy, the larger on a tie."""
    fits = [p for p in range(1, visible + 1) if not share or share % p == 0]
    return max(fits, key=lambda p: (visible // p * p, p))


def assign(device: str, launcher: str = "local", *, gpus_per_run: int | None = None,
           processes_per_run: int | None = None, workers: int = 1, stated_gpus: int | None = None,
           nodes: int = 1, gpus_per_node: int | None = None, share: int = 0) -> Assignment:
    """Which devices each run gets and how many go at once. The CPU: `workers` runs at once of
    `processes_per_run` gloo processes each. CUDA: the visible GPUs cut into disjoint sets of
    `gpus_per_run`, one run on each. SLURM: a job of `nodes` x `gpus_per_node` per run, planned for
    the compute nodes' GPUs, not this login node's. `stated_gpus`: a node's GPUs where none is
    here; `share`: what a run's processes must divide (`common_share`; 0: anything)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    kind = torch.device(device).type
    if kind == "cuda" and torch.device(device).index is not None:
        raise ValueError(f"--device {device} names one GPU; each run gets its own GPUs: use "
                         "--device cuda with --gpus-per-run, and CUDA_VISIBLE_DEVICES to choose")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"--device {device}: the suite runs on cpu or cuda")
    threads = torch.get_num_threads()
    if kind == "cpu":
        procs = processes_per_run or 1
        if launcher == "slurm":
            check_divides(procs * nodes, share, "--processes-per-run")
            return Assignment(launcher, "cpu", cpu_model(), procs * nodes, (),
                              max(1, threads // procs), nodes)
        check_divides(procs, share, "--processes-per-run")
        return Assignment(launcher, "cpu", cpu_model(), procs, ((),) * workers,
                          max(1, threads // (workers * procs)))
    if launcher == "slurm":
        per_node = gpus_per_node or stated_gpus or 8
        check_divides(per_node * nodes, share, "--nodes x --gpus-per-node =")
        return Assignment(launcher, "cuda", "a GPU of the cluster", per_node * nodes, (), 1, nodes,
                          False)
    present = torch.cuda.is_available()
    count = torch.cuda.device_count() if present else (stated_gpus or 8)
    ids = visible_gpus(count) if present else tuple(str(i) for i in range(count))
    per_run = gpus_per_run or default_per_run(count, share)
    if per_run > count:
        raise ValueError(f"--gpus-per-run {per_run}: this machine has {count} visible GPU(s)")
    check_divides(per_run, share, "--gpus-per-run")
    slots = tuple(ids[i * per_run:(i + 1) * per_run] for i in range(count // per_run))
    name = torch.cuda.get_device_name(0) if present else "a GPU that is not here"
    threads = max(1, (os.cpu_count() or 1) // count)
    return Assignment(launcher, "cuda", name, per_run, slots, threads, 1, present, count % per_run)
