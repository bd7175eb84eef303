"""Runs as SLURM jobs through submitit's SlurmExecutor, submitted from a login node, which sees
neither the compute nodes' CPUs nor their GPUs: nothing here is read from the machine in hand.

A run is one job of `nodes` x tasks, one process per GPU (gloo processes on the CPU). Every task
calls `RunJob`, which trains the run in its folder; rank 0 stores its record, so the results are
complete whether or not anyone waits. A job asks for its loader workers + 2 CPUs a task (srun too:
Slurm 22.05 to 23.02 do not pass sbatch's on), a base memory and a share per loader worker,
--requeue, srun's --kill-on-bad-exit (a failing rank ends the job), and the plan's time x 1.5
within the partition's MaxTime, with USR2 before it, long enough for the longest evaluation and a
checkpoint. On USR2 or a preemption the loop checkpoints, rank 0 has submitit requeue the job, and
it resumes. JOB in the run's folder names its job: a later invocation follows it, or submits the
run again once it ended without a record (resuming from its checkpoint).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from benchmarks.assignment import Assignment
from benchmarks.suite import ResultStore, Run, make_record, run_folder
from vitzoo.io import write_text

JOB = "job.json"  # a run's job, in its folder
MEM_BASE_GB = 8.0  # the training process: torch, the CUDA context, the model, a checkpoint's copy
MEM_PER_LOADER_WORKER_GB = 2.0
CHECKPOINT_WRITE_S = 60  # a ViT-L/16 checkpoint with AdamW's moments (3.6 GB) to a busy shared disk
MIN_WORK_S = 5 * 60  # a job's least training before its warning: a shorter limit only requeues
# what a launcher in the submitting shell leaves, which sbatch would export to the job's ranks
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                      "MASTER_ADDR", "MASTER_PORT", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
UNSURE = ("UNKNOWN", "PREEMPTED")  # states that do not say whether a job lives (sacct's lag)


@dataclass(frozen=True)
class SlurmOptions:
    """What a job asks the cluster for (flags of `python -m benchmarks`); None: the default."""

    partition: str | None = None
    account: str | None = None
    time_limit_min: float | None = None
    cpus_per_task: int | None = None
    mem_per_task_gb: float | None = None
    signal_delay_s: int | None = None
    max_requeues: int = 20


def signal_delay_s(longest_evaluation_min: float) -> int:
    """Seconds from the warning to the kill: the longest evaluation x 1.5, at least 120 s, and the
    time to write a checkpoint."""
    evaluation = 90 * longest_evaluation_min if math.isfinite(longest_evaluation_min) else 0.0
    return int(math.ceil(max(120, evaluation) + CHECKPOINT_WRITE_S))


def slurm_minutes(text: str) -> float | None:
    """Minutes of a SLURM time (D-HH:MM:SS, HH:MM:SS, MM:SS, MM); None for "infinite" and such."""
    days, _, clock = text.strip().rpartition("-")
    try:
        parts = [int(p) for p in clock.split(":")]
        minutes = int(days) * 24 * 60 if days else 0
    except ValueError:
        return None
    if days:  # D-HH[:MM[:SS]]
        parts += [0] * (3 - len(parts))
    if len(parts) == 1:
        return float(minutes + parts[0])
    return minutes + sum(p * 60 ** i for i, p in enumerate(reversed(parts))) / 60


def partition_max_min(partition: str | None) -> float | None:
    """The partition's MaxTime in minutes (sinfo marks the default one `*`); None when unlimited."""
    asked = ["-p", partition] if partition else []
    out = subprocess.run(["sinfo", "-h", "-o", "%P %l", *asked], capture_output=True, text=True,
                         timeout=120)
    for fields in (line.split() for line in out.stdout.splitlines()):
        name = fields[0] if fields else ""
        ours = name.rstrip("*") == partition if partition else name.endswith("*")
        if len(fields) >= 2 and ours:
            return slurm_minutes(fields[1])
    return None


