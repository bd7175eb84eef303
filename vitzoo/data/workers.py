"""How a data loader starts its worker processes.

A loader forks its workers (Linux's default): the fastest start. In a process of a distributed
group, on CPython before 3.12, that fork can hang the child: a thread of the group (gloo's, NCCL's)
that registers with the interpreter as it is forked leaves the child the interpreter's lock held
(python/cpython#112275). There the workers fork from a fork server instead, a process per rank
without threads that has imported torch, torchvision and vitzoo once. A process that will join a
group can fork that server at its start, while it has one thread (`fork_server_now`): no second
interpreter importing torch again (about 5 CPU seconds).
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
from multiprocessing.context import BaseContext

import torch.distributed as dist

# what the fork server imports once, so that each worker it forks starts at once
SERVER_PRELOAD = ["__main__", "torch", "torchvision", "vitzoo", "vitzoo.data"]


def fork_hangs_in_threads() -> bool:
    """Whether a child forked from a process whose C threads call into Python may hang."""
    return sys.version_info < (3, 12)


def worker_start(num_workers: int) -> BaseContext | None:
    """The start method of a DataLoader with `num_workers` workers: None (the default), or a fork
    server's where the default would fork a process of a distributed group that may hang."""
    in_group = num_workers > 0 and dist.is_available() and dist.is_initialized()
    if not (in_group and fork_hangs_in_threads() and multiprocessing.get_start_method() == "fork"):
        return None
    multiprocessing.set_forkserver_preload(SERVER_PRELOAD)  # read as the server starts
    return multiprocessing.get_context("forkserver")


def fork_server_now() -> bool:
    """Fork this process's loader fork server now, if `worker_start` would use one, none runs yet,
    no process group exists and no other thread runs; returns whether it did. Call it before the
    process group starts; otherwise the first loader starts the server."""
    import threading
    from multiprocessing import connection, forkserver, resource_tracker, util

    if not fork_hangs_in_threads():
        return False
    if threading.active_count() > 1 or (dist.is_available() and dist.is_initialized()):
        return False
    for name in SERVER_PRELOAD[1:]:  # what a worker unpickles its dataset with, imported once, here
        __import__(name)
    server = forkserver._forkserver
    # one thread: no other can be starting a server meanwhile, nor hold its lock as the child forks
    resource_tracker.ensure_running()
    if server._forkserver_pid is not None:
        return False
    address = connection.arbitrary_address("AF_UNIX")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()  # the server ends when every holder of alive_w has
        pid = os.fork()
        if pid == 0:  # the server: keeps its socket and pipe only, never runs this process's exit
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
    server._forkserver_address, server._forkserver_alive_fd = address, alive_w
    server._forkserver_pid = pid
    multiprocessing.set_forkserver_preload(SERVER_PRELOAD)
    return True
