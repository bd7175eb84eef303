"""One run as one data-parallel job on this machine, started by PyTorch's elastic launcher (the
machinery behind `torchrun`): `processes_per_run` workers, gloo on the CPU, NCCL on a run's GPUs.

The suite gives each run going at once its own GPU set: the launching process sees only those
(CUDA_VISIBLE_DEVICES), so worker k trains on the set's k-th GPU. Every worker's stdout and stderr go
to the run's log folder (RUN/logs/), and a worker's traceback is reported with the log's path.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable

from benchmarks.launchers.assign import Assignment

PRELOAD = ["torch", "torchvision", "vitzoo", "vitzoo.train", "benchmarks.training", "benchmarks.launchers.local"]


def rank_main(measure: Callable[..., dict], run: Any, device: str, out: str, threads: int) -> dict | None:
    """What each worker runs: the measurement of the run (training on every rank, all-reduced), whose
    outcome rank 0 returns."""
    import multiprocessing

    import torch

    # A worker started by the elastic launcher has the launcher's start method as its default, so each data
    # loader would start its workers that way too (spawn: a fresh interpreter importing torch, seconds per
    # loader). Under torchrun's command line they fork, Linux's default: the same here.
    if "fork" in multiprocessing.get_all_start_methods():
        multiprocessing.set_start_method("fork", force=True)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # The loader workers of a group's process start from a fork server on Python < 3.12: forked here,
        # before the group's threads exist, it costs no interpreter start and no second import of torch
        # (about 5 CPU seconds a process: a rehearsal run's two ranks spent more on that than on training).
        from vitzoo.data.workers import fork_server_now

        fork_server_now()
    torch.set_num_threads(threads)
    outcome = measure(run, device=device, out=Path(out))
    return outcome if int(os.environ.get("RANK", "0")) == 0 else None


def _logged_worker(*args):
    # the decorator writes a failing worker's traceback where the launcher reads it (its error file)
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(rank_main)(*args)


def launch(measure: Callable[..., dict], run: Any, out: Path, assignment: Assignment, slot: tuple[int, ...]) -> dict:
    """Train `run` in `assignment.processes_per_run` workers on `slot`'s GPUs (or the CPU); rank 0's
    outcome. A failure raises RuntimeError with the failing rank's error and the log folder."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    out.mkdir(parents=True, exist_ok=True)
    logs = out / "logs"
    previous = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")}
    if assignment.device == "cuda":  # the workers see the run's GPUs only: local rank k is the set's k-th
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in slot)
    os.environ["OMP_NUM_THREADS"] = str(assignment.threads_per_process)
    # forkserver: each worker forks from a server process that imported torch and vitzoo once (and never
    # touched CUDA or a thread pool), instead of a fresh interpreter importing them per worker and run
    multiprocessing.set_forkserver_preload(PRELOAD)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=assignment.processes_per_run,
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", run_id=f"{out.name}-{uuid.uuid4().hex[:8]}",
                          max_restarts=0, monitor_interval=0.5, start_method="forkserver",
                          logs_specs=DefaultLogsSpecs(log_dir=str(logs), redirects=Std.ALL))
    try:
        outcomes = elastic_launch(config, _logged_worker)(measure, run, assignment.device, str(out),
                                                          assignment.threads_per_process)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        raise RuntimeError(f"run {out.name}: rank {rank} failed (exit code {failure.exitcode}): "
                           f"{failure_text(failure.message)}\nlogs of every rank: {logs}") from None
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return outcomes[0]


def failure_text(message: str | dict) -> str:
    """A failed worker's error as the launcher read it: its traceback (from the error file the worker's
    `record` wrote), else the launcher's own words (a signal, a lost process)."""
    if isinstance(message, dict):
        stack = message.get("extraInfo", {}).get("py_callstack") or message.get("message", "")
        return str(stack).strip()[-2500:]
    return str(message).strip()[-2500:]


def timed_launch(measure: Callable[..., dict], run: Any, out: Path, assignment: Assignment,
                 slot: tuple[int, ...]) -> dict:
    """`launch`, with the run's wall time, start and GPU set: {"outcome", "wall_s", "started", "slot"}."""
    started, start = time.time(), time.perf_counter()
    outcome = launch(measure, run, out, assignment, slot)
    return {"outcome": outcome, "wall_s": time.perf_counter() - start, "started": started, "slot": list(slot)}


_SLOT: tuple[int, ...] | None = None  # the GPU set of this launching process (one per set, see launch_at_once)


def _take_slot(slots) -> None:
    global _SLOT
    _SLOT = slots.get()


def _launch_on_own_slot(measure: Callable[..., dict], run: Any, out: Path, assignment: Assignment) -> dict:
    return timed_launch(measure, run, out, assignment, _SLOT)


def launch_at_once(measure: Callable[..., dict], runs: list, folder: Callable[[Any], Path],
                   assignment: Assignment) -> Iterator[tuple[Any, dict]]:
    """Launch `runs`, as many at once as the assignment has slots: one launching process per slot, each
    taking its slot (a GPU set) once and keeping it, so runs never share a GPU. Yields (run, result)
    as runs finish; a failed run cancels the runs not started and raises (`as_finished`)."""
    context = multiprocessing.get_context("spawn")
    slots = context.Queue()
    for slot in assignment.slots:
        slots.put(slot)
    with ProcessPoolExecutor(max_workers=len(assignment.slots), mp_context=context, initializer=_take_slot,
                             initargs=(slots,)) as pool:
        futures = {pool.submit(_launch_on_own_slot, measure, run, folder(run), assignment): run for run in runs}
        yield from as_finished(futures)


def as_finished(futures: dict[Future, Any]) -> Iterator[tuple[Any, Any]]:
    """(what each future is for, its result), as they finish. When one fails, the runs not yet started
    are cancelled (a failure in a day-long queue is reported in minutes, not at the end), those already
    running are waited for and yielded (their work is kept), and then the first failure is raised."""
    failure: BaseException | None = None
    for future in as_completed(futures):
        if future.cancelled():
            continue
        try:
            result = future.result()
        except CancelledError:
            continue
        except Exception as exc:  # noqa: BLE001 (raised below, once the running ones are in)
            if failure is None:
                failure = exc
                for queued in futures:
                    queued.cancel()  # does nothing to a running one
            continue
        yield futures[future], result
    if failure is not None:
        raise failure


__all__ = ["as_finished", "launch", "launch_at_once", "rank_main", "timed_launch"]
