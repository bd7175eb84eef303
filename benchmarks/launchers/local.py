"""One run as one data-parallel job on this machine, started by PyTorch's elastic launcher (the
machinery behind `torchrun`): `processes_per_run` workers, gloo on the CPU, NCCL on a run's GPUs.

The suite gives each run going at once its own GPU set: the launching process sees only those
(CUDA_VISIBLE_DEVICES), so worker k trains on the set's k-th GPU. Every worker's stdout and stderr go
to the run's log folder (RUN/logs/), and a worker's traceback is reported with the log's path.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Callable

from benchmarks.launchers.assign import Assignment


def rank_main(measure: Callable[..., dict], run: Any, device: str, out: str, threads: int) -> dict | None:
    """What each worker runs: the measurement of the run (training on every rank, all-reduced), whose
    outcome rank 0 returns."""
    import torch

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
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=assignment.processes_per_run,
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", run_id=f"{out.name}-{uuid.uuid4().hex[:8]}",
                          max_restarts=0, monitor_interval=0.5, start_method="spawn",
                          logs_specs=DefaultLogsSpecs(log_dir=str(logs), redirects=Std.ALL))
    try:
        outcomes = elastic_launch(config, _logged_worker)(measure, run, assignment.device, str(out),
                                                          assignment.threads_per_process)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        message = failure.message if isinstance(failure.message, str) else str(failure.message)
        raise RuntimeError(f"run {out.name}: rank {rank} failed (exit code {failure.exitcode}): "
                           f"{message.strip()[-2000:]}\nlogs of every rank: {logs}") from None
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return outcomes[0]


__all__ = ["launch", "rank_main"]
