"""How an ablation's runs are executed: a run is done when its record exists in the ablation's
results store, and `execute` hands the others to a backend as the assignment says: this process,
a pool of processes (one run each), PyTorch's elastic launcher for a run of several processes on
its own GPU set, or SLURM jobs through submitit (benchmarks/slurm.py). A run being trained holds
the lock of a claim file in its folder, so that two invocations on one --out share the runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import multiprocessing
import os
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import IO, Any, Callable, Iterable

import torch
from tqdm import tqdm

from benchmarks.assignment import Assignment
from benchmarks.suite import ResultStore, Run, make_record, run_folder

# imported once by the launching process's fork server, so that each rank forks from it
PRELOAD = ["torch", "torchvision", "vitzoo", "vitzoo.train", "benchmarks.training",
           "benchmarks.runner"]
CLAIM = "claim.lock"
WATCH_S = 2.0  # how often the runs in flight are read for progress
CLAIM_POLL_S = 10.0  # how often a run another invocation holds is looked for


def claim(folder: Path) -> IO | None:
    """The run in `folder` claimed for this process (an open file holding its lock), or None where
    another process holds it. The lock ends with its holder, killed or not."""
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / CLAIM, "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return handle
    except BlockingIOError:
        handle.close()
        return None


def run_progress(folder: Path) -> tuple[float, str] | None:
    """(the fraction a run has trained, its step in words), from its folder's settings and last
    whole metrics line; None before its first line. A run is whole only once recorded."""
    train = Path(folder) / "train"
    try:
        config = json.loads((train / "train_config.json").read_text())
        lines = (train / "metrics.jsonl").read_text().splitlines()
    except (OSError, ValueError):
        return None
    for line in reversed(lines):
        with contextlib.suppress(ValueError):  # a half-written line
            if "train_seconds" in (last := json.loads(line)):
                break
    else:
        return None
    if config.get("steps"):
        return min(last["step"] / config["steps"], 0.99), f"step {last['step']}/{config['steps']}"
    if config.get("epochs") and last.get("epoch") is not None:
        return (min(last["epoch"] / config["epochs"], 0.99),
                f"step {last['step']}, epoch {last['epoch']:.2f}/{config['epochs']:g}")
    return None


def show_progress(bar: Any, store: ResultStore, runs: list[Run], shown: dict[str, float]) -> None:
    """Move the bar (a unit a run) by what the runs in flight have trained, naming their steps."""
    words = []
    for run in runs:
        if (found := run_progress(run_folder(store, run))) is not None:
            bar.update(max(found[0] - shown.get(run.key, 0.0), 0.0))
            shown[run.key] = max(found[0], shown.get(run.key, 0.0))
            words.append(f"{run.label} seed {run.seed} {found[1]}")
    if words:
        bar.set_postfix_str("; ".join(words), refresh=True)


# ---------------------------------------------------------------------------- local backends
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
    out.mkdir(parents=True, exist_ok=True)
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
    """A pool of one that runs what is submitted at once, in this process (its main thread)."""

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
    store.refresh()
    if assignment.launcher == "slurm":
        from benchmarks import slurm as cluster

        cluster.submit([r for r in runs if store.get(r.key) is None], measure, store, assignment,
                       quiet=quiet, **slurm)
        return records(runs, store)
    at_once = len(assignment.slots)
    bar = tqdm(total=len(runs), initial=sum(store.get(r.key) is not None for r in runs),
               unit="run", disable=quiet, dynamic_ncols=True, desc=runs[0].ablation if runs else "",
               bar_format="{l_bar}{bar}| {n:.2f}/{total_fmt} runs [{elapsed}<{remaining}{postfix}]")
    # spawn, not fork: a forked child of a process that has used OpenMP threads can hang
    pool = (ProcessPoolExecutor(at_once, mp_context=multiprocessing.get_context("spawn"))
            if at_once > 1 else _InThisProcess())
    going: dict[Future, tuple[Run, tuple[str, ...], IO]] = {}
    free, shown, failure, said = list(assignment.slots), {}, None, False
    try:
        while True:
            store.refresh()
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
            for future in wait(list(going), WATCH_S, return_when=FIRST_COMPLETED)[0]:
                run, slot, handle = going.pop(future)
                free.append(slot)
                handle.close()
                if future.exception() is None:
                    done = future.result()
                    store.add(make_record(
                        run, done["outcome"], done["wall_s"], assignment.device, launcher="local",
                        processes=assignment.processes_per_run, threads=done["threads"],
                        started=done["started"], **({"gpus": list(slot)} if slot else {})))
                    bar.update(1.0 - shown.pop(run.key, 0.0))
                failure = failure or future.exception()
            show_progress(bar, store, [run for run, _, _ in going.values()], shown)
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
