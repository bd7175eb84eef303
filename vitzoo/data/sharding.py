"""An ImageFolder written as WebDataset tar shards (`vitzoo shard FOLDER OUT`).

Each split (train/, and val/ or test/) becomes `OUT/<split>-000000.tar`, ...: its images in the
order training lists the folder, each sample the file's own bytes (never re-encoded) under its
extension in lower case (`.JPEG` -> `.jpg`) and its class index as text (`.cls`), keyed by its
number in the split and its file name. A shard holds up to `shard_mb` megabytes (10^6 bytes; one
sample at least) or `samples_per_shard` samples. `OUT/_info.json` is timm's WebDataset listing, with
the class names and a digest of what was sharded. Each shard is written atomically, its index beside
it; a run that stops midway leaves its plan, and the next run of the same folder and shard size
keeps the complete shards. One writer at a time: a second waits for the first (a lock on OUT).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re
import tarfile
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from vitzoo.data.folders import FolderImages, _folder_split, check_data
from vitzoo.data.shards import (INFO_FILES, TEST_SPLITS, ShardIndex, is_shards, load_index,
                                save_index)
from vitzoo.errors import DataError
from vitzoo.io import atomic_path, write_text
from vitzoo.options import check_number

MB = 1_000_000
DEFAULT_SHARD_MB = 1000  # ~1 GB: ImageNet-1k's training set in ~140 shards, ImageNet-21k's ~1,300
INFO = INFO_FILES[0]
PLAN = ".vitzoo-shard-plan.json"
_SHARD = rf"(?:train|{'|'.join(TEST_SPLITS)})-\d{{6}}\.tar(?:\.idx)?"
_MINE = rf"{_SHARD}|_info\.json|\.vitzoo-shard-plan\.json"
# what vitzoo writes in OUT (shards, their indexes, the info, the plan, and their temporary names)
_OURS = re.compile(rf"^(?:{_MINE}|\.(?:{_MINE})\.[0-9a-f]{{12}}\.tmp)$")


@dataclass(frozen=True)
class Listed:
    """One split's images in the folder's order: paths, classes, sizes and modification times."""

    paths: list[str]
    labels: np.ndarray
    sizes: np.ndarray
    mtimes_ns: np.ndarray

    def __len__(self) -> int:
        return len(self.paths)


@dataclass(frozen=True)
class Shard:
    name: str  # train-000000.tar
    split: str
    first: int  # its samples' numbers in the split: first, ..., stop - 1
    stop: int
    bytes: int  # the tar file's exact size


@dataclass(frozen=True)
class Plan:
    folder: Path
    classes: tuple[str, ...]
    samples: dict[str, Listed]  # split -> its images, in the folder's order
    shards: tuple[Shard, ...]
    digest: str

    def key(self, split: str, number: int) -> str:
        """Sample `number`'s key: the number zero-padded (it sorts as numbered), the file's name."""
        width = max(8, len(str(len(self.samples[split]) - 1)))
        stem = re.sub(r"[^A-Za-z0-9_-]", "_", Path(self.samples[split].paths[number]).stem)[:64]
        return f"{number:0{width}d}_{stem}"

    def image_bytes(self, shards) -> int:
        return sum(int(self.samples[s.split].sizes[s.first:s.stop].sum()) for s in shards)


def _blocks(size):
    """`size` bytes of data in a tar, in whole 512-byte blocks (an int or an array)."""
    return -(-size // 512) * 512


def _tar_bytes(members: int) -> int:
    """A tar file's size: its members, two zero blocks, padded to a record of 20 blocks."""
    return -(-(members + 1024) // 10240) * 10240


def extension(path: str) -> str:
    """The sample's image extension: the file's, in lower case, `.jpeg` as `.jpg`."""
    suffix = Path(path).suffix.lower()
    return ".jpg" if suffix == ".jpeg" else suffix


def _size_and_time(path: str) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns


def _listing(folder: Path, split: str, threads: int) -> tuple[str, list[str], Listed]:
    """The split's folder name, class names and images (sizes and times read `threads` at once)."""
    split_dir = _folder_split(folder, split)
    listed = FolderImages(split_dir)  # the listing training uses: the same order and labels
    stats = np.zeros((len(listed), 2), dtype=np.int64)
    with ThreadPoolExecutor(threads) as pool:
        for start in range(0, len(listed), 10_000):  # a chunk at a time, not millions of futures
            chunk = listed.paths[start:start + 10_000]
            stats[start:start + len(chunk)] = list(pool.map(_size_and_time, chunk))
    labels = listed.targets.numpy()
    return split_dir.name, listed.classes, Listed(listed.paths, labels, stats[:, 0], stats[:, 1])


def plan_shards(folder: str | os.PathLike, shard_mb: float = DEFAULT_SHARD_MB,
                samples_per_shard: int | None = None, threads: int = 8) -> Plan:
    """Which samples go into which shard, for the ImageFolder `folder`; checks it first."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder; give the ImageFolder tree to shard "
                        f"(FOLDER/train/<class>/<images> and FOLDER/val/<class>/<images>)")
    if is_shards(str(folder)):
        raise DataError(f"{folder} holds shards already (an info file listing them): train on it "
                        f"with --data {folder}")
    check_data(str(folder.resolve()))  # train/ and val/ (or test/), each class holding images
    (train, classes, train_samples), (test, test_classes, test_samples) = (
        _listing(folder, s, threads) for s in ("train", "test"))
    if test_classes != classes:
        differ = ", ".join(sorted(set(classes) ^ set(test_classes))[:5])
        raise DataError(f"{folder}/{test}/ and {folder}/train/ hold different classes ({differ}): "
                        "their labels would not agree; give both splits the same class folders (an "
                        "empty one holds no images: add images to it or remove it)")
    # what a resumed run must find: each image (path, size, time, class), where each shard starts
    digest = hashlib.sha256(json.dumps(classes).encode())
    samples = {train: train_samples, test: test_samples}
    shards: list[Shard] = []
    for split, listed in samples.items():
        prefix = len(str(folder / split)) + 1  # the paths' part below the split's folder
        for path, size, mtime_ns, label in zip(listed.paths, listed.sizes.tolist(),
                                               listed.mtimes_ns.tolist(), listed.labels.tolist()):
            digest.update(f"\n{split}/{path[prefix:]}\t{size}\t{mtime_ns}\t{label}".encode())
        # a sample: its image's header and data, its .cls member's header and block
        each = (512 + _blocks(listed.sizes) + 1024).tolist()
        if samples_per_shard:
            boundaries = list(range(0, len(listed), samples_per_shard))
        else:
            boundaries, content = [0], 0  # the first sample of each shard
            for i, grows in enumerate(each):
                if i > boundaries[-1] and _tar_bytes(content + grows) > shard_mb * MB:
                    boundaries.append(i)
                    content = 0
                content += grows
        boundaries.append(len(listed))
        for n, (first, stop) in enumerate(zip(boundaries, boundaries[1:])):
            size = _tar_bytes(sum(each[first:stop]))
            shards.append(Shard(f"{split}-{n:06d}.tar", split, first, stop, size))
        digest.update(f"\nshards {boundaries}".encode())
    return Plan(folder, tuple(classes), samples, tuple(shards), digest.hexdigest())


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _read_ahead(paths: list[str], threads: int) -> Iterator[bytes]:
    """The files' bytes in order, `threads` read at once, a few dozen ahead (a cluster file system
    serves many requests at once far faster than one after the other)."""
    pool = ThreadPoolExecutor(threads)
    pending: deque = deque()
    upcoming = iter(paths)
    try:
        for path in upcoming:
            pending.append(pool.submit(_read_file, path))
            if len(pending) >= 4 * threads:
                break
        while pending:
            yield pending.popleft().result()
            following = next(upcoming, None)
            if following is not None:
                pending.append(pool.submit(_read_file, following))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _write_shard(out: Path, plan: Plan, shard: Shard, contents: Iterator[bytes], progress) -> None:
    """Write one shard under a temporary name, rename it into place, then its index beside it."""
    listed = plan.samples[shard.split]
    offsets, sizes = [], []
    with atomic_path(out / shard.name) as tmp, open(tmp, "wb") as f:
        with tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for number in range(shard.first, shard.stop):
                path, size = listed.paths[number], int(listed.sizes[number])
                try:
                    data = next(contents)
                except OSError as exc:
                    raise DataError(f"{path} cannot be read ({exc.strerror or exc}); it was there "
                                    "when the folder was listed: run `vitzoo shard` again once it "
                                    "is readable") from None
                if len(data) != size:
                    raise DataError(f"{path} changed while it was sharded ({len(data)} bytes, "
                                    f"{size} when listed): run `vitzoo shard` again once the "
                                    "folder is not being written")
                key, label = plan.key(shard.split, number), str(int(listed.labels[number]))
                members = ((key + extension(path), data), (key + ".cls", label.encode()))
                for name, payload in members:
                    member = tarfile.TarInfo(name)
                    member.size, member.mode = len(payload), 0o644
                    member.mtime = int(listed.mtimes_ns[number]) // 10**9
                    tar.addfile(member, io.BytesIO(payload))
                    if payload is data:  # where its data starts: the end less the data's blocks
                        offsets.append(tar.offset - _blocks(len(data)))
                sizes.append(len(data))
                progress.update(len(data))
        f.flush()
        if f.tell() != shard.bytes:  # the plan's sizes decide resuming: they must be the files'
            raise RuntimeError(f"{shard.name}: wrote {f.tell()} bytes, planned {shard.bytes}")
    labels = listed.labels[shard.first:shard.stop]
    arrays = (np.asarray(v, dtype=np.int64) for v in (offsets, sizes, labels))
    save_index(out / shard.name, ShardIndex(*arrays))


def _info(plan: Plan) -> dict:
    splits = {}
    for split in plan.samples:
        shards = [s for s in plan.shards if s.split == split]
        splits[split] = {"name": split, "num_samples": len(plan.samples[split]),
                         "filenames": [s.name for s in shards],
                         "shard_lengths": [s.stop - s.first for s in shards]}
    source = plan.folder.resolve()
    return {"name": source.name, "classes": list(plan.classes), "splits": splits,
            "vitzoo": {"digest": plan.digest, "source": str(source)}}


def _digest_in(path: Path) -> str | None:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("vitzoo", {}).get("digest")
    except (OSError, ValueError, AttributeError):
        return None


@contextlib.contextmanager
def _one_writer(out: Path) -> Iterator[None]:
    """Hold OUT's lock: a second writer waits, then finds the shards written (no lock where the
    file system has none: one writer at a time is then the user's to keep)."""
    fd = os.open(out, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _prepare(out: Path, plan: Plan, overwrite: bool) -> list[Shard]:
    """The shards still to write into OUT; refuses an OUT holding other files or other shards
    unless `overwrite` (then vitzoo's earlier files there are removed, the others kept)."""
    present = {p.name for p in out.iterdir()}
    others = sorted(n for n in present if not _OURS.match(n))
    if others and not overwrite:
        raise DataError(f"{out} holds files that are not vitzoo's shards ({', '.join(others[:3])}"
                        f"{' ...' if len(others) > 3 else ''}): choose a new or empty folder, or "
                        "pass --overwrite to write the shards beside them")
    ours = present - set(others)
    same = plan.digest in (_digest_in(out / INFO), _digest_in(out / PLAN))
    if ours and not same and not overwrite:
        raise DataError(f"{out} holds shards of another folder or shard size (or of images changed "
                        "since): pass --overwrite to replace them, or choose another folder")
    for name in ours:  # what an earlier run left: its temporary files, or (overwritten) all of it
        if not same or name.endswith(".tmp"):
            (out / name).unlink(missing_ok=True)
    if same and (out / INFO).is_file() and all((out / s.name).is_file() for s in plan.shards):
        return []
    todo = []
    for shard in plan.shards:
        path = out / shard.name
        if path.is_file() and path.stat().st_size == shard.bytes:
            load_index(path)  # its index: kept, or read again where a run stopped before writing it
        else:
            todo.append(shard)
    return todo


def write_shards(folder: str | os.PathLike, out: str | os.PathLike,
                 shard_mb: float = DEFAULT_SHARD_MB, samples_per_shard: int | None = None,
                 overwrite: bool = False, threads: int = 8, progress: bool = True) -> dict:
    """Write the ImageFolder `folder` as shards in `out`, or finish an interrupted run; returns the
    info written (`out/_info.json`). A DataError names what is wrong with the input or OUT."""
    check_number("shard_mb", shard_mb, float, "> 0")
    check_number("threads", threads, int, "> 0")
    if samples_per_shard is not None:
        check_number("samples_per_shard", samples_per_shard, int, "> 0")
    plan = plan_shards(folder, shard_mb, samples_per_shard, threads)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out} is a file; the shards are written into a folder: choose another "
                        "path")
    where, splits = out.resolve(), [(plan.folder / split).resolve() for split in plan.samples]
    if where == plan.folder.resolve() or any(where == d or d in where.parents for d in splits):
        raise DataError(f"{out} is inside the folder being sharded; write the shards elsewhere "
                        "(beside it)")
    out.mkdir(parents=True, exist_ok=True)
    from tqdm import tqdm

    with _one_writer(out):
        todo = _prepare(out, plan, overwrite)
        if not todo and (out / INFO).is_file():
            return json.loads((out / INFO).read_text(encoding="utf-8"))
        write_text(out / PLAN, json.dumps(_info(plan), indent=1))
        total, remaining = plan.image_bytes(plan.shards), plan.image_bytes(todo)
        paths = [path for s in todo for path in plan.samples[s.split].paths[s.first:s.stop]]
        contents = _read_ahead(paths, threads)
        with tqdm(total=total, initial=total - remaining, unit="B", unit_scale=True,
                  desc=f"shard {plan.folder.name}", disable=not progress) as bar:
            try:
                for shard in todo:
                    _write_shard(out, plan, shard, contents, bar)
            finally:
                contents.close()
        info = _info(plan)
        write_text(out / INFO, json.dumps(info, indent=1))
        (out / PLAN).unlink(missing_ok=True)
    return info
