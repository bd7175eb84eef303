"""How long a request to the Hub may take: a deadline on the whole of it, not only on each read.

A timeout on each read stops a silent server, not a slow one: one that sends a header line every two
seconds never lets a 5-second read timeout fire, and keeps a call waiting for ever. So every request
huggingface_hub sends through its HTTP client gets `settings.timeout()` seconds (VITZOO_HUB_TIMEOUT)
in all to connect and move at least PROGRESS bytes; each time it has, it gets that long again for the
next PROGRESS bytes. An answer, its head included, that does not come at that rate is a read timeout,
as from a silent server: huggingface_hub then falls back on the cache, and vitzoo says which server
did not answer. A download of any size still goes through at any usable speed (64 KiB in 30 s is
2 KiB/s).

The clock is kept per thread (huggingface_hub downloads files in worker threads; each request runs
in one), started by `start` when a request is sent (a request hook, `vitzoo.hub.transport`), and read
by the network streams of huggingface_hub's client, which `install` wraps.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

PROGRESS = 64 * 1024  # bytes a request must move within each timeout

_clock = threading.local()


@contextlib.contextmanager
def call(limit: float) -> Iterator[None]:
    """A Hub call (a download, an upload) in this thread: its requests may wait `limit` seconds in all
    for their answers (their time until their first PROGRESS bytes moved), however many there are."""
    outer = getattr(_clock, "budget", None), getattr(_clock, "call_limit", None)
    _settle()
    _clock.budget = limit if outer[0] is None else min(outer[0], limit)
    _clock.call_limit = limit
    try:
        yield
    finally:
        _settle()
        _clock.budget, _clock.call_limit = outer


def _settle() -> None:
    """Charge the call with the wait of this thread's last request, if it is still charged."""
    if getattr(_clock, "charging", False):
        _clock.budget -= _clock.last - _clock.since
        _clock.charging = False


def start(limit: float) -> None:
    """A request begins in this thread: it has `limit` seconds for its first PROGRESS bytes (and each
    next PROGRESS bytes), and its wait until then is charged to the call it belongs to."""
    _settle()
    now = time.monotonic()
    _clock.limit, _clock.since, _clock.last, _clock.moved = limit, now, now, 0
    _clock.charging = getattr(_clock, "budget", None) is not None


def _remaining() -> tuple[float, str] | None:
    """Seconds left to this thread's request and what runs out then, or None when no request started
    here (no deadline)."""
    limit = getattr(_clock, "limit", None)
    if limit is None:
        return None
    now = time.monotonic()
    if _clock.moved >= PROGRESS:  # progress made: a new stretch, no longer charged to the call
        _clock.last = now
        _settle()
        _clock.since, _clock.moved = now, 0
    left = (_clock.since + limit - now, f"less than {PROGRESS // 1024} KiB came or went in {limit:g} s")
    if _clock.charging and _clock.budget - (now - _clock.since) < left[0]:
        left = (_clock.budget - (now - _clock.since), f"the call's requests waited {_clock.call_limit:g} s in all for answers")
    return left


def _bounded(timeout: float | None, error: type[Exception]) -> float | None:
    """`timeout`, shortened to the time left to the request; `error` when none is left."""
    remaining = _remaining()
    if remaining is None:
        return timeout
    left, reason = remaining
    if left <= 0:
        raise error(f"{reason} (VITZOO_HUB_TIMEOUT)")
    return left if timeout is None else min(timeout, left)


@contextlib.contextmanager
def _io() -> Iterator[None]:
    """Around a read or write: when it ended (done, or timed out) is when the request last waited."""
    try:
        yield
    finally:
        if getattr(_clock, "limit", None) is not None:
            _clock.last = time.monotonic()


def _moved(count: int) -> None:
    if getattr(_clock, "limit", None) is not None:
        _clock.moved += count


class _Stream:
    """A network stream of the HTTP client whose reads and writes keep the request's deadline."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        from httpcore2 import ReadTimeout

        with _io():
            data = self._stream.read(max_bytes, _bounded(timeout, ReadTimeout))
        _moved(len(data))
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        from httpcore2 import WriteTimeout

        # written in pieces, so that a large body keeps to the deadline as it goes
        for offset in range(0, max(len(buffer), 1), PROGRESS):
            piece = buffer[offset:offset + PROGRESS]
            with _io():
                self._stream.write(piece, _bounded(timeout, WriteTimeout))
            _moved(len(piece))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        from httpcore2 import ConnectTimeout

        return _Stream(self._stream.start_tls(ssl_context, server_hostname, _bounded(timeout, ConnectTimeout)))

    def get_extra_info(self, info: str):
        return self._stream.get_extra_info(info)


class _Backend:
    """The HTTP client's network backend, its connections kept to the deadline (`_Stream`)."""

    def __init__(self, backend) -> None:
        self._backend = backend

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        from httpcore2 import ConnectTimeout

        with _io():
            return _Stream(self._backend.connect_tcp(host, port, _bounded(timeout, ConnectTimeout), local_address,
                                                     socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        from httpcore2 import ConnectTimeout

        return _Stream(self._backend.connect_unix_socket(path, _bounded(timeout, ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def install(client) -> bool:
    """Keep the connections `client` (an httpx2.Client) makes to the deadline; False when its transports
    are not the standard ones (a client factory of one's own), whose connections are then bounded by
    the per-read timeouts only."""
    transports = [client._transport, *(t for t in client._mounts.values() if t is not None)]
    pools = [getattr(t, "_pool", None) for t in transports]
    if not all(hasattr(pool, "_network_backend") for pool in pools):
        return False
    for pool in pools:
        if not isinstance(pool._network_backend, _Backend):
            pool._network_backend = _Backend(pool._network_backend)
    return True
