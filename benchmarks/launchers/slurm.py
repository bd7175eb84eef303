"""Runs as SLURM jobs, through submitit (the launcher ViT-family research codes use).

Each run is one job of `nodes` x `gpus_per_node` tasks, one process per GPU (on the CPU: `nodes` x
`processes_per_run` gloo processes). Every task calls `RunJob`, which trains the run into its folder
under the results (RUN/train/, checkpoints included) and, on rank 0, adds the outcome to the
ablation's results store under its lock: the store is complete whether or not anyone waits for the job.

Preemption and time limits: SLURM signals the job (USR2, `signal_delay_s` before the limit; SIGTERM when
preempted). The training loop takes either as a stop request, agrees on it across ranks, checkpoints
and returns; rank 0 then has submitit requeue the job (`RunJob.checkpoint`), and the requeued job
resumes from that checkpoint. A job that dies without warning (a node lost, kill -9) is submitted again
by the next invocation of the suite, and resumes from the run's last periodic checkpoint.

`submitit-local` runs the same code path with submitit's local executor on this machine: the tests
use it, two gloo processes per run, one job preempted and requeued.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from benchmarks.launchers.assign import Assignment
from benchmarks.suite import ResultStore, make_record, run_folder
from vitzoo.io import write_text

# the states in which a job still holds its place: not submitted again (sacct's names)
LIVE_STATES = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING",
               "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "UNKNOWN"}


@dataclass(frozen=True)
class SlurmOptions:
    """What a job asks the cluster for (flags of `python -m benchmarks`); None: the cluster's default."""

    partition: str | None = None
    account: str | None = None
    time_limit_min: float | None = None  # None: from the plan, with a margin
    cpus_per_task: int | None = None
    signal_delay_s: int = 120  # USR2 this long before the limit: time to checkpoint
    max_requeues: int = 20  # time limits a run may reach (each resumes from its checkpoint)


class RunJob:
    """What every task of a run's job calls (submitit pickles it). Rank 0 stores the outcome."""

    def __init__(self, measure: Callable[..., dict], run: Any, out: Path, store_dir: Path, device: str, threads: int,
                 make_record: Callable[..., dict]) -> None:
        self.measure, self.run, self.out, self.store_dir = measure, run, Path(out), Path(store_dir)
        self.device, self.threads, self.make_record = device, threads, make_record

    def __call__(self) -> dict | None:
        import submitit
        import torch

        from benchmarks.training import Interrupted

        environment = submitit.helpers.TorchDistributedEnvironment()
        if submitit.JobEnvironment().num_nodes == 1:  # one node: rendezvous on this host, whatever its name resolves to
            environment.master_addr = "127.0.0.1"
        # the job's own rank and address, over any inherited from the process that submitted it
        environment.export(set_cuda_visible_devices=False, overwrite=True)
        torch.set_num_threads(self.threads)
        requeue = signal.getsignal(submitit.JobEnvironment._usr_sig())  # submitit's: checkpoint, then requeue
        started, start = time.time(), time.perf_counter()
        try:
            outcome = self.measure(self.run, device=self.device, out=self.out)
        except Interrupted:
            if environment.rank == 0 and callable(requeue):
                requeue(submitit.JobEnvironment._usr_sig(), None)  # exits this task; the job starts again
            return None
        if environment.rank != 0:
            return None
        record = self.make_record(self.run, outcome, time.perf_counter() - start, self.device)
        ResultStore(self.store_dir).add({**record, "started": round(started, 3), "job_id": environment_job_id()})
        return outcome

    def checkpoint(self, *args: Any, **kwargs: Any):
        """Requeued as it is: the run's folder holds the checkpoint it resumes from."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def environment_job_id() -> str:
    import submitit

    return str(submitit.JobEnvironment().job_id)


def executor(assignment: Assignment, folder: Path, minutes: float, name: str, options: SlurmOptions):
    """A submitit executor for jobs of this assignment: SLURM's, or the local one (submitit-local)."""
    import submitit

    per_node = assignment.processes_per_run // assignment.nodes
    limit = options.time_limit_min or max(10.0, 1.5 * minutes)
    if assignment.launcher == "submitit-local":
        made = submitit.LocalExecutor(folder=str(folder), max_num_timeout=options.max_requeues)
        made.update_parameters(timeout_min=limit, tasks_per_node=per_node, nodes=1,
                               gpus_per_node=per_node if assignment.device == "cuda" else 0,
                               signal_delay_s=options.signal_delay_s)
        return made
    made = submitit.SlurmExecutor(folder=str(folder), max_num_timeout=options.max_requeues)
    made.update_parameters(job_name=name, nodes=assignment.nodes, ntasks_per_node=per_node,
                           gpus_per_node=per_node if assignment.device == "cuda" else None,
                           cpus_per_task=options.cpus_per_task or assignment.threads_per_process,
                           time=int(limit + 0.5), signal_delay_s=options.signal_delay_s,
                           **({"partition": options.partition} if options.partition else {}),
                           **({"account": options.account} if options.account else {}))
    return made


