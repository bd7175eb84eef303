"""How an ablation's runs are measured: in this process or worker processes (one CPU process per run),
as data-parallel jobs through PyTorch's elastic launcher (several processes, or GPUs), or as SLURM
jobs; each result goes to the ablation's results store as soon as it arrives."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from benchmarks import claims
from benchmarks.launchers import local, slurm
from benchmarks.launchers.assign import Assignment
from benchmarks.progress import InRunProgress
from benchmarks.suite import ResultStore, Run, make_record, run_folder

CLAIM_POLL_S = 10.0  # how often a suite waiting for another invocation's runs looks for their results


def _measured(measure: Callable[..., dict[str, Any]], run: Run, device: str, out: Path, threads: int | None) -> dict[str, Any]:
    """One run measured in this process (one of several workers when `threads` is given), with its wall time."""
    if threads is not None:
        torch.set_num_threads(threads)
    started, start = time.time(), time.perf_counter()
    outcome = measure(run, device=device, out=out)
    # the threads it trained with, recorded as they were: a float32 sum's order, so its last bits, depend on them
    return {"outcome": outcome, "wall_s": time.perf_counter() - start, "started": started, "threads": torch.get_num_threads()}


def execute(
    runs: Iterable[Run],
    measure: Callable[..., dict[str, Any]],
    store: ResultStore,
    assignment: Assignment,
    quiet: bool = False,
    cluster: slurm.SlurmOptions | None = None,
    wait: bool = True,
    minutes: Callable[[Run], float] | None = None,
) -> list[dict[str, Any]]:
    """Measure every run that has no result yet, as `assignment` (benchmarks.launchers.assign) says;
    return the records of all runs measured so far, in order.

    `measure(run, device=..., out=...)` returns {"metrics": {...}, "flops": ..., ...} for the run trained
    in its folder `out`; wall time, launch and environment are added here. Records already in the store
    (of this process or any other) are reused, so an interrupted suite continues. On the CPU with one
    process per run, runs go at once in that many worker processes (one CPU thread each on 2 cores); a
    run of several processes, or on GPUs, is one data-parallel job through the elastic launcher, one per
    GPU set at once (`benchmarks.launchers.local`); under SLURM each run is submitted as a job
    (`benchmarks.launchers.slurm`, with `cluster` its options, `minutes(run)` its planned time), and the
    suite waits for them unless `wait` is False. Each result is stored as soon as it arrives.
    """
    runs = list(runs)
    store.refresh()
    todo = [run for run in runs if store.get(run.key) is None]
    if assignment.launcher != "local":
        slurm.submit(todo, measure, store, assignment, cluster or slurm.SlurmOptions(), wait, minutes, quiet)
        return records(runs, store)
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), desc=runs[0].ablation if runs else "",
               unit="run", disable=quiet, dynamic_ncols=True)

    def pending() -> list[Run]:  # what no other process has measured meanwhile
        store.refresh()
        return [run for run in todo if store.get(run.key) is None]

    said = False
    while left := pending():
        # a run another invocation on this --out trains is skipped here and waited for (benchmarks/claims.py)
        mine: list[Run] = []  # one at a time in one process, so that two invocations share the runs
        for run in left:
            if len(mine) < (1 if len(assignment.slots) <= 1 else len(left)) and claims.take(run_folder(store, run)):
                mine.append(run)
        if mine:
            folders = [run_folder(store, run) for run in mine]
            try:
                in_flight = {run.key: (f"{run.label} seed {run.seed}", folder) for run, folder in zip(mine, folders)}
                with claims.heartbeat(folders), InRunProgress(bar, in_flight) as progress:
                    _measure_local(mine, measure, store, assignment, bar, progress)
            finally:
                for folder in folders:
                    claims.release(folder)
        elif not said:
            print(f"{len(left)} run(s) of {left[0].ablation} are being trained by another invocation on this --out "
                  f"(claims in their folders); waiting for their results", flush=True)
            said = True
        if not mine:
            time.sleep(CLAIM_POLL_S)
    bar.close()
    return records(runs, store)


def _measure_local(todo: list[Run], measure: Callable[..., dict[str, Any]], store: ResultStore, assignment: Assignment,
                   bar: tqdm, progress: InRunProgress | None = None) -> None:
    """Measure `todo` (runs this process has claimed) on this machine, storing each result as it arrives;
    `progress` moves the bar inside the runs (benchmarks/progress.py)."""
    launch = {"launcher": "local", "processes": assignment.processes_per_run}

    def done(run: Run, result: dict[str, Any]) -> None:
        store.add(make_record(run, result["outcome"], result["wall_s"], assignment.device, **launch,
                              threads=result.get("threads", assignment.threads_per_process), started=round(result["started"], 3),
                              **({"gpus": result["slot"]} if result.get("slot") else {})))
        bar.set_postfix_str(f"{run.label} seed {run.seed}")
        if progress is not None:
            progress.finish(run.key)
        else:
            bar.update(1)

    def pending() -> list[Run]:  # what no other process has measured meanwhile
        store.refresh()
        return [run for run in todo if store.get(run.key) is None]

    device = assignment.device
    in_process = assignment.device == "cpu" and assignment.processes_per_run == 1
    if len(assignment.slots) <= 1 or len(todo) <= 1:
        for run in todo:
            if store.get(run.key) is None:
                if in_process:
                    done(run, _measured(measure, run, device, run_folder(store, run), None))
                else:
                    done(run, local.timed_launch(measure, run, run_folder(store, run), assignment, assignment.slots[0]))
                store.refresh()
    elif in_process:
        # spawn, not fork: a forked child of a process that has used OpenMP threads can hang
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=len(assignment.slots), mp_context=context) as pool:
            futures = {pool.submit(_measured, measure, run, device, run_folder(store, run),
                                   assignment.threads_per_process): run for run in pending()}
            for run, result in local.as_finished(futures):
                done(run, result)
    else:
        for run, result in local.launch_at_once(measure, pending(), lambda run: run_folder(store, run), assignment):
            done(run, result)


def records(runs: list[Run], store: ResultStore) -> list[dict[str, Any]]:
    """The stored records of `runs` (those measured so far, by any process), in the runs' order; labels are
    presentation: they follow the current plan, even for results measured earlier."""
    store.refresh()
    return [{**store.get(run.key), "label": run.label, "group": run.group} for run in runs if store.get(run.key)]


__all__ = ["execute", "records"]
