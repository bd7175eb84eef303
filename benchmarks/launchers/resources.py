"""What a run's SLURM job asks for, decided on the submitting machine: a login node, which sees neither
the compute nodes' CPUs nor their GPUs, so nothing here is read from the machine in hand.

- CPUs per task (`--cpus-per-task`): the run's loader workers + 2 (the training process and its
  main-thread work beside them); inside the job a task's torch threads are its CPUs less its loader
  workers. srun is given the same count: Slurm 22.05 to 23.02 do not pass sbatch's on to srun.
- Memory per task (`--mem-per-task-gb`): MEM_BASE_GB for the training process (torch and the CUDA
  context, the model, the optimizer's state copied out for a checkpoint: a ViT-L/16's is 3.6 GB) and
  MEM_PER_LOADER_WORKER_GB per loader worker (decoded batches in flight, the dataset's file list);
  sbatch's `--mem` is that times the tasks of a node.
- The time limit: `--time-limit-min`, else the plan's minutes for the run x 1.5, at least 10 minutes;
  never above the partition's MaxTime (sinfo), clamped to it with a note (a run that reaches its limit
  is requeued and resumes from its checkpoint). A plan without minutes (it found a problem) is refused.
- The warning before the limit (`--signal=USR2@delay`): the loop acts on it at a step's end, so the
  delay covers the longest evaluation (validation during training, the test set, few-shot features;
  from the plan) x 1.5, at least MIN_SIGNAL_DELAY_S, plus CHECKPOINT_WRITE_S to write the checkpoint.
"""

from __future__ import annotations

import math
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.launchers.assign import Assignment

CPUS_BESIDE_LOADER = 2
MEM_BASE_GB = 8.0
MEM_PER_LOADER_WORKER_GB = 2.0
LIMIT_MARGIN = 1.5  # the time limit over the plan's minutes for a run
MIN_LIMIT_MIN = 10.0
MIN_SIGNAL_DELAY_S = 120
EVALUATION_MARGIN = 1.5  # the warning's delay over the plan's longest evaluation
CHECKPOINT_WRITE_S = 60  # a ViT-L/16 checkpoint with AdamW's moments, 3.6 GB, at 60 MB/s to a busy shared file system
MIN_WORK_S = 5 * 60  # a job's least training time before its warning: a shorter limit only requeues


@dataclass(frozen=True)
class SlurmOptions:
    """What a job asks the cluster for (flags of `python -m benchmarks`); None: the default said."""

    partition: str | None = None  # None: the cluster's default partition
    account: str | None = None
    time_limit_min: float | None = None  # None: from the plan, with a margin
    cpus_per_task: int | None = None  # None: the run's loader workers + 2
    mem_per_task_gb: float | None = None  # None: MEM_BASE_GB + MEM_PER_LOADER_WORKER_GB per loader worker
    signal_delay_s: int | None = None  # None: MIN_SIGNAL_DELAY_S + CHECKPOINT_WRITE_S (the suite's: from its plan)
    max_requeues: int = 20  # time limits a run may reach (each resumes from its checkpoint)


def loader_workers(train: dict) -> int:
    return int(train.get("num_workers") or 0)


def default_cpus_per_task(train: dict) -> int:
    return loader_workers(train) + CPUS_BESIDE_LOADER


def default_mem_per_task_gb(train: dict) -> float:
    return MEM_BASE_GB + MEM_PER_LOADER_WORKER_GB * loader_workers(train)


def signal_delay_s(longest_evaluation_min: float) -> int:
    """Seconds between the warning and the kill: the longest evaluation with a margin, at least
    MIN_SIGNAL_DELAY_S, and the time to write a checkpoint."""
    evaluation = EVALUATION_MARGIN * 60 * longest_evaluation_min if math.isfinite(longest_evaluation_min) else 0.0
    return int(math.ceil(max(MIN_SIGNAL_DELAY_S, evaluation) + CHECKPOINT_WRITE_S))


def slurm_minutes(text: str) -> float | None:
    """Minutes of a SLURM time ("infinite", "days-hours:minutes:seconds", "hours:minutes:seconds",
    "minutes:seconds", "minutes"); None for no limit, or for what is not a time."""
    text = text.strip()
    if text.lower() in ("infinite", "unlimited", "none", "n/a", ""):
        return None
    days, _, clock = text.rpartition("-")
    try:
        parts = [int(p) for p in clock.split(":")]
        day_minutes = int(days) * 24 * 60 if days else 0
    except ValueError:
        return None
    if days:  # days-hours[:minutes[:seconds]]
        parts += [0] * (3 - len(parts))
        return day_minutes + parts[0] * 60 + parts[1] + parts[2] / 60
    if len(parts) == 3:
        return parts[0] * 60 + parts[1] + parts[2] / 60
    if len(parts) == 2:
        return parts[0] + parts[1] / 60
    return float(parts[0])


def partition_max_min(partition: str | None) -> float | None:
    """The partition's MaxTime in minutes (the default partition's, marked `*` by sinfo, when None);
    None when unlimited or when sinfo does not say."""
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P %l", *(["-p", partition] if partition else [])],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        fields = line.split()
        if len(fields) >= 2 and (fields[0].rstrip("*") == partition if partition else fields[0].endswith("*")):
            return slurm_minutes(fields[1])
    return None


