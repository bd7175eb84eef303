"""Signals during training: each asks the loop to stop at the end of its step, with a checkpoint, so
that --resume (or a requeued cluster job) continues it.

- SIGINT (Ctrl-C), SIGTERM (a scheduler ending or preempting the job), SIGUSR2 (SLURM's warning
  before a time limit or preemption, `--signal=USR2@...`, as submitit asks for) and SIGHUP (the terminal
  or SSH session that started the run closed; by default it would kill the process without a
  checkpoint): all stop the loop.
- A second SIGINT stops at once (the user insists). Other signals after the first are taken as the same
  request: a scheduler often sends SIGTERM and SIGUSR2 together, and the checkpoint must still be written.
- A signal the process was started ignoring stays ignored: `nohup vitzoo train ... &` ignores SIGHUP so
  that the run outlives the terminal, and so it does.
"""

from __future__ import annotations

import contextlib
import signal
import threading

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR2", "SIGHUP") if hasattr(signal, name))


@contextlib.contextmanager
def stop_signals(flag: dict):
    """STOP_SIGNALS set flag["signal"] (the first one received); the loop then checkpoints and returns.
    A second SIGINT stops at once; a signal ignored on entry (SIGHUP under nohup) is left ignored. The
    previous handlers are restored on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if flag.get("signal") and signum == signal.SIGINT:
            raise KeyboardInterrupt
        flag.setdefault("signal", signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


__all__ = ["STOP_SIGNALS", "stop_signals"]
