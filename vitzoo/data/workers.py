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

Multiprocessing starts that server as a fresh interpreter, which imports torch again: about 5 CPU
seconds per process (more than a small run's training). A process that knows it will join a group can
fork its server at its start instead, while it has a single thread (`fork_server_now`): the same
thread-free server, with what the process has imported already in it.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
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


def fork_server_now() -> bool:
    """Fork this process's loader fork server now, if `worker_start` would use one, none runs yet, no
    process group exists and no other Python thread runs (the threads that enter the interpreter: those
    whose fork can hang); the server then holds what the process imported (no interpreter start, no
    second import of torch). Call it before the process group starts; returns whether it started one.
    Otherwise the first loader starts the server as before."""
    import threading
    from multiprocessing import connection, forkserver, resource_tracker, util

    if not fork_hangs_in_threads() or "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    if threading.active_count() > 1 or (dist.is_available() and dist.is_initialized()):
        return False
    for name in SERVER_PRELOAD[1:]:  # what a worker unpickles its dataset with, imported once, here
        __import__(name)
    server = forkserver._forkserver
    # one Python thread: no other can be starting a server meanwhile (nor hold its lock as the child is forked)
    resource_tracker.ensure_running()
    if server._forkserver_pid is not None:
        return False
    address = connection.arbitrary_address("AF_UNIX")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()  # the server ends when every holder of alive_w has (this process, its workers)
        pid = os.fork()
        if pid == 0:  # the server: keeps its socket and pipe only, never runs this process's exit handlers
            try:
                keep = {0, 1, 2, listener.fileno(), alive_r}
                for fd in map(int, os.listdir("/proc/self/fd")):
                    if fd not in keep:
                        try:
                            os.close(fd)
                        except OSError:
                            pass
                forkserver.main(listener.fileno(), alive_r, [])
            finally:
                os._exit(0)
        os.close(alive_r)
    server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid
    multiprocessing.set_forkserver_preload(SERVER_PRELOAD)
    return True
