"""Atomic writes: a reader never sees a half-written file, or a half-replaced set of files, under its final name."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it is fsynced and renamed over `path`.

    On an exception the temporary file is removed and `path` is left as it was.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, final)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _fsync_directory(path: Path) -> None:
    """Make a rename inside `path` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _publish(stage: Path, final: Path, names: tuple[str, ...]) -> None:
    """Put the files staged in `stage` under `final`, so that a reader sees all of them or none."""
    parent = final.parent
    entries = None if final.is_symlink() or not final.is_dir() else {p.name for p in final.iterdir()}
    if not final.exists() and not final.is_symlink():
        os.rename(stage, final)  # a new directory appears whole
    elif entries is not None and entries <= set(names):
        # an earlier save and nothing else: swap the directories, the old one goes only once the new one is in
        old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=parent))
        os.rename(final, old / final.name)
        try:
            os.rename(stage, final)
        except BaseException:
            os.rename(old / final.name, final)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        # a directory that holds more (a training run): every file is complete before the first rename,
        # the names are renamed in the order given (the one that marks the save complete comes last)
        for name in names:
            if (stage / name).exists():
                os.replace(stage / name, final / name)
        _fsync_directory(final)
    _fsync_directory(parent)


@contextlib.contextmanager
def staged_directory(path: str | os.PathLike, names: tuple[str, ...]) -> Iterator[Path]:
    """Yield an empty directory beside `path` to write the files `names` into; on success they replace
    those of `path` together, on an exception nothing under `path` has changed.

    `path` may not exist (it appears whole), hold an earlier set of these files (swapped for the new
    one), or hold other files too, such as a training run's (each of `names` is renamed into it)."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    stage = final.parent / f".{final.name}.{uuid.uuid4().hex[:12]}.tmp"
    stage.mkdir()  # not mkdtemp: the directory that appears gets the usual permissions (umask), not 0700
    try:
        yield stage
        _publish(stage, final, names)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
