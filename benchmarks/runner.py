"""How an ablation's planned runs are executed: runs are spec x scale x seeds, and a run is done
when its record exists in the ablation's results store.

`execute` hands the runs without a record to a backend, as the assignment says (how many runs go
at once, on which devices: benchmarks/assignment.py): this process or a pool of processes (one
run each, threads per process), PyTorch's elastic launcher (torchrun's machinery) for a run of
several processes on its own GPU set, or SLURM jobs through submitit (benchmarks/slurm.py). While
an invocation trains a run, the run's folder holds a claim file, so two invocations on one --out
share the runs; a failure stops the queued runs.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import socket
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from tqdm import tqdm

from benchmarks.assignment import Assignment
from benchmarks.suite import ResultStore, Run, make_record, run_folder

# what a launching process imports once, so that each rank forks from it, not importing anew
PRELOAD = ["torch", "torchvision", "vitzoo", "vitzoo.train", "benchmarks.training",
           "benchmarks.runner"]
CLAIM = "claim.json"
STALE_S = 300.0  # a claim untouched this long is its dead owner's
WATCH_S = 2.0  # how often the runs in flight are read for progress and their claims touched
BAR_FORMAT = "{l_bar}{bar}| {n:.2f}/{total_fmt} runs [{elapsed}<{remaining}{postfix}]"


# ---------------------------------------------------------------------------- claims
def _me() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def holder(folder: Path) -> dict[str, Any] | None:
    """Who holds the run in `folder`: None where no claim is, or its owner is gone (a process of
    this host that ended, or a claim untouched for STALE_S, which covers another host's)."""
    path = Path(folder) / CLAIM
    try:
        owner, age = json.loads(path.read_text()), time.time() - path.stat().st_mtime
        if owner["host"] == socket.gethostname():
            os.kill(owner["pid"], 0)
    except PermissionError:  # another user's process: alive
        pass
    except (OSError, ValueError, KeyError, TypeError):  # no claim, or its process ended
        return None
    return owner if age < STALE_S else None


def _create(path: Path) -> bool:
    """Create the claim whole or not at all: written beside it, then hard-linked into place (a link
    fails where the name exists, on a local disk as on NFS or Lustre, with no lock daemon)."""
    staged = path.with_name(f".{CLAIM}.{uuid.uuid4().hex[:8]}")
    staged.write_text(json.dumps(_me()))
    try:
        os.link(staged, path)
        return True
    except FileExistsError:
        return False
    finally:
        staged.unlink(missing_ok=True)


def claim(folder: Path) -> bool:
    """Claim the run in `folder` for this process: True when it is ours now. A dead owner's claim is
    moved aside by a rename, which succeeds for one of the invocations that found it so."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CLAIM
    if _create(path):
        return True
    seen = None
    with contextlib.suppress(OSError):
        seen = path.read_text()
    owner = holder(folder)
    if owner is not None:
        return owner == _me()
    aside = path.with_name(f".{CLAIM}.{uuid.uuid4().hex[:8]}.stale")
    try:
        os.rename(path, aside)
    except FileNotFoundError:  # another invocation moved it first
        return _create(path)
    fresh = aside.read_text() != seen  # a claim made since it was judged: put back
    if fresh:
        with contextlib.suppress(OSError):
            os.link(aside, path)
    aside.unlink()
    return not fresh and _create(path)


def release(folder: Path) -> None:
    if holder(folder) == _me():
        (folder / CLAIM).unlink(missing_ok=True)


# ---------------------------------------------------------------------------- progress
def run_progress(folder: Path) -> tuple[float, str] | None:
    """(the fraction of its length a run has trained, its step in words), from its training
    folder's settings and last whole metrics line; None before its first line."""
    train = Path(folder) / "train"
    try:
        config = json.loads((train / "train_config.json").read_text())
        lines = (train / "metrics.jsonl").read_text().splitlines()
    except (OSError, ValueError):
        return None
    last = None
    for line in reversed(lines):  # a half-written line is skipped
        with contextlib.suppress(ValueError):
            last = json.loads(line)
            if isinstance(last, dict) and "step" in last and "train_seconds" in last:
                break
        last = None
    if last is None:
        return None
    if config.get("steps"):
        fraction, words = last["step"] / config["steps"], f"step {last['step']}/{config['steps']}"
    elif config.get("epochs") and last.get("epoch") is not None:
        fraction = last["epoch"] / config["epochs"]
        words = f"step {last['step']}, epoch {last['epoch']:.2f}/{config['epochs']:g}"
    else:
        return None
    return min(max(fraction, 0.0), 0.99), words  # a run is whole only when its record exists


class InFlight:
    """The runs this invocation trains, {key: (label, folder)}: every `every` seconds, while in its
    `with`, a thread touches their claims and moves the bar (a unit a run) by what they trained."""

    def __init__(self, bar: Any, every: float = WATCH_S) -> None:
        self.bar, self.every, self.runs, self.shown = bar, every, {}, {}
        self.lock, self.stopped = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True, name="runs in flight")

    def __enter__(self) -> InFlight:
        self.bar.bar_format = BAR_FORMAT
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()

    def _watch(self) -> None:
        while not self.stopped.wait(self.every):
            self.poll()

    def poll(self) -> None:
        with self.lock:
            words = []
            for key, (label, folder) in list(self.runs.items()):
                with contextlib.suppress(OSError):
                    os.utime(folder / CLAIM)
                found = run_progress(folder)
                if found is not None and found[0] > self.shown.get(key, 0.0):
                    self.bar.update(found[0] - self.shown.get(key, 0.0))
                    self.shown[key] = found[0]
                if found is not None:
                    words.append(f"{label} {found[1]}")
            if words:
                self.bar.set_postfix_str("; ".join(words), refresh=True)

    def finish(self, key: str) -> None:
        """The run of `key` has its record: it counts whole, and is no longer read."""
        with self.lock:
            self.runs.pop(key, None)
            self.bar.update(1.0 - self.shown.pop(key, 0.0))


