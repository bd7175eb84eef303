"""How a data loader starts its worker processes.

A loader forks its workers from the process that iterates it (Linux's default): the fastest start, the
workers inheriting what that process imported. In a process of a distributed group, on CPython before
3.12, that fork can hang the child for ever. The group's threads (gloo's, NCCL's) register with the
interpreter whenever they drop a tensor that Python held; a child forked while one registers inherits the
interpreter's thread-state lock held, and waits on it at its first step (python/cpython#112275; two gloo
processes that start a 2-worker loader after each all-gather hang within 200 loaders here, and a transfer
rehearsal hung in its few-shot evaluation). There the workers start from a fork server instead: one
process per rank that has imported torch, torchvision and vitzoo once (seconds, once per process) and has
no threads, from which each worker forks.
"""

from __future__ import annotations

import multiprocessing
import sys
from multiprocessing.context import BaseContext

import torch.distributed as dist

# what the fork server imports once, so that each worker it forks starts at once; "__main__" is the default
SERVER_PRELOAD = ["__main__", "torch", "torchvision", "vitzoo", "vitzoo.data"]


def fork_hangs_in_threads() -> bool:
    """Whether a child forked from a process whose C threads call into Python may hang (CPython < 3.12:
    later 3.8-3.11 patch releases were mended too, but which is not worth a table: the cost is seconds)."""
    return sys.version_info < (3, 12)


def worker_start(num_workers: int) -> BaseContext | None:
    """The start method of a DataLoader with `num_workers` workers: None (the default; always without
    workers) or a fork server's where the default would fork a process of a distributed group on an
    interpreter that may hang the child."""
    in_group = num_workers > 0 and dist.is_available() and dist.is_initialized()
    if not (in_group and fork_hangs_in_threads() and multiprocessing.get_start_method() == "fork"):
        return None
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    multiprocessing.set_forkserver_preload(SERVER_PRELOAD)  # read when the server starts, at the first loader
    return multiprocessing.get_context("forkserver")
