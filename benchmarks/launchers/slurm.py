"""Runs as SLURM jobs, through submitit (the launcher ViT-family research codes use).

Each run is one job of `nodes` x `gpus_per_node` tasks, one process per GPU (on the CPU: `nodes` x
`processes_per_run` gloo processes). Every task calls `RunJob`, which trains the run into its folder
under the results (RUN/train/, checkpoints included) and, on rank 0, adds the outcome to the
ablation's results store (a file of its own: no lock): the store is complete whether or not anyone
waits for the job.

What a job asks for (`benchmarks.launchers.resources`): `--cpus-per-task` (the run's loader workers + 2)
and `--mem` (a base and a share per loader worker, per task), both given to srun as well as sbatch
where they must be; `--requeue`; srun's `--kill-on-bad-exit=1`, so a failing task ends its job instead
of leaving the others waiting in a collective; a time limit from the plan, within the partition's.

Preemption and time limits: SLURM signals the job (USR2, `signal_delay_s` before the limit, long enough
for the longest evaluation and a checkpoint; SIGTERM when preempted). The training loop takes either as
a stop request, agrees on it across ranks, checkpoints and returns; rank 0 then has submitit requeue
the job (`RunJob.checkpoint`), and the requeued job resumes from that checkpoint. A job that dies without
warning (a node lost, kill -9), or that SLURM no longer knows, is submitted again by the next invocation
of the suite, and resumes from the run's last periodic checkpoint.

`submitit-local` runs the same code path with submitit's local executor on this machine, at most as
many jobs at once as the assignment has slots, each on its own GPU set. The tests run `slurm` itself
against stand-in SLURM commands (tests/slurm_standin/).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from benchmarks.launchers import jobs as joblist
from benchmarks.launchers import resources
from benchmarks.launchers.assign import Assignment
from benchmarks.launchers.jobs import LIVE_STATES, job_failure, read_jobs
from benchmarks.launchers.resources import SlurmOptions
from benchmarks.suite import ResultStore, make_record, run_folder

# what a launcher (torchrun, an enclosing job) leaves in the environment that sbatch exports from the
# submitting shell: none of it may reach a job's ranks, which get their own
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                      "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
                      "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
PORTS = (20000, 60000)  # a job's rendezvous port: from its job id, so that jobs on one node differ


def rendezvous_port(job_id: str) -> int:
    """The job's rendezvous port: consecutive job ids (jobs submitted together, which may share a node)
    get different ports; a requeued job keeps its port."""
    digits = int(re.sub(r"\D", "", job_id) or 0)
    return PORTS[0] + digits % (PORTS[1] - PORTS[0])


def task_threads(default: int, run: Any, environ: dict | os._Environ = os.environ) -> int:
    """CPU threads of one task: in a SLURM job, its CPUs (SLURM_CPUS_PER_TASK) less its loader workers
    (at least 1); elsewhere (submitit-local) the assignment's."""
    cpus = environ.get("SLURM_CPUS_PER_TASK") if environ.get("SUBMITIT_EXECUTOR") == "slurm" else None
    return max(1, int(cpus) - resources.loader_workers(run.config["train"])) if cpus else default


def restrict_gpus(device: str, visible: tuple, environ: dict | os._Environ = os.environ) -> None:
    """CUDA_VISIBLE_DEVICES of a job's task: its slot's GPUs (submitit-local), none for a CPU run, and under
    SLURM the value SLURM set for the job's GPUs, never one carried in from the submitting shell (SLURM
    sets SLURM_JOB_GPUS beside its own; without it, every GPU of the node is the job's)."""
    if visible:
        environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in visible)
    elif device == "cpu":
        environ["CUDA_VISIBLE_DEVICES"] = ""
    elif environ.get("SUBMITIT_EXECUTOR") == "slurm" and not (environ.get("SLURM_JOB_GPUS") or environ.get("SLURM_STEP_GPUS")):
        environ.pop("CUDA_VISIBLE_DEVICES", None)


