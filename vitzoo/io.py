"""Atomic writes: a reader never sees a half-written file, or a half-replaced set of files, under
its final name; and the cache folder."""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import shutil
import tempfile
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


def free_bytes(path: str | os.PathLike) -> int:
    """The bytes free on the disk holding `path` (or its nearest existing parent)."""
    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    return shutil.disk_usage(where).free


def interrupted_swap(path: str | os.PathLike) -> Path | None:
    """Where an earlier copy of `path` waits when a save was killed between the two renames of its
    swap (`staged_directory`); None when there is none."""
    final = Path(path)
    if final.exists() or not final.parent.is_dir():
        return None
    olds = sorted(final.parent.glob(f".{glob.escape(final.name)}.*.old"))
    return next((old / final.name for old in olds if (old / final.name).is_dir()), None)


def recover(final: Path) -> None:
    """Undo what a killed save left: the earlier copy moved aside comes back, and staging or
    moved-aside folders go (one writer at a time is assumed)."""
    if (kept := interrupted_swap(final)) is not None:
        os.rename(kept, final)
    pattern = f".{glob.escape(final.name)}.*"
    for leftover in [*final.parent.glob(pattern + ".old"), *final.parent.glob(pattern + ".tmp"),
                     *(final.glob(pattern + ".tmp") if final.is_dir() else [])]:
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def staged_directory(path: str | os.PathLike, names: tuple[str, ...],
                     replaces: tuple[str, ...] = ()) -> Iterator[Path]:
    """An empty folder to write the files `names` into; on success they replace those of `path`
    together, on an exception nothing under `path` changed. `replaces`: files of an earlier set
    (another layout's) that go with it.

    A `path` that is new, or holds only such files, is swapped whole (the earlier one removed once
    the new one is in place). One that holds more (a training run) keeps the rest: each file is
    renamed in, in the order of `names` (the one marking the set complete last)."""
    final = Path(path)
    if final.exists() and not final.is_dir():
        raise NotADirectoryError(f"{final} is a file, not a directory; choose another path")
    if final.parent.is_dir():
        recover(final)
    whole = not final.is_symlink() and (not final.exists() or {
        p.name for p in final.iterdir()} <= {*names, *replaces})
    stage = _temporary(final) if whole else final / _temporary(final).name
    with naming(final):
        stage.parent.mkdir(parents=True, exist_ok=True)
        stage.mkdir()  # not mkdtemp: the umask's permissions, not 0700
    try:
        yield stage
        if not whole:
            for name in names:
                if (stage / name).exists():
                    os.replace(stage / name, final / name)
            for name in replaces:
                (final / name).unlink(missing_ok=True)
        elif not final.exists():
            os.rename(stage, final)  # a new folder appears whole
        else:
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=final.parent))
            os.rename(final, old / final.name)
            try:
                os.rename(stage, final)
            except BaseException:
                os.rename(old / final.name, final)
                raise
            shutil.rmtree(old, ignore_errors=True)
        with contextlib.suppress(OSError):  # the renames made durable (POSIX)
            fd = os.open(stage.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
