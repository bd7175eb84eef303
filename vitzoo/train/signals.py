"""SIGINT / SIGTERM during training: the first asks the loop to stop at the end of its step (with a
checkpoint, so that --resume continues it); a second stops at once."""

from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def stop_signals(flag: dict):
    """SIGINT / SIGTERM set flag["signal"]; the loop then checkpoints and returns. A second signal
    stops at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if flag.get("signal"):
            raise KeyboardInterrupt
        flag["signal"] = signum

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


__all__ = ["stop_signals"]