class RunJob:
    """What every task of a run's job calls (submitit pickles it). Rank 0 stores the outcome.
    `visible`: the GPUs the job may see (submitit-local's GPU set; under SLURM, SLURM's choice)."""

    def __init__(self, measure: Callable[..., dict], run: Any, out: Path, store_dir: Path, device: str, threads: int,
                 make_record: Callable[..., dict], visible: tuple = ()) -> None:
        self.measure, self.run, self.out, self.store_dir = measure, run, Path(out), Path(store_dir)
        self.device, self.threads, self.make_record, self.visible = device, threads, make_record, tuple(visible)

    def __call__(self) -> dict | None:
        import submitit
        import torch

        from benchmarks.training import Interrupted

        restrict_gpus(self.device, self.visible)  # before anything touches CUDA
        environment = export_rendezvous()
        if environment.world_size > 1:  # the loader workers' fork server, before the group's threads (vitzoo.data.workers)
            from vitzoo.data.workers import fork_server_now

            fork_server_now()
        threads = task_threads(self.threads, self.run)
        torch.set_num_threads(threads)
        print(f"rank {environment.rank} of {environment.world_size}, rendezvous {environment.master_addr}:"
              f"{environment.master_port}, {threads} thread(s), CUDA_VISIBLE_DEVICES="
              f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}, restart {os.environ.get('SLURM_RESTART_COUNT', 0)}",
              file=sys.stderr, flush=True)
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


def export_rendezvous():
    """The job's own ranks and rendezvous in the environment (torch.distributed's env://), over any that
    the submitting shell carried in: its launcher's variables are dropped first, since submitit would
    take an inherited MASTER_PORT for every job (two jobs on one node would then share it)."""
    import submitit

    for name in LAUNCHER_VARIABLES:
        os.environ.pop(name, None)
    job = submitit.JobEnvironment()
    environment = submitit.helpers.TorchDistributedEnvironment()
    environment.master_port = rendezvous_port(str(job.job_id))
    if job.num_nodes == 1:  # one node: rendezvous on this host, whatever its name resolves to
        environment.master_addr = "127.0.0.1"
    return environment.export(set_cuda_visible_devices=False, overwrite=True)


def environment_job_id() -> str:
    import submitit

    return str(submitit.JobEnvironment().job_id)


@dataclass
class Tracked:
    """A job this invocation follows: its run, its job file's entry, submitit's job (when submitted
    here) and the slot it holds (submitit-local's GPU set)."""

    run: Any
    entry: dict
    job: Any = None
    slot: tuple = ()


class Submitter:
    """Submits the runs of one assignment, saying what the jobs ask for whenever it changes."""

    def __init__(self, measure: Callable[..., dict], store: Any, assignment: Assignment, options: SlurmOptions,
                 minutes: Callable[[Any], float] | None, quiet: bool) -> None:
        self.measure, self.store, self.assignment, self.options = measure, store, assignment, options
        self.minutes, self.quiet = minutes, quiet
        self.said = ""
        self.asked_sinfo, self.partition_max = False, None

    def request(self, run: Any) -> resources.JobRequest:
        """What the run's job asks for (raises ValueError for a time limit that cannot hold its work)."""
        if self.assignment.launcher == "slurm" and not self.asked_sinfo:  # once, and only to submit
            self.asked_sinfo, self.partition_max = True, resources.partition_max_min(self.options.partition)
        return resources.job_request(self.assignment, self.options, run,
                                     self.minutes(run) if self.minutes else 60.0, self.partition_max)

    def submit(self, run: Any, slot: tuple = ()) -> Tracked:
        asked = self.request(run)
        if asked.describe() != self.said and not self.quiet:
            print(asked.describe(), flush=True)
            self.said = asked.describe()
        folder = self.store.directory / "jobs"
        job = resources.executor(self.assignment, folder, f"{run.ablation}-{run.key}", asked).submit(
            RunJob(self.measure, run, run_folder(self.store, run), self.store.directory, self.assignment.device,
                   self.assignment.threads_per_process, _record_maker(self.assignment), visible=slot))
        entry = {"key": run.key, "job_id": str(job.job_id), "folder": str(folder), "launcher": self.assignment.launcher,
                 "submitted": time.strftime("%Y-%m-%d %H:%M:%S"), **({"slot": list(slot)} if slot else {})}
        joblist.write_job(self.store.directory, entry)
        if not self.quiet:
            print(f"submitted {run.label!r} seed {run.seed} as job {job.job_id} ({self.assignment.launcher}"
                  + (f", GPUs {','.join(map(str, slot))}" if slot else "") + ")", flush=True)
        return Tracked(run, entry, job, tuple(slot))


def free_slots(assignment: Assignment, live: list[dict]) -> list[tuple] | None:
    """The slots no live job of another invocation holds (submitit-local); None under SLURM (no limit)."""
    if assignment.launcher == "slurm":
        return None
    free = [tuple(s) for s in assignment.slots] or [()]
    for entry in live:  # a job of another invocation holds its slot (or, not naming one, some slot)
        held = tuple(entry.get("slot", ()))
        if free:
            free.remove(held if held in free else free[0])
    return free


