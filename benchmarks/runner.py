"""Runs = spec x scale x seeds, and a run is done when its record exists. `assign` cuts the
machine into slots, the runs at once: CPU workers of `processes_per_run` gloo processes each, or
disjoint sets of the visible GPUs, one process per GPU; under SLURM a job of `nodes` x GPUs per
run. `execute` trains each run without a record on a free slot: in this process, in a process
pool, through PyTorch's elastic launcher for a run of several processes, or as SLURM jobs
(benchmarks/slurm.py). A run being trained holds a lock on a file in its folder, so that two
invocations on one --out share the runs.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, Callable, Iterable

import torch
from tqdm import tqdm

from benchmarks.suite import ResultStore, Run, make_record, run_folder

# imported once by the launching process's fork server, so that each rank forks from it
PRELOAD = ["torch", "torchvision", "vitzoo", "vitzoo.train", "benchmarks.training",
           "benchmarks.runner"]
CLAIM_POLL_S = 10.0  # how often a run another invocation holds is looked for


@dataclass(frozen=True)
class Assignment:
    launcher: str  # "local" or "slurm"
    device: str  # "cpu" or "cuda"
    processes_per_run: int
    slots: tuple[tuple[str, ...], ...]  # the runs at once, each its GPUs' ids (() on a CPU)
    threads_per_process: int
    nodes: int = 1

    def keyed_threads(self, trains: bool) -> int | None:
        """The threads a run's key holds: a training run's on this machine's CPU, else None."""
        local_cpu = self.device == "cpu" and self.launcher == "local"
        return self.threads_per_process if trains and local_cpu else None

    def alone(self) -> Assignment:
        """A timing ablation's: one process, one run at a time, every thread."""
        return replace(self, processes_per_run=1, nodes=1, slots=self.slots[:1] or ((),),
                       threads_per_process=self.threads_per_process * self.processes_per_run)

    def describe(self) -> str:
        where = (f"{self.processes_per_run} GPU(s)" if self.device == "cuda" else
                 f"{self.processes_per_run} CPU process(es) of {self.threads_per_process} "
                 "thread(s)")
        if self.launcher == "slurm":
            return f"each run a SLURM job of {self.nodes} node(s), {where} in all (queued)"
        return f"{len(self.slots)} run(s) at once, each {where}"


def check_divides(processes: int, share: int, flag: str) -> None:
    """A run's processes share its batches' micro-batches (`share`; 0: anything) equally."""
    if share and share % processes:
        fits = ", ".join(str(p) for p in range(1, min(share, max(processes, 8)) + 1)
                         if share % p == 0)
        raise ValueError(f"{flag} {processes}: a run's processes share its batches' {share} "
                         f"micro-batches equally; choose one of {fits}")


def assign(device: str, launcher: str = "local", *, gpus_per_run: int | None = None,
           processes_per_run: int = 1, workers: int = 1, gpus: int = 8, nodes: int = 1,
           share: int = 0) -> Assignment:
    """The slots (module docstring). `gpus`: a node's GPUs where none is here (a plan, SLURM)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device {device}: each run gets its own GPUs, so say cpu or --device "
                         "cuda with --gpus-per-run (CUDA_VISIBLE_DEVICES chooses them)")
    if launcher == "slurm":
        per_node = gpus if device == "cuda" else processes_per_run
        check_divides(per_node * nodes, share, "--nodes x --gpus-per-node =")
        return Assignment(launcher, device, per_node * nodes, (), 1, nodes)
    if device == "cpu":
        threads = torch.get_num_threads() // (workers * processes_per_run)
        return Assignment(launcher, "cpu", processes_per_run, ((),) * workers, max(1, threads))
    count = torch.cuda.device_count() if torch.cuda.is_available() else gpus
    per_run = gpus_per_run or max((p for p in range(1, count + 1) if not share or share % p == 0),
                                  key=lambda p: (count // p * p, p))  # the most GPUs busy
    if per_run > count:
        raise ValueError(f"--gpus-per-run {per_run}: this machine has {count} visible GPU(s)")
    check_divides(per_run, share, "--gpus-per-run")
    ids = visible_gpus(count)
    slots = tuple(ids[i * per_run:(i + 1) * per_run] for i in range(count // per_run))
    return Assignment(launcher, "cuda", per_run, slots, max(1, (os.cpu_count() or 1) // count))


def visible_gpus(count: int) -> tuple[str, ...]:
    """The ids (indices, UUIDs or MIG ids) a child must be given for the GPUs this process sees."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None or not torch.cuda.is_available():
        return tuple(str(i) for i in range(count))
    # CUDA stops at the first entry it cannot use: the count is what it kept
    return tuple(entry.strip() for entry in listed.split(",") if entry.strip())[:count]


def claim(folder: Path) -> IO | None:
    """The run in `folder` claimed for this process (an open file holding its lock), or None where
    another process holds it. The lock ends with its holder, killed or not."""
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / "claim.lock", "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return handle
    except BlockingIOError:
        handle.close()
        return None


def rank_main(measure: Callable[..., dict], run: Run, device: str, out: str,
              threads: int) -> dict | None:
    """What each rank of an elastic launch runs; rank 0's outcome is the run's."""
    from torch.distributed.elastic.multiprocessing.errors import record

    if "fork" in multiprocessing.get_all_start_methods():  # loader workers fork, as under torchrun
        multiprocessing.set_start_method("fork", force=True)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # their fork server, before the group's threads
        from vitzoo.data.workers import fork_server_now

        fork_server_now()
    torch.set_num_threads(threads)
    outcome = record(measure)(run, device=device, out=Path(out))  # a failure's traceback, recorded
    return outcome if int(os.environ.get("RANK", "0")) == 0 else None


