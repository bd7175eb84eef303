"""Runs as SLURM jobs through submitit's SlurmExecutor, submitted from a login node, which sees
neither the compute nodes' CPUs nor their GPUs: a job asks for what the plan says.

A run is one job of `nodes` x tasks, one process per GPU (gloo processes on the CPU), with its
loader workers + 2 CPUs a task (srun too: Slurm 22.05-23.02 do not pass sbatch's on), --requeue,
and the plan's time x 1.5 with USR2 before its end. On USR2 or a preemption the loop checkpoints,
rank 0 has submitit requeue the job, and it resumes. Rank 0 stores the record. JOB in the run's
folder names its job: a later invocation follows it, or submits the run again once it ended
without a record.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from benchmarks.suite import ResultStore, Run, make_record, run_folder
from vitzoo.io import write_text

if TYPE_CHECKING:  # the runner imports this module
    from benchmarks.runner import Assignment

JOB = "job.json"  # a run's job, in its folder
MEM_BASE_GB = 8.0  # the training process: torch, the CUDA context, the model, a checkpoint's copy
MEM_PER_LOADER_WORKER_GB = 2.0
SIGNAL_DELAY_S = 120 + 60  # USR2 before the limit: an evaluation ends, a checkpoint is written
MIN_WORK_S = 5 * 60  # a job's least training before its warning: a shorter limit only requeues
MAX_REQUEUES = 20
POLL_S = 30.0  # how often the jobs are followed


@dataclass(frozen=True)
class SlurmOptions:
    """What a job asks the cluster for (flags of `python -m benchmarks`); None: the default."""

    partition: str | None = None
    account: str | None = None
    time_limit_min: float | None = None
    cpus_per_task: int | None = None
    mem_per_task_gb: float | None = None
    signal_delay_s: int | None = None


def job_parameters(assignment: Assignment, options: SlurmOptions, run: Run,
                   minutes: float) -> dict[str, Any]:
    """The run's job, as submitit's SlurmExecutor parameters."""
    workers = int(run.config["train"].get("num_workers") or 0)
    cpus = options.cpus_per_task or workers + 2
    per_node = assignment.processes_per_run // assignment.nodes
    limit = math.ceil(options.time_limit_min or max(10.0, 1.5 * minutes))
    delay = options.signal_delay_s or SIGNAL_DELAY_S
    if limit * 60 - delay < MIN_WORK_S:
        raise ValueError(f"a time limit of {limit} min with USR2 {delay} s before it leaves under "
                         f"{MIN_WORK_S // 60} minutes to train: raise --time-limit-min")
    memory = options.mem_per_task_gb or MEM_BASE_GB + MEM_PER_LOADER_WORKER_GB * workers
    where = {k: v for k, v in asdict(options).items() if k in ("partition", "account") and v}
    return dict(nodes=assignment.nodes, ntasks_per_node=per_node,
                gpus_per_node=per_node if assignment.device == "cuda" else None,
                cpus_per_task=cpus, mem=f"{math.ceil(memory * per_node)}GB", time=limit,
                signal_delay_s=delay, additional_parameters={"requeue": True},
                srun_args=[f"--cpus-per-task={cpus}", "--kill-on-bad-exit=1"], **where)


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

        device, environ = self.assignment.device, os.environ
        if device == "cpu":  # before anything touches CUDA
            environ["CUDA_VISIBLE_DEVICES"] = ""
        elif not (environ.get("SLURM_JOB_GPUS") or environ.get("SLURM_STEP_GPUS")):
            environ.pop("CUDA_VISIBLE_DEVICES", None)  # the submitting shell's, not SLURM's
        for name in [n for n in environ if n.startswith("TORCHELASTIC_")]:  # a torchrun shell's
            del environ[name]
        job = submitit.JobEnvironment()
        ranks = submitit.helpers.TorchDistributedEnvironment()
        # from the job id: jobs submitted together (maybe on one node) differ; a requeue keeps it
        ranks.master_port = 20000 + int(re.sub(r"\D", "", str(job.job_id)) or 0) % 40000
        if job.num_nodes == 1:  # whatever this host's name resolves to
            ranks.master_addr = "127.0.0.1"
        ranks = ranks.export(set_cuda_visible_devices=False, overwrite=True)
        if ranks.world_size > 1:  # loader workers' fork server, before the group's threads
            from vitzoo.data.workers import fork_server_now

            fork_server_now()
        workers = int(self.run.config["train"].get("num_workers") or 0)
        cpus = int(environ.get("SLURM_CPUS_PER_TASK", workers + 1))
        torch.set_num_threads(max(1, cpus - workers))  # its CPUs less its loader workers
        print(f"rank {ranks.rank} of {ranks.world_size}, rendezvous {ranks.master_addr}:"
              f"{ranks.master_port}, {torch.get_num_threads()} thread(s), CUDA_VISIBLE_DEVICES="
              f"{environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}", file=sys.stderr, flush=True)
        usr = submitit.JobEnvironment._usr_sig()
        requeue = signal.getsignal(usr)  # submitit's handler: checkpoint, then requeue
        started, start = time.time(), time.perf_counter()
        store = ResultStore(self.store_dir)
        try:
            outcome = self.measure(self.run, device=device, out=run_folder(store, self.run))
        except Interrupted:
            if ranks.rank == 0 and callable(requeue):
                requeue(usr, None)  # exits this task; the job starts again
            return None
        if ranks.rank == 0:
            store.add(make_record(self.run, outcome, time.perf_counter() - start, device,
                                  launcher="slurm", processes=self.assignment.processes_per_run,
                                  nodes=self.assignment.nodes, started=round(started, 3),
                                  job_id=str(job.job_id)))
        return outcome

    def checkpoint(self, *args: Any, **kwargs: Any):
        """Requeued as it is: the run's folder holds the checkpoint it resumes from."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def job_failure(entry: dict) -> str:
    """The traceback of the job's task that failed first (the others often fail because it did)."""
    from submitit.core.utils import pickle_load

    folder, job_id, errors = Path(entry["folder"]), entry["job_id"], []
    for path in folder.glob(f"{job_id}_*_result.pkl"):
        outcome, value = pickle_load(path)
        if outcome == "error":
            errors.append((path.stat().st_mtime, int(path.name.split("_")[-2]), str(value)))
    if not errors:
        return f"it left no traceback; its logs are in {folder}"
    _, task, trace = min(errors)
    return (f"task {task} (rank {task}) failed first:\n{trace.strip()[-2500:]}\n(logs: "
            f"{folder / f'{job_id}_{task}_log.err'} and the other tasks' beside it)")


