"""Atomic writes: a reader never sees a half-written file, or a half-replaced set of files, under
its final name."""

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
    """Where vitzoo keeps what it makes once per machine (unpacked datasets, measured choices):
    $VITZOO_CACHE, default ~/.cache/vitzoo."""
    return env_path("VITZOO_CACHE", Path.home() / ".cache" / "vitzoo")


@contextlib.contextmanager
def naming(final: Path) -> Iterator[None]:
    """An OSError raised while making the temporary file or folder beside `final` names `final`, the
    path the user gave, not the temporary name they never chose (`convert ... /proc/vz` had named
    /proc/.vz.e90bd7c0b0e6.tmp)."""
    try:
        yield
    except OSError as exc:
        if exc.errno is None:
            raise
        raise type(exc)(exc.errno, f"{exc.strerror} (writing {final})", str(final)) from None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it is fsynced and renamed over `path`.

    On an exception the temporary file is removed and `path` is left as it was. The file gets the
    permissions the user's umask gives (0666 less the umask), as any tool's does.
    """
    final = Path(path)
    while True:  # not tempfile.mkstemp: its files are 0600 whatever the umask
        tmp_path = final.parent / f".{final.name}.{uuid.uuid4().hex[:12]}.tmp"
        try:
            with naming(final):
                final.parent.mkdir(parents=True, exist_ok=True)
                flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
                os.close(os.open(tmp_path, flags, 0o666))  # 0666 less the umask
            break
        except FileExistsError:
            if not tmp_path.exists():  # not a clash of names: the folder is a file
                raise
            continue
    mode = tmp_path.stat().st_mode & 0o777
    try:
        yield tmp_path
        # a writer that replaced the file (safetensors does) made it 0600
        if tmp_path.stat().st_mode & 0o777 != mode:
            os.chmod(tmp_path, mode)
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, final)
    finally:
        tmp_path.unlink(missing_ok=True)


def out_of_space(exc: BaseException) -> bool:
    """Whether a writer's failure is a full disk or quota: an OSError's errno, or the words of a
    writer that raises its own type (safetensors' SafetensorError: "No space left on device (os
    error 28)")."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return any(words in text for words in ("No space left on device", "os error 28",
                                           "Disk quota exceeded"))


def free_bytes(path: str | os.PathLike) -> int:
    """The bytes free on the disk holding `path` (or its nearest existing parent)."""
    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    return shutil.disk_usage(where).free


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


def _holds_only(final: Path, names: tuple[str, ...]) -> bool:
    """Whether `final` does not exist, or is a plain directory holding only some of `names`."""
    if final.is_symlink():
        return False  # a link is written through, never replaced
    if not final.exists():
        return True
    return final.is_dir() and {p.name for p in final.iterdir()} <= set(names)


def _swap_in(stage: Path, final: Path) -> None:
    """`stage` becomes `final`; an earlier `final` is removed only once the new one is in place."""
    if not final.exists():
        os.rename(stage, final)  # a new directory appears whole
        return
    old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=final.parent))
    os.rename(final, old / final.name)
    try:
        os.rename(stage, final)
    except BaseException:
        os.rename(old / final.name, final)
        raise
    shutil.rmtree(old, ignore_errors=True)


def interrupted_swap(path: str | os.PathLike) -> Path | None:
    """Where an earlier copy of `path` waits when a save was killed between the two renames of its
    swap (`_swap_in`): moved aside, the new copy not yet in place. None when there is none."""
    final = Path(path)
    if final.exists() or not final.parent.is_dir():
        return None
    olds = sorted(final.parent.glob(f".{glob.escape(final.name)}.*.old"))
    kept = [old / final.name for old in olds]
    return next((k for k in kept if k.is_dir()), None)


def recover(final: Path) -> None:
    """Undo what a save killed part-way left (one writer at a time is assumed): the earlier copy
    moved aside between the swap's two renames comes back, and leftover staging or moved-aside
    directories are removed."""
    kept = interrupted_swap(final)
    if kept is not None:
        os.rename(kept, final)
    pattern = f".{glob.escape(final.name)}.*"
    for leftover in [*final.parent.glob(pattern + ".old"), *final.parent.glob(pattern + ".tmp"),
                     *(final.glob(pattern + ".tmp") if final.is_dir() else [])]:
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def staged_directory(path: str | os.PathLike, names: tuple[str, ...],
                     replaces: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yield an empty directory to write the files `names` into; on success they replace those of
    `path` together, on an exception nothing under `path` has changed. `replaces` names files an
    earlier set may hold that this one does not write (another layout's): they go with it.

    A `path` that does not exist appears whole; one holding only an earlier set of these files is
    swapped for the new set. One that holds more (a training run) keeps the rest: the staging
    directory is inside it, and each file, complete before the first rename, is renamed in in the
    order of `names` (so the one that marks the set complete comes last), then those of `replaces`
    are removed. What an earlier save killed part-way left is recovered first (`recover`)."""
    final = Path(path)
    if final.exists() and not final.is_dir():
        raise NotADirectoryError(f"{final} is a file, not a directory: a directory is written "
                                 "here; choose another path")
    if final.parent.is_dir():
        recover(final)
    whole = _holds_only(final, (*names, *replaces))
    home = final.parent if whole else final
    stage = home / f".{final.name}.{uuid.uuid4().hex[:12]}.tmp"
    with naming(final):
        home.mkdir(parents=True, exist_ok=True)
        stage.mkdir()  # not mkdtemp: the directory gets the umask's permissions, not 0700
    try:
        yield stage
        if whole:
            _swap_in(stage, final)
        else:
            for name in names:
                if (stage / name).exists():
                    os.replace(stage / name, final / name)
            for name in replaces:
                (final / name).unlink(missing_ok=True)
        _fsync_directory(home)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
