"""Which devices each run gets and how many runs go at once: the one assignment the plan
(`--dry-run`) estimates with and the runner carries out.

CPU: `workers` runs at once, each of `processes_per_run` gloo processes. CUDA: the visible GPUs
(their ids as this process sees them: indices, UUIDs or MIG ids) cut into disjoint sets, one run
of one process per GPU on each. SLURM: a job of `nodes` x `gpus_per_node` per run; the queue
decides how many go at once. A run's processes share its batch's micro-batches equally.
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
    launcher: str
    device: str  # "cpu" or "cuda"
    device_name: str
    processes_per_run: int
    slots: tuple[tuple[str, ...], ...]  # the runs at once, each its GPUs' ids (() on a CPU)
    threads_per_process: int
    nodes: int = 1
    present: bool = True  # False: GPUs that are not on this machine (a plan, or SLURM)
    idle_gpus: int = 0  # visible GPUs that make no whole set

    @property
    def runs_at_once(self) -> int | None:  # None under SLURM
        return None if self.launcher == "slurm" else len(self.slots)

    def keyed_threads(self, trains: bool) -> int | None:
        """The threads a run's key holds: a training run's on this machine's CPU, else None."""
        local_cpu = self.device == "cpu" and self.launcher == "local"
        return self.threads_per_process if trains and local_cpu else None

    def alone(self) -> Assignment:
        """A timing ablation's: one process, one run at a time, every thread."""
        threads = max(self.threads_per_process * self.processes_per_run, 1)
        return replace(self, processes_per_run=1, nodes=1, slots=self.slots[:1] or ((),),
                       threads_per_process=threads)

    def describe(self) -> str:
        where = (f"{self.processes_per_run} GPU(s) ({self.device_name})" if self.device == "cuda"
                 else f"{self.processes_per_run} CPU process(es) of {self.threads_per_process} "
                 f"thread(s) ({self.device_name})")
        if self.launcher == "slurm":
            return f"each run a SLURM job of {self.nodes} node(s), {where} in all (queued)"
        sets = ", ".join("{" + ",".join(s) + "}" for s in self.slots)
        sets = f" on GPU sets {sets}" if self.device == "cuda" and self.present else ""
        idle = f"; {self.idle_gpus} GPU(s) idle (no set)" if self.idle_gpus else ""
        return f"{len(self.slots)} run(s) at once, each {where}{sets}{idle}"


def visible_gpus(count: int) -> tuple[str, ...]:
    """The ids a child must be given for the `count` GPUs this process sees."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return tuple(str(i) for i in range(count))
    # CUDA stops at the first entry it cannot use: the count is what it kept
    return tuple(entry.strip() for entry in listed.split(",") if entry.strip())[:count]


def batch_share(train: Mapping) -> int:
    """The micro-batches of one step of this training: what a run's processes must divide."""
    batch, micro = int(train["batch_size"]), train.get("micro_batch")
    if micro and batch % micro:
        raise ValueError(f"batch_size={batch} is not a multiple of micro_batch={micro}")
    return batch // micro if micro else batch


def common_share(trainings: Iterable[Mapping]) -> int:
    return math.gcd(*(batch_share(t) for t in trainings))


def check_divides(processes: int, share: int, flag: str) -> None:
    if share and share % processes:
        fits = [str(p) for p in range(1, min(share, max(processes, 8)) + 1) if share % p == 0]
        raise ValueError(f"{flag} {processes}: a run's processes share its batches' {share} "
                         f"micro-batches equally; choose one of {', '.join(fits)}")


def default_per_run(visible: int, share: int) -> int:
    """GPUs per run: of the counts that divide `share`, the one keeping the most GPUs busy."""
    fits = [p for p in range(1, visible + 1) if not share or share % p == 0]
    return max(fits, key=lambda p: (visible // p * p, p))


def assign(device: str, launcher: str = "local", *, gpus_per_run: int | None = None,
           processes_per_run: int | None = None, workers: int = 1, stated_gpus: int | None = None,
           nodes: int = 1, gpus_per_node: int | None = None, share: int = 0) -> Assignment:
    """The assignment (module docstring). `stated_gpus`: a node's GPUs where none is here;
    `share`: what a run's processes must divide (`common_share`; 0: anything)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    kind = torch.device(device).type
    if kind == "cuda" and torch.device(device).index is not None:
        raise ValueError(f"--device {device} names one GPU; each run gets its own: use --device "
                         "cuda with --gpus-per-run, and CUDA_VISIBLE_DEVICES to choose")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"--device {device}: the suite runs on cpu or cuda")
    threads = torch.get_num_threads()
    if kind == "cpu":
        procs = processes_per_run or 1
        total = procs * (nodes if launcher == "slurm" else 1)
        check_divides(total, share, "--processes-per-run")
        if launcher == "slurm":
            return Assignment(launcher, "cpu", cpu_model(), total, (), max(1, threads // procs),
                              nodes)
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
    return Assignment(launcher, "cuda", name, per_run, slots,
                      max(1, (os.cpu_count() or 1) // count), 1, present, count % per_run)
