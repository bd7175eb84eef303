"""Which devices each run gets and how many runs go at once: the one assignment that the plan
(`--dry-run`) estimates with and the launchers carry out.

On the CPU a run is `processes_per_run` processes (gloo) and `runs_at_once` runs share the cores; on
CUDA a run is one process per GPU of its own set (`--gpus-per-run`, default every visible GPU) and the
visible GPUs are cut into disjoint sets, one run on each. Under SLURM a run is a job of `nodes` x
`gpus_per_node` GPUs and the cluster's queue decides how many go at once.
"""

from __future__ import annotations

import os
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
    slots: tuple[tuple[int, ...], ...]  # runs going at once, each its GPU indices (() on the CPU)
    threads_per_process: int  # CPU threads of each process
    nodes: int = 1  # nodes of one run (SLURM)
    present: bool = True  # False: a plan for GPUs that are not on this machine (--gpus)
    idle_gpus: int = 0  # visible GPUs no run gets (they do not divide into --gpus-per-run)

    @property
    def runs_at_once(self) -> int | None:
        """How many runs train at the same time; None under SLURM (the queue decides)."""
        return None if self.launcher == "slurm" else len(self.slots)

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


def assign(device: str, launcher: str = "local", *, gpus_per_run: int | None = None,
           processes_per_run: int | None = None, workers: int = 1, stated_gpus: int | None = None,
           nodes: int = 1, gpus_per_node: int | None = None) -> Assignment:
    """The assignment for these options (see the module docstring). `stated_gpus`: with no GPU here,
    how many a node has (a plan for another machine); `workers`: runs at once on the CPU."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; choose one of {', '.join(LAUNCHERS)}")
    kind = resolve_device(device)
    threads = torch.get_num_threads()
    if kind == "cpu":
        procs = processes_per_run or 1
        if procs < 1 or workers < 1:
            raise ValueError("--processes-per-run and --workers must be at least 1")
        if launcher == "slurm":
            return Assignment(launcher, "cpu", cpu_model(), procs * nodes, (), max(1, threads // procs), nodes)
        return Assignment(launcher, "cpu", cpu_model(), procs, ((),) * workers, max(1, threads // (workers * procs)))
    present = torch.cuda.is_available()
    name = torch.cuda.get_device_name(0) if present else "a GPU that is not here"
    cpus = os.cpu_count() or 1
    if launcher == "slurm":  # the compute nodes' GPUs, not this (login) node's: planned as stated (--gpu-tflops)
        per_node = gpus_per_node or stated_gpus or 8
        return Assignment(launcher, "cuda", "a GPU of the cluster", per_node * nodes, (), 1, nodes, False)
    visible = torch.cuda.device_count() if present else (stated_gpus or 8)
    per_run = gpus_per_run or visible
    if per_run < 1 or per_run > visible:
        raise ValueError(f"--gpus-per-run {per_run}: this machine has {visible} visible GPU(s)")
    slots = tuple(tuple(range(i * per_run, (i + 1) * per_run)) for i in range(visible // per_run))
    return Assignment(launcher, "cuda", name, per_run, slots, max(1, cpus // visible), 1, present, visible % per_run)


__all__ = ["LAUNCHERS", "Assignment", "assign", "resolve_device"]
