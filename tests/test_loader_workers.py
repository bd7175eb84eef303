"""A data loader's workers start where they cannot hang: forked from the process itself, except in a
process of a distributed group on CPython before 3.12, where a forked child can inherit the
interpreter's thread-state lock held by one of the group's threads (python/cpython#112275) and hang at its
first step; there they fork from a fork server that has imported torch and vitzoo once."""

import multiprocessing
import multiprocessing.forkserver
import sys
import time

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data import TensorDataset

from vitzoo.data.workers import SERVER_PRELOAD, fork_server_now, worker_start
from vitzoo.evaluate import eval_loader

OLD_PYTHON = sys.version_info < (3, 12)


def _server_is_an_interpreter_of_its_own() -> bool:
    """Whether this process's fork server was started as a fresh interpreter (multiprocessing's way), not
    forked from this process (`fork_server_now`)."""
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return b"multiprocessing.forkserver" in cmdline.read()


def _in_group(rank: int, world: int, store_path: str, passes: int, results) -> None:
    # as under torchrun: the process forks by default, and belongs to a gloo group
    multiprocessing.set_start_method("fork", force=True)
    # rank 0 forks its workers' server before the group's threads exist (as the benchmarks' launcher
    # does); rank 1 lets the first loader start it, as a fresh interpreter
    forked_early = fork_server_now() if rank == 0 else False
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", store=torch.distributed.FileStore(store_path, world), rank=rank,
                                         world_size=world)
    if rank == 1:  # in a group it is too late: the group's threads may be entering the interpreter
        assert not fork_server_now()
    data = TensorDataset(torch.randn(64, 8), torch.arange(64))
    loader = eval_loader(data, batch_size=16, num_workers=2)
    context = loader.multiprocessing_context
    seen = 0
    for _ in range(passes):  # what an evaluation does: a collective, then a pass over a fresh loader
        gathered = [torch.empty(100) for _ in range(world)]
        torch.distributed.all_gather(gathered, torch.randn(100))
        del gathered  # gloo's threads release their share of these later, entering the interpreter
        seen += sum(len(labels) for _, labels in eval_loader(data, batch_size=16, num_workers=2))
    results[rank] = {"method": context.get_start_method() if context is not None else None, "forked_early": forked_early,
                     "own_interpreter": _server_is_an_interpreter_of_its_own() if context is not None else None,
                     "preload": list(multiprocessing.forkserver._forkserver._preload_modules), "seen": seen,
                     "without_workers": eval_loader(data, num_workers=0).multiprocessing_context}
    torch.distributed.destroy_process_group()


def run_group(tmp_path, passes: int, timeout: float) -> dict:
    """Two gloo processes doing `passes` all-gathers, each followed by a loader pass with 2 workers; a
    process that has not finished after `timeout` seconds fails the test (and is ended)."""
    with mp.Manager() as manager:
        results = manager.dict()
        group = mp.start_processes(_in_group, args=(2, str(tmp_path / "store"), passes, results), nprocs=2,
                                   join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        while not group.join(timeout=1):
            if time.monotonic() > deadline:
                for process in group.processes:
                    process.kill()
                pytest.fail(f"a process of the group hung: {passes} loader passes not done in {timeout:.0f} s")
        return dict(results)


def test_outside_a_distributed_group_workers_are_forked_as_by_default():
    assert worker_start(2) is None and worker_start(0) is None


@pytest.mark.slow
def test_in_a_distributed_group_on_an_old_python_workers_start_from_a_fork_server(tmp_path):
    results = run_group(tmp_path, passes=2, timeout=120)
    for rank in (0, 1):
        assert results[rank]["seen"] == 2 * 64 and results[rank]["without_workers"] is None
        if OLD_PYTHON:
            assert results[rank]["method"] == "forkserver"
            assert set(SERVER_PRELOAD) <= set(results[rank]["preload"])  # workers start without importing torch
            # rank 0's server was forked before the group started (no second interpreter), rank 1's started lazily
            assert results[rank]["forked_early"] is (rank == 0) and results[rank]["own_interpreter"] is (rank == 1)
        else:
            assert results[rank]["method"] is None  # forked, as the interpreter re-initialises its lock
            assert results[rank]["forked_early"] is False  # and no server is needed


def test_a_fork_server_is_never_forked_from_a_process_with_threads():
    """A thread entering the interpreter while the process forks is what hangs a forked child; the
    server forked early must come from a process with no other Python thread, or not at all."""
    import threading

    before = multiprocessing.forkserver._forkserver._forkserver_pid
    release = threading.Event()
    waiting = threading.Thread(target=release.wait, daemon=True)
    waiting.start()
    try:
        assert fork_server_now() is False
    finally:
        release.set()
        waiting.join()
    assert multiprocessing.forkserver._forkserver._forkserver_pid == before


@pytest.mark.slow
def test_loader_passes_after_collectives_never_hang(tmp_path):
    """Before the fork server, two gloo processes forking a 2-worker loader after each all-gather hung
    within 40-180 passes in three runs of three (CPython 3.11.7); a fork-server pass takes ~0.1 s. Rank 0's
    server was forked at its start (`fork_server_now`), rank 1's is an interpreter of its own: neither hangs."""
    results = run_group(tmp_path, passes=150, timeout=240)
    assert [results[rank]["seen"] for rank in (0, 1)] == [150 * 64] * 2