@dataclass(frozen=True)
class JobRequest:
    """What one run's job asks for."""

    nodes: int
    tasks_per_node: int
    gpus_per_node: int  # 0 on the CPU
    cpus_per_task: int
    mem_per_task_gb: float
    time_limit_min: int
    signal_delay_s: int
    options: SlurmOptions
    note: str = ""  # why the time limit is not the one asked for

    @property
    def mem_gb_per_node(self) -> float:
        return math.ceil(self.mem_per_task_gb * self.tasks_per_node)

    def describe(self) -> str:
        gpus = f", {self.gpus_per_node} GPU(s) per node" if self.gpus_per_node else ""
        where = self.options.partition or "(the default)"
        where += f", account {self.options.account}" if self.options.account else ""
        return (f"slurm jobs: {self.nodes} node(s) x {self.tasks_per_node} task(s){gpus} on "
                f"partition {where}; --cpus-per-task {self.cpus_per_task} (sbatch and srun), --mem "
                f"{self.mem_gb_per_node:g}GB per node, --requeue, srun --kill-on-bad-exit=1; time "
                f"limit {self.time_limit_min} min{self.note}; USR2 {self.signal_delay_s} s before "
                "it")

    def executor(self, folder: Path, name: str):
        import submitit

        where = {key: value for key, value in (("partition", self.options.partition),
                                               ("account", self.options.account)) if value}
        made = submitit.SlurmExecutor(folder=str(folder), max_num_timeout=self.options.max_requeues)
        made.update_parameters(
            job_name=name, nodes=self.nodes, ntasks_per_node=self.tasks_per_node,
            gpus_per_node=self.gpus_per_node or None, cpus_per_task=self.cpus_per_task,
            mem=f"{self.mem_gb_per_node:g}GB", time=self.time_limit_min,
            signal_delay_s=self.signal_delay_s, additional_parameters={"requeue": True},
            srun_args=[f"--cpus-per-task={self.cpus_per_task}", "--kill-on-bad-exit=1"], **where)
        return made


def job_request(assignment: Assignment, options: SlurmOptions, run: Run, minutes: float,
                partition_max: float | None = None) -> JobRequest:
    """The run's job (the module docstring says how). Raises ValueError for a run the plan has no
    minutes for (without --time-limit-min), and for a limit that leaves under MIN_WORK_S of work."""
    workers = int(run.config["train"].get("num_workers") or 0)
    delay = options.signal_delay_s or signal_delay_s(0.0)
    if options.time_limit_min is None and not math.isfinite(minutes):
        raise ValueError(f"the plan has no time for run {run.label!r} (it found a problem: see the "
                         "plan); fix it, or give --time-limit-min")
    limit, note = math.ceil(options.time_limit_min or max(10.0, 1.5 * minutes)), ""
    if partition_max is not None and limit > partition_max:
        note = (f" (clamped from {limit} min to the partition's MaxTime: the run is requeued at "
                "the limit and resumes from its checkpoint)")
        limit = math.floor(partition_max)
    if limit * 60 - delay < MIN_WORK_S:
        raise ValueError(f"a time limit of {limit} min with USR2 {delay} s before it leaves under "
                         f"{MIN_WORK_S // 60} minutes of training per attempt{note}; give a longer "
                         "--time-limit-min (or a partition that allows one), or a shorter "
                         "--signal-delay-s")
    per_node = assignment.processes_per_run // assignment.nodes
    return JobRequest(assignment.nodes, per_node, per_node if assignment.device == "cuda" else 0,
                      options.cpus_per_task or workers + 2,
                      options.mem_per_task_gb or MEM_BASE_GB + MEM_PER_LOADER_WORKER_GB * workers,
                      limit, delay, options, note)


# ---------------------------------------------------------------------------- inside a job
def rendezvous_port(job_id: str) -> int:
    """From the job id: jobs submitted together (maybe on one node) differ; a requeue keeps it."""
    return 20000 + int(re.sub(r"\D", "", job_id) or 0) % 40000