def submit(runs: list[Run], measure: Callable[..., dict], store: ResultStore,
           assignment: Assignment, options: SlurmOptions = SlurmOptions(), wait: bool = True,
           minutes: Callable[[Run], float] = lambda run: 60.0, quiet: bool = False) -> None:
    """Submit a job for every run with neither a record nor a live job; with `wait`, follow the
    jobs until each has stored its record, and raise RuntimeError for one that ended without."""
    from submitit import SlurmExecutor, SlurmJob

    watcher = SlurmJob.watcher
    store.refresh()
    runs = [run for run in runs if store.get(run.key) is None]
    jobs = {run.key: json.loads(path.read_text()) for run in runs
            if (path := run_folder(store, run) / JOB).exists()}
    for entry in jobs.values():
        watcher.register_job(entry["job_id"])
    watcher.update()
    todo = [run for run in runs
            if run.key not in jobs or watcher.is_done(jobs[run.key]["job_id"], mode="cache")]
    for run in todo:
        if run.key in jobs and not quiet:
            print(f"job {jobs[run.key]['job_id']} of {run.label!r} seed {run.seed} ended without "
                  f"a result; submitting it again:\n{job_failure(jobs[run.key])}", flush=True)
    # every request made before anything is submitted: one that cannot hold its work is refused
    asked = [job_parameters(assignment, options, run, minutes(run)) for run in todo]
    folder = store.directory / "jobs"
    for run, parameters in zip(todo, asked):
        executor = SlurmExecutor(folder=str(folder), max_num_timeout=MAX_REQUEUES)
        executor.update_parameters(job_name=f"{run.ablation}-{run.key}", **parameters)
        job = executor.submit(RunJob(measure, run, store.directory, assignment))
        jobs[run.key] = {"key": run.key, "job_id": str(job.job_id), "folder": str(folder)}
        write_text(run_folder(store, run) / JOB, json.dumps(jobs[run.key], indent=1) + "\n")
        if not quiet:
            print(f"submitted {run.label!r} seed {run.seed} as job {job.job_id}: "
                  + ", ".join(f"{k} {v}" for k, v in parameters.items() if v), flush=True)
    waiting, ended = ({run.key: run for run in runs} if wait else {}), set()
    while waiting:
        time.sleep(POLL_S)
        watcher.update()
        store.refresh()
        for key, run in list(waiting.items()):
            job_id = jobs[key]["job_id"]
            if store.get(key) is not None:
                del waiting[key]
            elif key in ended:  # ended a poll ago: a record written at its end may show late
                raise RuntimeError(
                    f"job {job_id} of {run.label!r} seed {run.seed} ended "
                    f"({watcher.get_state(job_id, mode='cache')}) without storing a result: "
                    f"{job_failure(jobs[key])}\nThe other jobs go on; run the same command "
                    "again: it collects them and submits this run again, from its checkpoint.")
            elif watcher.is_done(job_id, mode="cache"):
                ended.add(key)