# ---------------------------------------------------------------------------- jobs of a results folder
def jobs_path(store_dir: Path) -> Path:
    return Path(store_dir) / "jobs.json"


def read_jobs(store_dir: Path) -> dict[str, dict]:
    """run key -> {"job_id", "folder", "launcher", "submitted"}: the jobs submitted for the runs."""
    path = jobs_path(store_dir)
    return json.loads(path.read_text())["jobs"] if path.exists() else {}


def write_jobs(store_dir: Path, jobs: dict[str, dict]) -> None:
    write_text(jobs_path(store_dir), json.dumps({"jobs": jobs}, indent=1, sort_keys=True) + "\n")


def job_state(entry: dict) -> str:
    """The job's state now: SLURM's (sacct), or for a local job RUNNING while its controller lives."""
    if entry["launcher"] == "submitit-local":
        try:
            os.kill(int(entry["job_id"]), 0)
        except (OSError, ValueError):
            return "FINISHED"
        return "RUNNING"
    import submitit

    return submitit.SlurmJob(folder=entry["folder"], job_id=entry["job_id"]).state


def job_failure(entry: dict) -> str | None:
    """What a job that ended without a result says of its end (its error, or where its logs are)."""
    folder = Path(entry["folder"])
    logs = sorted(folder.glob(f"{entry['job_id']}_*_log.err")) + sorted(folder.glob(f"{entry['job_id']}_*_log.out"))
    for log in logs:
        text = log.read_text(errors="replace")
        if "Traceback" in text:
            return text[text.rindex("Traceback"):][-1500:] + f"\n(log: {log})"
    return f"no result and no traceback; logs: {', '.join(map(str, logs)) or folder}" if logs else None


def submit(runs: list, measure: Callable[..., dict], store: Any, assignment: Assignment, options: SlurmOptions,
           wait: bool, minutes: Callable[[Any], float] | None, quiet: bool = False) -> None:
    """Submit a job for every run without a result and without a live job (a job that ended without a
    result is said so, and its run submitted again: it resumes from its checkpoint). With `wait`,
    wait for every job and raise the first failure; otherwise return at once: the jobs store their
    results themselves, and the next invocation collects them."""
    jobs = read_jobs(store.directory)
    submitted = []
    for run in runs:
        entry = jobs.get(run.key)
        if entry is not None:
            state = job_state(entry)
            if state in LIVE_STATES:
                submitted.append((run, None, entry))
                continue
            failure = job_failure(entry)
            if failure and not quiet:
                print(f"job {entry['job_id']} of {run.label!r} seed {run.seed} ended without a result ({state}); "
                      f"submitting it again:\n{failure}", flush=True)
        folder = store.directory / "jobs"
        made = executor(assignment, folder, minutes(run) if minutes else 60.0, f"{run.ablation}-{run.key}", options)
        job = made.submit(RunJob(measure, run, run_folder(store, run), store.directory, assignment.device,
                                 assignment.threads_per_process, _record_maker(assignment)))
        entry = {"job_id": str(job.job_id), "folder": str(folder), "launcher": assignment.launcher,
                 "submitted": time.strftime("%Y-%m-%d %H:%M:%S")}
        with store.locked():  # other suites may submit into the same results folder
            write_jobs(store.directory, {**read_jobs(store.directory), run.key: entry})
        submitted.append((run, job, entry))
        if not quiet:
            print(f"submitted {run.label!r} seed {run.seed} as job {job.job_id} ({assignment.launcher})", flush=True)
    if not wait:
        return
    for run, job, entry in submitted:
        _wait_for(run, job, entry, store)


def _wait_for(run: Any, job: Any, entry: dict, store: Any) -> None:
    """Wait for the job of `run` (one submitted by another invocation: for its result to be stored);
    a job that ends without a stored result raises RuntimeError with what its logs say."""
    if job is not None:
        try:
            job.results()
        except Exception as exc:  # submitit raises FailedJobError with the job's traceback
            raise RuntimeError(f"job {entry['job_id']} of {run.label!r} seed {run.seed} failed: {exc}") from None
    else:
        while job_state(entry) in LIVE_STATES:
            time.sleep(10)
    store.refresh()
    if store.get(run.key) is None:
        raise RuntimeError(f"job {entry['job_id']} of {run.label!r} seed {run.seed} ended without storing a result: "
                           f"{job_failure(entry) or 'no logs'}")


class _record_maker:
    """make_record with this assignment's launch settings (picklable, for the job to call)."""

    def __init__(self, assignment: Assignment) -> None:
        self.launch = {"launcher": assignment.launcher, "processes": assignment.processes_per_run,
                       "nodes": assignment.nodes}

    def __call__(self, run: Any, outcome: dict, wall_s: float, device: str) -> dict:
        return make_record(run, outcome, wall_s, device, **self.launch)


__all__ = ["LIVE_STATES", "RunJob", "SlurmOptions", "executor", "job_failure", "job_state", "read_jobs",
           "submit", "write_jobs"]