def launch(measure: Callable[..., dict], run: Run, out: Path, assignment: Assignment,
           slot: tuple[str, ...]) -> dict:
    """Train `run` as `processes_per_run` ranks through the elastic launcher, on `slot`'s GPUs."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logs, before = out / "logs", dict(os.environ)
    os.environ["OMP_NUM_THREADS"] = str(assignment.threads_per_process)
    if assignment.device == "cuda":  # local rank k trains on the set's k-th GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(slot)
    multiprocessing.set_forkserver_preload(PRELOAD)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=assignment.processes_per_run,
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                          run_id=f"{out.name}-{uuid.uuid4().hex[:8]}", monitor_interval=0.5,
                          start_method="forkserver",
                          logs_specs=DefaultLogsSpecs(log_dir=str(logs), redirects=Std.ALL))
    try:
        return elastic_launch(config, rank_main)(measure, run, assignment.device, str(out),
                                                 assignment.threads_per_process)[0]
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        said = failure.message
        if isinstance(said, dict):
            said = said.get("extraInfo", {}).get("py_callstack") or said.get("message", "")
        raise RuntimeError(f"run {out.name}: rank {rank} failed (exit code {failure.exitcode}): "
                           f"{str(said).strip()[-2500:]}\nlogs of every rank: {logs}") from None
    finally:
        os.environ.clear()
        os.environ.update(before)


def train_one(measure: Callable[..., dict], run: Run, out: Path, assignment: Assignment,
              slot: tuple[str, ...], in_pool: bool) -> dict:
    """One run on its slot: one CPU process in this process, else through the elastic launcher."""
    started, start = time.time(), time.perf_counter()
    threads = assignment.threads_per_process
    if assignment.device == "cpu" and assignment.processes_per_run == 1:
        if in_pool:
            torch.set_num_threads(threads)
        outcome, threads = measure(run, device="cpu", out=out), torch.get_num_threads()
    else:
        outcome = launch(measure, run, out, assignment, slot)
    return {"outcome": outcome, "wall_s": time.perf_counter() - start,
            "started": round(started, 3), "threads": threads}


class _InThisProcess:
    """A pool of one that runs what is submitted at once, in this process's main thread (where
    training's signal handlers can be set)."""

    def submit(self, fn: Callable, *args: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:  # noqa: BLE001  (read as a pool's failures are)
            future.set_exception(exc)
        return future

    def shutdown(self) -> None:
        pass


def execute(runs: Iterable[Run], measure: Callable[..., dict], store: ResultStore,
            assignment: Assignment, quiet: bool = False, **slurm: Any) -> list[dict]:
    """Measure every run without a record as `assignment` says; the records of the runs, in
    order. `measure(run, device=..., out=...)` trains a run in its folder `out`. A run another
    invocation holds is waited for; a failed run starts no further run, and is raised once the
    runs going are in. Under SLURM: `benchmarks.slurm.submit(..., **slurm)`."""
    runs = list(runs)
    if assignment.launcher == "slurm":
        from benchmarks import slurm as cluster

        cluster.submit(runs, measure, store, assignment, quiet=quiet, **slurm)
        return records(runs, store)
    at_once = len(assignment.slots)
    # spawn, not fork: a forked child of a process that has used OpenMP threads can hang
    pool = (ProcessPoolExecutor(at_once, mp_context=multiprocessing.get_context("spawn"))
            if at_once > 1 else _InThisProcess())
    bar = tqdm(total=len(runs), unit="run", disable=quiet, desc=runs[0].ablation if runs else "")
    going: dict[Future, tuple[Run, tuple[str, ...], IO]] = {}
    free, failure, said = list(assignment.slots), None, False
    try:
        while True:
            store.refresh()
            bar.update(sum(store.get(r.key) is not None for r in runs) - bar.n)
            started = {run.key for run, _, _ in going.values()}
            left = [r for r in runs if store.get(r.key) is None and r.key not in started]
            for run in left:
                if failure is not None or not free:
                    break
                if (handle := claim(run_folder(store, run))) is not None:
                    slot = free.pop(0)
                    going[pool.submit(train_one, measure, run, run_folder(store, run), assignment,
                                      slot, at_once > 1)] = (run, slot, handle)
            if not going and (failure is not None or not left):
                break
            if not going:  # every run left is another invocation's: wait for its record
                if not said:
                    print(f"{len(left)} run(s) of {left[0].ablation} are being trained by another "
                          "invocation on this --out; waiting for their results", flush=True)
                said = True
                time.sleep(CLAIM_POLL_S)
                continue
            for future in wait(list(going), return_when=FIRST_COMPLETED)[0]:
                run, slot, handle = going.pop(future)
                free.append(slot)
                handle.close()
                if future.exception() is None:
                    done = future.result()
                    store.add(make_record(
                        run, done["outcome"], done["wall_s"], assignment.device, launcher="local",
                        processes=assignment.processes_per_run, threads=done["threads"],
                        started=done["started"], **({"gpus": list(slot)} if slot else {})))
                failure = failure or future.exception()
    finally:
        for _, _, handle in going.values():  # interrupted
            handle.close()
        pool.shutdown()
        bar.close()
    if failure is not None:
        raise failure
    return records(runs, store)


def records(runs: list[Run], store: ResultStore) -> list[dict]:
    """The stored records of `runs`, in order; labels and groups as the current plan says."""
    store.refresh()
    return [{**store.get(run.key), "label": run.label, "group": run.group}
            for run in runs if store.get(run.key)]