def submit(runs: list, measure: Callable[..., dict], store: Any, assignment: Assignment, options: SlurmOptions,
           wait: bool, minutes: Callable[[Any], float] | None, quiet: bool = False) -> None:
    """Submit a job for every run without a result and without a live job (a job that ended without a
    result is said so, and its run submitted again: it resumes from its checkpoint). Under
    submitit-local at most as many jobs go at once as the assignment has slots, each on its own.

    With `wait`, follow every job until it ends (polling every `jobs.poll_s()` seconds), submitting the
    runs that wait for a slot as slots free, and raise RuntimeError for the first job that ends without a
    result (its failing task's traceback), or that SLURM has not known for `jobs.unknown_live_s()`
    seconds (lost: the next invocation submits it again). Without `wait`, return once submitted: the
    jobs store their results themselves, and the next invocation collects them (and submits the runs
    that waited for a slot)."""
    bound, every = joblist.unknown_live_s(), joblist.poll_s()
    jobs = read_jobs(store.directory)
    states = joblist.job_states([jobs[r.key] for r in runs if r.key in jobs])
    tracked, todo = [], []
    for run in runs:
        entry = jobs.get(run.key)
        if entry is not None:
            state = states[entry["job_id"]]
            if joblist.holds_place(entry, state, store.directory, bound):
                tracked.append(Tracked(run, entry, None, tuple(entry.get("slot", ()))))
                continue
            if not quiet:
                print(f"job {entry['job_id']} of {run.label!r} seed {run.seed} ended without a result ({state}); "
                      f"submitting it again:\n{job_failure(entry) or 'it left no logs'}", flush=True)
        todo.append(run)
    free = free_slots(assignment, [t.entry for t in tracked])
    submitter = Submitter(measure, store, assignment, options, minutes, quiet)
    for run in todo:  # every time limit checked before anything is submitted
        submitter.request(run)
    while True:
        while todo and (free is None or free):
            tracked.append(submitter.submit(todo.pop(0), free.pop(0) if free is not None else ()))
        if not wait or not tracked:
            break
        time.sleep(every)
        for ended in _ended(tracked, store, bound):
            tracked.remove(ended)
            if free is not None:
                free.append(ended.slot)
    if todo and not quiet:
        print(f"{len(todo)} run(s) wait for a free slot (--launcher {assignment.launcher} runs {len(assignment.slots)} "
              "at once); run the same command again to submit them", flush=True)


def _ended(tracked: list[Tracked], store: Any, bound: float) -> list[Tracked]:
    """The tracked jobs that have ended with their result stored; raises RuntimeError for one that ended
    (or was lost) without it."""
    store.refresh()
    states = joblist.job_states([t.entry for t in tracked], {t.entry["job_id"]: t.job for t in tracked if t.job})
    ended = []
    for t in tracked:
        state = states[t.entry["job_id"]]
        if store.get(t.run.key) is None and joblist.holds_place(t.entry, state, store.directory, bound):
            continue
        if store.get(t.run.key) is None:
            time.sleep(min(joblist.poll_s(), 15.0))  # a result written just before the end may show late on NFS
            store.refresh()
        if store.get(t.run.key) is None:
            raise RuntimeError(ended_without_result(t, state, bound))
        ended.append(t)
    return ended


def ended_without_result(t: Tracked, state: str, bound: float) -> str:
    """Why the suite stops: the job's end, its failing task's traceback, and what the next invocation does."""
    job, run = t.entry["job_id"], t.run
    logs = job_failure(t.entry) or f"it left no logs in {t.entry['folder']}"
    if state in joblist.UNSURE_STATES and state not in LIVE_STATES:
        return (f"job {job} of {run.label!r} seed {run.seed} is lost: its state has been {state} for more than "
                f"{bound:.0f} s (neither sacct nor scontrol knows it) and it stored no result; {logs}\n"
                f"The next invocation of the suite submits it again, resuming from the run's last checkpoint.")
    return (f"job {job} of {run.label!r} seed {run.seed} ended ({state}) without storing a result: {logs}\n"
            f"The other jobs go on and store their results; fix the cause and run the same command again: it "
            f"collects them and submits this run again, resuming from its last checkpoint.")


class _record_maker:
    """make_record with this assignment's launch settings (picklable, for the job to call)."""

    def __init__(self, assignment: Assignment) -> None:
        self.launch = {"launcher": assignment.launcher, "processes": assignment.processes_per_run,
                       "nodes": assignment.nodes}

    def __call__(self, run: Any, outcome: dict, wall_s: float, device: str) -> dict:
        return make_record(run, outcome, wall_s, device, **self.launch)


__all__ = ["LAUNCHER_VARIABLES", "RunJob", "SlurmOptions", "Submitter", "export_rendezvous", "free_slots",
           "rendezvous_port", "submit", "task_threads", "restrict_gpus"]