@dataclass(frozen=True)
class JobRequest:
    """What one run's job asks for."""

    launcher: str
    nodes: int
    tasks_per_node: int
    gpus_per_node: int  # 0 on the CPU
    cpus_per_task: int
    mem_per_task_gb: float
    time_limit_min: int
    signal_delay_s: int
    partition: str | None = None
    account: str | None = None
    max_requeues: int = 20
    note: str = ""  # why the time limit is not the one asked for

    def describe(self) -> str:
        gpus = f", {self.gpus_per_node} GPU(s) per node" if self.gpus_per_node else ""
        where = "" if self.launcher != "slurm" else (
            f" on partition {self.partition or '(the default)'}" + (f", account {self.account}" if self.account else "")
            + f"; --cpus-per-task {self.cpus_per_task} (sbatch and srun), --mem {self.mem_gb_per_node:g}GB per node "
            f"({self.mem_per_task_gb:g} GB per task), --requeue, srun --kill-on-bad-exit=1")
        return (f"{self.launcher} jobs: {self.nodes} node(s) x {self.tasks_per_node} task(s){gpus}{where}; time limit "
                f"{self.time_limit_min} min{self.note}; USR2 {self.signal_delay_s} s before it (the longest "
                f"evaluation and a checkpoint; --signal-delay-s)")

    @property
    def mem_gb_per_node(self) -> float:
        return math.ceil(self.mem_per_task_gb * self.tasks_per_node)


def job_request(assignment: Assignment, options: SlurmOptions, run: Any, minutes: float,
                partition_max: float | None = None) -> JobRequest:
    """The run's job on this assignment: see the module docstring. Raises ValueError for a run whose plan
    has no minutes (and no --time-limit-min), and for a limit that leaves less than MIN_WORK_S before
    the warning."""
    train = run.config["train"]
    delay = options.signal_delay_s or signal_delay_s(0.0)
    if options.time_limit_min is not None:
        limit = options.time_limit_min
    elif not math.isfinite(minutes):
        raise ValueError(f"the plan has no time for run {run.label!r} (it found a problem: see the plan); fix it, or "
                         "give --time-limit-min")
    else:
        limit = max(MIN_LIMIT_MIN, LIMIT_MARGIN * minutes)
    limit, note = math.ceil(limit), ""
    if partition_max is not None and limit > partition_max:
        note = (f" (clamped from {limit} min to partition {options.partition or '(the default)'}'s MaxTime: the run "
                "is requeued at the limit and resumes from its checkpoint)")
        limit = math.floor(partition_max)
    if limit * 60 - delay < MIN_WORK_S:
        raise ValueError(f"a time limit of {limit} min with USR2 {delay} s before it leaves under {MIN_WORK_S // 60} "
                         f"minutes of training per attempt{note}; give a longer --time-limit-min (or a partition that "
                         "allows one), or a shorter --signal-delay-s")
    per_node = assignment.processes_per_run // assignment.nodes
    return JobRequest(assignment.launcher, assignment.nodes, per_node, per_node if assignment.device == "cuda" else 0,
                      options.cpus_per_task or default_cpus_per_task(train),
                      options.mem_per_task_gb or default_mem_per_task_gb(train), limit, delay,
                      options.partition, options.account, options.max_requeues, note)


def executor(assignment: Assignment, folder: Path, name: str, request: JobRequest):
    """A submitit executor for the job `request` describes: SLURM's, or the local one (submitit-local,
    whose GPU set the job sets itself: RunJob's `visible`)."""
    import submitit

    if assignment.launcher == "submitit-local":
        made = submitit.LocalExecutor(folder=str(folder), max_num_timeout=request.max_requeues)
        made.update_parameters(timeout_min=request.time_limit_min, tasks_per_node=request.tasks_per_node, nodes=1,
                               gpus_per_node=0, signal_delay_s=request.signal_delay_s)
        return made
    made = submitit.SlurmExecutor(folder=str(folder), max_num_timeout=request.max_requeues)
    made.update_parameters(job_name=name, nodes=request.nodes, ntasks_per_node=request.tasks_per_node,
                           gpus_per_node=request.gpus_per_node or None, cpus_per_task=request.cpus_per_task,
                           mem=f"{request.mem_gb_per_node:g}GB", time=request.time_limit_min,
                           signal_delay_s=request.signal_delay_s,
                           srun_args=[f"--cpus-per-task={request.cpus_per_task}", "--kill-on-bad-exit=1"],
                           additional_parameters={"requeue": True},
                           **({"partition": request.partition} if request.partition else {}),
                           **({"account": request.account} if request.account else {}))
    return made


__all__ = ["CHECKPOINT_WRITE_S", "JobRequest", "MEM_BASE_GB", "MEM_PER_LOADER_WORKER_GB", "MIN_SIGNAL_DELAY_S",
           "SlurmOptions", "default_cpus_per_task", "default_mem_per_task_gb", "executor", "job_request",
           "partition_max_min", "signal_delay_s", "slurm_minutes"]