def restrict_gpus(device: str, environ: dict | os._Environ = os.environ) -> None:
    """A task's CUDA_VISIBLE_DEVICES: none for a CPU run; SLURM's for a GPU run, never one carried
    in from the submitting shell (SLURM sets SLURM_JOB_GPUS beside its own)."""
    if device == "cpu":
        environ["CUDA_VISIBLE_DEVICES"] = ""
    elif not (environ.get("SLURM_JOB_GPUS") or environ.get("SLURM_STEP_GPUS")):
        environ.pop("CUDA_VISIBLE_DEVICES", None)


def task_threads(run: Run, environ: dict | os._Environ = os.environ) -> int:
    """A task's torch threads: its CPUs (SLURM_CPUS_PER_TASK) less its loader workers (>= 1)."""
    workers = int(run.config["train"].get("num_workers") or 0)
    return max(1, int(environ.get("SLURM_CPUS_PER_TASK", workers + 1)) - workers)


def export_rendezvous():
    """The job's own ranks and rendezvous in the environment (env://); a launcher's variables from
    the submitting shell go first (submitit would give every job an inherited MASTER_PORT)."""
    import submitit

    for name in [*LAUNCHER_VARIABLES, *(n for n in os.environ if n.startswith("TORCHELASTIC_"))]:
        os.environ.pop(name, None)
    job = submitit.JobEnvironment()
    environment = submitit.helpers.TorchDistributedEnvironment()
    environment.master_port = rendezvous_port(str(job.job_id))
    if job.num_nodes == 1:  # one node: rendezvous on this host, whatever its name resolves to
        environment.master_addr = "127.0.0.1"
    return environment.export(set_cuda_visible_devices=False, overwrite=True)


