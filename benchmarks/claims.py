"""One invocation trains a run at a time: a claim file in the run's folder, made atomically.

Two `python -m benchmarks` invocations on one --out had both trained every run at once in the same run
folders. Before a run is trained here, its folder gets `claim.json` (host, pid, start), created with
O_CREAT | O_EXCL: of two invocations, exactly one creates it, on a local disk as on NFS v3+ or Lustre,
and no lock daemon (flock, fcntl) is needed, which cluster file systems may not hold. The other
invocation skips the run and waits for its result, training it itself only if the claim goes stale.

A claim is stale when its owner is gone: a process of this host that no longer runs, or a claim whose
heartbeat (the owner touches the file every `HEARTBEAT_S` while it trains) is older than `STALE_S`,
which also covers an owner on another host that died. A stale claim is replaced by an atomic rename,
so two invocations that both find it stale cannot both take it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

CLAIM = "claim.json"
HEARTBEAT_S = 30.0  # how often a held claim is touched
STALE_S = 300.0  # a claim untouched this long is its dead owner's


def _owner() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def holder(folder: Path) -> dict[str, Any] | None:
    """Who holds the run in `folder`, or None when no live claim is there (none, or a stale one)."""
    path = folder / CLAIM
    try:
        owner = json.loads(path.read_text(encoding="utf-8"))
        age = time.time() - path.stat().st_mtime
    except (OSError, ValueError):
        return None  # gone meanwhile, or not a claim's text (a claim is created whole: see _create)
    if not isinstance(owner, dict):
        return None
    if owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int) and not _alive(owner["pid"]):
        return None
    return owner if age < STALE_S else None


def _create(path: Path, owner: dict[str, Any]) -> bool:
    """Create the claim whole or not at all: its text is written beside it first, then hard-linked into
    place (a link fails where the name exists). A claim created empty and filled after would be seen,
    in between, as a dead writer's half-written claim: stale, so taken by a second invocation."""
    staged = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.new")
    staged.write_text(json.dumps(owner), encoding="utf-8")
    try:
        os.link(staged, path)
    except FileExistsError:
        return False
    finally:
        staged.unlink(missing_ok=True)
    return True


def take(folder: Path) -> bool:
    """Claim the run in `folder` for this process: True when it is now ours (or already was), False when
    a live claim of another process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    path, owner = folder / CLAIM, _owner()
    if _create(path, owner):
        return True
    judged = _text(path)
    current = holder(folder)
    if current is not None:
        return current.get("host") == owner["host"] and current.get("pid") == owner["pid"]
    # stale: moved aside by exactly one of the invocations that found it so (a rename of the same file
    # succeeds once), which then claims the run afresh
    aside = folder / f".{CLAIM}.{uuid.uuid4().hex[:8]}.stale"
    try:
        os.rename(path, aside)
    except FileNotFoundError:  # another invocation moved it first
        return _create(path, owner)
    if _text(aside) != judged:  # a fresh claim, made since it was judged: put back (unless another is there)
        with contextlib.suppress(OSError):
            os.link(aside, path)
        aside.unlink(missing_ok=True)
        return False
    aside.unlink(missing_ok=True)
    return _create(path, owner)


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def release(folder: Path) -> None:
    """Give up this process's claim on the run in `folder` (a claim of another process is left alone)."""
    current = holder(folder)
    if current is not None and current.get("pid") == os.getpid() and current.get("host") == socket.gethostname():
        (folder / CLAIM).unlink(missing_ok=True)


@contextlib.contextmanager
def heartbeat(folders: list[Path]) -> Iterator[None]:
    """Touch the claims of `folders` every HEARTBEAT_S while the block runs, so that they never look stale."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            for folder in list(folders):
                with contextlib.suppress(OSError):
                    os.utime(folder / CLAIM)

    thread = threading.Thread(target=beat, daemon=True, name="claims-heartbeat")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


__all__ = ["CLAIM", "HEARTBEAT_S", "STALE_S", "heartbeat", "holder", "release", "take"]
