"""A data loader's workers start where they cannot hang: forked from the process itself, except in
a process of a distributed group on CPython before 3.12, where a forked child can inherit the
interpreter's lock held by one of the group's threads; there they fork from a fork server."""

import multiprocessing
import multiprocessing.forkserver
import sys
import threading
import time

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data import TensorDataset

from vitzoo.data.workers import SERVER_PRELOAD, fork_server_now, worker_start
from vitzoo.evaluate import eval_loader


def _in_group(rank: int, store_path: str, passes: int, results) -> None:
    multiprocessing.set_start_method("fork", force=True)  # as under torchrun
    # rank 0 forks its server before the group's threads exist; rank 1's first loader starts one
    forked_early = fork_server_now() if rank == 0 else False
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", store=torch.distributed.FileStore(store_path, 2),
                                         rank=rank, world_size=2)
    late = fork_server_now()  # in a group it is too late: its threads may enter the interpreter
    dataset = TensorDataset(torch.randn(64, 8), torch.arange(64))
    context = eval_loader(dataset, batch_size=16, num_workers=2).multiprocessing_context
    seen = 0
    for _ in range(passes):  # what an evaluation does: a collective, then a fresh loader's pass
        gathered = [torch.empty(100) for _ in range(2)]
        torch.distributed.all_gather(gathered, torch.randn(100))
        del gathered  # gloo's threads release their share later, entering the interpreter
        seen += sum(len(labels) for _, labels in eval_loader(dataset, batch_size=16,
                                                             num_workers=2))
    results[rank] = {"method": context and context.get_start_method(), "seen": seen,
                     "forked_early": forked_early, "late": late,
                     "preload": list(multiprocessing.forkserver._forkserver._preload_modules),
                     "without_workers": eval_loader(dataset, num_workers=0).multiprocessing_context}
    torch.distributed.destroy_process_group()


def test_outside_a_distributed_group_workers_are_forked_as_by_default():
    assert worker_start(2) is None and worker_start(0) is None


@pytest.mark.slow
def test_in_a_distributed_group_loader_passes_after_collectives_never_hang(tmp_path):
    """Two gloo processes, each running a fresh 2-worker loader after each all-gather. Forked from
    the process itself, such loaders hung within 40-180 passes (CPython 3.11); from the fork server
    (asserted below) no fork happens in the group's process, so 30 passes show the path works."""
    passes = 30
    with mp.Manager() as manager:
        results = manager.dict()
        group = mp.start_processes(_in_group, args=(str(tmp_path / "store"), passes, results),
                                   nprocs=2, join=False, start_method="spawn")
        deadline = time.monotonic() + 200
        while not group.join(timeout=1):
            if time.monotonic() > deadline:
                for process in group.processes:
                    process.kill()
                pytest.fail(f"a process of the group hung: {passes} loader passes not done")
        results = dict(results)
    for rank in (0, 1):
        assert results[rank]["seen"] == passes * 64 and results[rank]["without_workers"] is None
        assert results[rank]["late"] is False
        if sys.version_info < (3, 12):
            assert results[rank]["method"] == "forkserver"
            assert set(SERVER_PRELOAD) <= set(results[rank]["preload"])
            assert results[rank]["forked_early"] is (rank == 0)
        else:
            assert results[rank]["method"] is None and results[rank]["forked_early"] is False


def test_a_fork_server_is_never_forked_from_a_process_with_threads():
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
