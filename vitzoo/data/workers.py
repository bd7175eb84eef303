"""How a data loader starts its worker processes.

A loader forks its workers (Linux's default). In a process of a distributed group on CPython
before 3.12, a fork can hang the child: a thread of the group (gloo's, NCCL's) entering the
interpreter as it forks leaves the child its lock held. There the workers fork from a fork server,
a process without threads that has imported torch and vitzoo once; `fork_server_now` forks it from
the process itself before the group starts, instead of a new interpreter importing torch again.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import sys
import threading

import torch.distributed as dist

SERVER_PRELOAD = ["__main__", "torch", "torchvision", "vitzoo", "vitzoo.data"]
FORK_HANGS = sys.version_info < (3, 12)  # where a child forked amid C threads may hang


def worker_start(num_workers: int):
    """A DataLoader's `multiprocessing_context`: None (fork), or a fork server's in a group."""
    if (num_workers and FORK_HANGS and dist.is_initialized()
            and multiprocessing.get_start_method() == "fork"):
        multiprocessing.set_forkserver_preload(SERVER_PRELOAD)
        return multiprocessing.get_context("forkserver")
    return None


def fork_server_now() -> bool:
    """Fork the loaders' fork server now, where one will be needed and this process has one
    thread and no group yet; returns whether it did."""
    from multiprocessing import connection, forkserver, resource_tracker

    # a thread, or a group's threads in C, may hold the interpreter's lock as it forks
    if not FORK_HANGS or threading.active_count() > 1 or dist.is_initialized():
        return False
    for name in SERVER_PRELOAD[1:]:  # imported once, here, for every worker
        __import__(name)
    resource_tracker.ensure_running()
    server = forkserver._forkserver
    if server._forkserver_pid is not None:
        return False
    address = connection.arbitrary_address("AF_UNIX")  # in a folder only this user can read
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        listener.listen()
        alive_r, alive_w = os.pipe()  # the server ends when every holder of alive_w has
        pid = os.fork()
        if pid == 0:  # the server keeps its socket and pipe only, and never returns
            try:
                for fd in map(int, os.listdir("/proc/self/fd")):
                    if fd > 2 and fd not in (listener.fileno(), alive_r):
                        with contextlib.suppress(OSError):
                            os.close(fd)
                forkserver.main(listener.fileno(), alive_r, [])
            finally:
                os._exit(0)
        os.close(alive_r)
    server._forkserver_address, server._forkserver_alive_fd = address, alive_w
    server._forkserver_pid = pid
    multiprocessing.set_forkserver_preload(SERVER_PRELOAD)
    return True
