"""Atomic writes: a reader never sees a half-written file under its final name; and the cache
folder."""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

from vitzoo.envvars import env_path


def cache_dir() -> Path:
    """What vitzoo makes once per machine (datasets, shard indexes): $VITZOO_CACHE, default
    ~/.cache/vitzoo."""
    return env_path("VITZOO_CACHE", Path.home() / ".cache" / "vitzoo")


@contextlib.contextmanager
def naming(final: Path) -> Iterator[None]:
    """An OSError while making a temporary file beside `final` names `final`, the path given."""
    try:
        yield
    except OSError as exc:
        if exc.errno is None:
            raise
        raise type(exc)(exc.errno, f"{exc.strerror} (writing {final})", str(final)) from None


def _temporary(final: Path, suffix: str = ".tmp") -> Path:
    return final.parent / f".{final.name}.{uuid.uuid4().hex[:12]}{suffix}"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside `path`, fsynced and renamed over it on success, removed on an
    exception. Its permissions are the umask's (0666 less it), as any tool's file has."""
    final, tmp = Path(path), None
    with naming(final):
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temporary(final)
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))  # not mkstemp's 0600
    mode = tmp.stat().st_mode & 0o777
    try:
        yield tmp
        os.chmod(tmp, mode)  # a writer that replaced the file (safetensors does) made it 0600
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def out_of_space(exc: BaseException) -> bool:
    """Whether a writer failed for a full disk or quota (safetensors says so in its own error)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return any(words in str(exc) for words in ("No space left", "os error 28", "quota exceeded"))


def recover(final: Path) -> None:
    """Remove the staging folders a killed save of `final` left (one writer at a time)."""
    pattern = f".{glob.escape(final.name)}.*.tmp"
    for leftover in [*final.parent.glob(pattern), *(final.glob(pattern) if final.is_dir() else [])]:
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def staged_directory(path: str | os.PathLike, names: tuple[str, ...],
                     replaces: tuple[str, ...] = ()) -> Iterator[Path]:
    """An empty folder to write the files `names` into; on success a new `path` appears whole, or
    each file is renamed into an existing one in the order of `names` (the one marking the set
    complete last) and the files `replaces` (another layout's) go. On an exception nothing under
    `path` changed."""
    final = Path(path)
    if final.exists() and not final.is_dir():
        raise NotADirectoryError(f"{final} is a file, not a directory; choose another path")
    if final.parent.is_dir():
        recover(final)
    new = not final.exists()
    stage = _temporary(final) if new else final / _temporary(final).name
    with naming(final):
        stage.parent.mkdir(parents=True, exist_ok=True)
        stage.mkdir()  # not mkdtemp: the umask's permissions, not 0700
    try:
        yield stage
        if new:
            os.rename(stage, final)
        else:
            for name in names:
                if (stage / name).exists():
                    os.replace(stage / name, final / name)
            for name in replaces:
                (final / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the renames made durable (POSIX)
            fd = os.open(stage.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