# ---------------------------------------------------------------------------- local backends
def rank_main(measure: Callable[..., dict], run: Run, device: str, out: str,
              threads: int) -> dict | None:
    """What each rank of an elastic launch runs: the measurement (rank 0's outcome is the run's)."""
    from torch.distributed.elastic.multiprocessing.errors import record

    if "fork" in multiprocessing.get_all_start_methods():  # loader workers fork, as under torchrun
        multiprocessing.set_start_method("fork", force=True)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # their fork server, before the group's threads
        from vitzoo.data.workers import fork_server_now

        fork_server_now()
    torch.set_num_threads(threads)
    # record: a failing rank's traceback goes where the launcher reads it
    outcome = record(measure)(run, device=device, out=Path(out))
    return outcome if int(os.environ.get("RANK", "0")) == 0 else None


def launch(measure: Callable[..., dict], run: Run, out: Path, assignment: Assignment,
           slot: tuple[str, ...]) -> dict:
    """Train `run` as `processes_per_run` ranks through the elastic launcher, seeing `slot`'s GPUs
    only; rank 0's outcome. A failed rank raises RuntimeError with its error and the logs."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logs, before = out / "logs", dict(os.environ)
    os.environ["OMP_NUM_THREADS"] = str(assignment.threads_per_process)
    if assignment.device == "cuda":  # local rank k trains on the set's k-th GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, slot))
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
    """One run on its slot, with its wall time, start and threads: a run of one CPU process in this
    process (a pool's worker sets its share of the threads), else through the elastic launcher."""
    out.mkdir(parents=True, exist_ok=True)
    started, start = time.time(), time.perf_counter()
    if assignment.device == "cpu" and assignment.processes_per_run == 1:
        if in_pool:
            torch.set_num_threads(assignment.threads_per_process)
        outcome, threads = measure(run, device="cpu", out=out), torch.get_num_threads()
    else:
        outcome = launch(measure, run, out, assignment, slot)
        threads = assignment.threads_per_process
    return {"outcome": outcome, "wall_s": time.perf_counter() - start, "started": started,
            "threads": threads}


class _InThisProcess:
    """A pool of one that runs what is submitted at once, in this process."""

    def submit(self, fn: Callable, *args: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:  # noqa: BLE001  (read where a pool's failures are read)
            future.set_exception(exc)
        return future

    def shutdown(self) -> None:
        """Nothing to end."""


def execute(runs: Iterable[Run], measure: Callable[..., dict], store: ResultStore,
            assignment: Assignment, quiet: bool = False, slurm_options: Any = None,
            wait_for_jobs: bool = True, minutes: Callable[[Run], float] | None = None,
            claim_poll_s: float = 10.0) -> list[dict]:
    """Measure every run without a record as `assignment` says; the records of the runs measured
    so far, in order. `measure(run, device=..., out=...)` trains the run in its folder `out`.

    Locally a run is claimed before it starts (one another invocation holds is waited for, looked
    for every `claim_poll_s`) and its record stored as it ends; a failed run starts no further run
    and is raised once the runs going are in. Under SLURM: benchmarks.slurm.submit."""
    runs = list(runs)
    store.refresh()
    if assignment.launcher == "slurm":
        from benchmarks import slurm

        todo = [run for run in runs if store.get(run.key) is None]
        slurm.submit(todo, measure, store, assignment, slurm_options or slurm.SlurmOptions(),
                     wait_for_jobs, minutes, quiet)
        return records(runs, store)
    at_once = len(assignment.slots)
    done = sum(store.get(run.key) is not None for run in runs)
    bar = tqdm(total=len(runs), initial=done, unit="run", disable=quiet, dynamic_ncols=True,
               desc=runs[0].ablation if runs else "")
    # spawn, not fork: a forked child of a process that has used OpenMP threads can hang
    pool = (ProcessPoolExecutor(at_once, mp_context=multiprocessing.get_context("spawn"))
            if at_once > 1 else _InThisProcess())
    going: dict[Future, tuple[Run, tuple[str, ...]]] = {}
    free, claimed, failure, said = list(assignment.slots), [], None, False
    try:
        with InFlight(bar) as flight:
            while True:
                store.refresh()
                started = {run.key for run, _ in going.values()}
                left = [r for r in runs if store.get(r.key) is None and r.key not in started]
                while failure is None and free and left:
                    run = next((r for r in left if claim(run_folder(store, r))), None)
                    if run is None:
                        break
                    left.remove(run)
                    slot, folder = free.pop(0), run_folder(store, run)
                    claimed.append(folder)
                    with flight.lock:
                        flight.runs[run.key] = (f"{run.label} seed {run.seed}", folder)
                    future = pool.submit(train_one, measure, run, folder, assignment, slot,
                                         at_once > 1)
                    going[future] = (run, slot)
                if not going and (failure is not None or not left):
                    break
                if not going:  # every run left is another invocation's: wait for its record
                    if not said:
                        print(f"{len(left)} run(s) of {left[0].ablation} are being trained by "
                              "another invocation on this --out (claims in their folders); waiting "
                              "for their results", flush=True)
                    said = True
                    time.sleep(claim_poll_s)
                    continue
                for future in wait(list(going), return_when=FIRST_COMPLETED)[0]:
                    run, slot = going.pop(future)
                    free.append(slot)
                    claimed.remove(run_folder(store, run))
                    release(run_folder(store, run))
                    if future.exception() is not None:
                        failure = failure or future.exception()
                        with flight.lock:
                            flight.runs.pop(run.key, None)
                        continue
                    result = future.result()
                    store.add(make_record(run, result["outcome"], result["wall_s"],
                                          assignment.device, launcher="local",
                                          processes=assignment.processes_per_run,
                                          threads=result["threads"],
                                          started=round(result["started"], 3),
                                          **({"gpus": list(slot)} if slot else {})))
                    flight.finish(run.key)
    finally:
        for folder in claimed:  # interrupted
            release(folder)
        pool.shutdown()
        bar.close()
    if failure is not None:
        raise failure
    return records(runs, store)


def records(runs: list[Run], store: ResultStore) -> list[dict]:
    """The stored records of `runs`, in order; labels and groups follow the current plan."""
    store.refresh()
    return [{**store.get(run.key), "label": run.label, "group": run.group}
            for run in runs if store.get(run.key)]