class RunJob:
    """What every task of a run's job calls (submitit pickles it); rank 0 stores the record."""

    def __init__(self, measure: Callable[..., dict], run: Run, store_dir: Path,
                 assignment: Assignment) -> None:
        self.measure, self.run, self.store_dir = measure, run, Path(store_dir)
        self.assignment = assignment

    def __call__(self) -> dict | None:
        import submitit
        import torch

        from benchmarks.training import Interrupted

        device = self.assignment.device
        restrict_gpus(device)  # before anything touches CUDA
        environment = export_rendezvous()
        if environment.world_size > 1:  # loader workers' fork server, before the group's threads
            from vitzoo.data.workers import fork_server_now

            fork_server_now()
        torch.set_num_threads(task_threads(self.run))
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")
        print(f"rank {environment.rank} of {environment.world_size}, rendezvous "
              f"{environment.master_addr}:{environment.master_port}, {torch.get_num_threads()} "
              f"thread(s), CUDA_VISIBLE_DEVICES={gpus}", file=sys.stderr, flush=True)
        usr = submitit.JobEnvironment._usr_sig()
        requeue = signal.getsignal(usr)  # submitit's handler: checkpoint, then requeue
        started, start = time.time(), time.perf_counter()
        store = ResultStore(self.store_dir)
        try:
            outcome = self.measure(self.run, device=device, out=run_folder(store, self.run))
        except Interrupted:
            if environment.rank == 0 and callable(requeue):
                requeue(usr, None)  # exits this task; the job starts again
            return None
        if environment.rank == 0:
            store.add(make_record(self.run, outcome, time.perf_counter() - start, device,
                                  launcher="slurm", processes=self.assignment.processes_per_run,
                                  nodes=self.assignment.nodes, started=round(started, 3),
                                  job_id=str(submitit.JobEnvironment().job_id)))
        return outcome

    def checkpoint(self, *args: Any, **kwargs: Any):
        """Requeued as it is: the run's folder holds the checkpoint it resumes from."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


# ---------------------------------------------------------------------------- submitting, waiting
def job_failure(entry: dict) -> str:
    """How a job that ended without a record ended: the traceback of the task that failed first
    (the others often fail because it did)."""
    from submitit.core.utils import pickle_load

    folder, job_id = Path(entry["folder"]), entry["job_id"]
    errors = []
    for path in folder.glob(f"{job_id}_*_result.pkl"):
        outcome, value = pickle_load(path)
        if outcome == "error":
            errors.append((path.stat().st_mtime, int(path.name.split("_")[-2]), str(value)))
    if not errors:
        return f"it left no traceback; its logs are in {folder}"
    _, task, trace = min(errors)
    return (f"task {task} (rank {task}) failed first:\n{trace.strip()[-2500:]}\n"
            f"(logs: {folder / f'{job_id}_{task}_log.err'} and the other tasks' beside it)")


def submit(runs: list[Run], measure: Callable[..., dict], store: ResultStore,
           assignment: Assignment, options: SlurmOptions, wait: bool,
           minutes: Callable[[Run], float] | None, quiet: bool = False, poll_s: float = 30.0,
           unsure_s: float = 600.0) -> None:
    """Submit a job for every run without a record and without a live job (one that ended without
    a record is said so, and its run submitted again). With `wait`, follow the jobs (sacct, through
    submitit) every `poll_s` until each has stored its record; raise RuntimeError for the first
    that ended without one, or whose state has said nothing (UNSURE) for `unsure_s`."""
    from submitit import SlurmJob

    watcher = SlurmJob.watcher
    store.refresh()
    runs = [run for run in runs if store.get(run.key) is None]
    entries = {run.key: json.loads(path.read_text()) for run in runs
               if (path := run_folder(store, run) / JOB).exists()}
    for entry in entries.values():
        watcher.register_job(entry["job_id"])
    watcher.update()
    todo = []
    for run in runs:
        entry = entries.get(run.key)
        if entry is not None and not watcher.is_done(entry["job_id"], mode="cache"):
            continue  # its job still holds its place
        if entry is not None and not quiet:
            state = watcher.get_state(entry["job_id"], mode="cache")
            print(f"job {entry['job_id']} of {run.label!r} seed {run.seed} ended without a result "
                  f"({state}); submitting it again:\n{job_failure(entry)}", flush=True)
        todo.append(run)
    limit = partition_max_min(options.partition) if todo else None
    # every request made before anything is submitted: one that cannot hold its work is refused
    asked = [job_request(assignment, options, run, minutes(run) if minutes else 60.0, limit)
             for run in todo]
    said = ""
    for run, request in zip(todo, asked):
        if request.describe() != said and not quiet:
            print(request.describe(), flush=True)
            said = request.describe()
        folder = store.directory / "jobs"
        job = request.executor(folder, f"{run.ablation}-{run.key}").submit(
            RunJob(measure, run, store.directory, assignment))
        entries[run.key] = {"key": run.key, "job_id": str(job.job_id), "folder": str(folder)}
        write_text(run_folder(store, run) / JOB, json.dumps(entries[run.key], indent=1) + "\n")
        if not quiet:
            print(f"submitted {run.label!r} seed {run.seed} as job {job.job_id}", flush=True)
    unsure_since: dict[str, float] = {}
    waiting = {run.key: run for run in runs} if wait else {}
    while waiting:
        time.sleep(poll_s)
        store.refresh()
        watcher.update()
        for key, run in list(waiting.items()):
            job_id = entries[key]["job_id"]
            state = watcher.get_state(job_id, mode="cache")
            since = unsure_since.setdefault(key, time.time()) if state in UNSURE else None
            if state not in UNSURE:
                unsure_since.pop(key, None)
            lost = since is not None and time.time() - since >= unsure_s
            if store.get(key) is None and not lost and not watcher.is_done(job_id, mode="cache"):
                continue
            if store.get(key) is None:  # a record written just before the end may show late on NFS
                time.sleep(min(poll_s, 15.0))
                store.refresh()
            if store.get(key) is None:
                if lost:  # forgotten: the next invocation submits the run again
                    (run_folder(store, run) / JOB).unlink(missing_ok=True)
                how = f"is lost: its state has been {state} for {unsure_s:.0f} s" if lost else \
                    f"ended ({state})"
                raise RuntimeError(
                    f"job {job_id} of {run.label!r} seed {run.seed} {how} without storing a "
                    f"result: {job_failure(entries[key])}\nThe other jobs go on; run the same "
                    "command again: it collects them and submits this run again, resuming from "
                    "its checkpoint.")
            del waiting[key]
