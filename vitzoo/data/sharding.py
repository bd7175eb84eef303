"""An ImageFolder written as WebDataset tar shards (`vitzoo shard FOLDER OUT`; reading them: vitzoo.data.shards).

Each split (train/, and val/ or test/) becomes `OUT/<split>-000000.tar`, ...: its images in the order
training lists the folder (torchvision's ImageFolder: classes sorted, files sorted), each sample the
original file's bytes, never re-encoded, under its extension in lower case (`.JPEG` -> `.jpg`, the name
WebDataset and timm read), and its class index as text (`.cls`). A sample's key is its number in the
split, zero-padded, and its file name (`00000017_n01440764_10026`): unique and sorted. A shard holds
samples up to `shard_mb` megabytes (10^6 bytes; one sample at least) or `samples_per_shard` samples.

`OUT/_info.json` is the listing timm's WebDataset reader reads (`splits.<split>`: `name`, `num_samples`,
`filenames`, `shard_lengths`), with the class names in label order (`classes`) and, under `vitzoo`, a
digest of what was sharded (each image's path, size, modification time and class, and the shard size).
Each shard is written under a temporary name and renamed into place, its index (vitzoo.data.shard_index)
written beside it. A run that stops midway leaves its plan (`.vitzoo-shard-plan.json`); the next run of
the same folder and shard size keeps the shards already complete and writes the rest. One writer at a
time: a second waits for the first (a lock on OUT, where the file system has locks).
"""

from __future__ import annotations

import contextlib
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

from vitzoo.data.shard_index import ShardIndex, load_index, save_index
from vitzoo.data.shards import INFO_FILES, TEST_SPLITS, is_shards
from vitzoo.data.sources import FolderImages, _folder_split, check_data
from vitzoo.errors import DataError
from vitzoo.io import atomic_path, write_text
from vitzoo.options import check_number

MB = 1_000_000
DEFAULT_SHARD_MB = 1000  # ~1 GB: ImageNet-1k's 1.28M training images in ~140 shards, ImageNet-21k's 14M in ~1,300
INFO = INFO_FILES[0]
PLAN = ".vitzoo-shard-plan.json"
FORMAT_VERSION = 1  # of what is written; shards of another version are not taken for this run's
_SHARD = rf"(?:train|{'|'.join(TEST_SPLITS)})-\d{{6}}\.tar(?:\.idx)?"
# what vitzoo writes in OUT (shards, their indexes, the info, the plan, and their temporary names)
_OURS = re.compile(rf"^(?:{_SHARD}|_info\.json|\.vitzoo-shard-plan\.json|\.(?:{_SHARD}|_info\.json|"
                   rf"\.vitzoo-shard-plan\.json)\.[0-9a-f]{{12}}\.tmp)$")


@dataclass(frozen=True)
class Listed:
    """One split's images in the folder's order: paths, classes, sizes and modification times (arrays:
    ImageNet-21k's 14 million images fit a node's memory)."""

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
        """Sample `number`'s key: the number zero-padded (to sort as it is numbered), then the file's name."""
        width = max(8, len(str(len(self.samples[split]) - 1)))
        stem = re.sub(r"[^A-Za-z0-9_-]", "_", Path(self.samples[split].paths[number]).stem)[:64]
        return f"{number:0{width}d}_{stem}"

    def image_bytes(self, shards: list[Shard] | tuple[Shard, ...]) -> int:
        return sum(int(self.samples[s.split].sizes[s.first:s.stop].sum()) for s in shards)


def _blocks(size):
    """`size` bytes of data in a tar, in whole 512-byte blocks (an int or an array)."""
    return -(-size // 512) * 512


def _sample_bytes(sizes: np.ndarray) -> np.ndarray:
    """Bytes of samples of images of `sizes` in a tar: the image's header and data, and its .cls member
    (a header and a block: a class index's text)."""
    return 512 + _blocks(sizes) + 1024


def _tar_bytes(members: int) -> int:
    """A tar file's size: its members, two zero blocks, padded to a record of 20 blocks (as tarfile writes)."""
    return -(-(members + 1024) // 10240) * 10240


def extension(path: str) -> str:
    """The sample's image extension: the file's, in lower case, `.jpeg` as `.jpg`."""
    suffix = Path(path).suffix.lower()
    return ".jpg" if suffix == ".jpeg" else suffix


# ---------------------------------------------------------------------------- the plan
def _size_and_time(path: str) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns


def _listing(folder: Path, split: str, threads: int) -> tuple[str, list[str], Listed]:
    """The split's folder name, class names and images (sizes and times read now, `threads` at once)."""
    split_dir = _folder_split(folder, split)
    listed = FolderImages(split_dir)  # the listing training uses: the same order, classes and labels
    stats = np.zeros((len(listed), 2), dtype=np.int64)
    with ThreadPoolExecutor(threads) as pool:
        for start in range(0, len(listed), 10_000):  # a chunk at a time: not 14 million futures at once
            chunk = listed.paths[start:start + 10_000]
            stats[start:start + len(chunk)] = list(pool.map(_size_and_time, chunk))
    return split_dir.name, listed.classes, Listed(listed.paths, listed.targets.numpy(), stats[:, 0], stats[:, 1])


def plan_shards(folder: str | os.PathLike, shard_mb: float = DEFAULT_SHARD_MB, samples_per_shard: int | None = None,
                threads: int = 8) -> Plan:
    """Which samples go into which shard, for the ImageFolder `folder`; checks it first (DataError)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder; give the ImageFolder tree to shard "
                        f"(FOLDER/train/<class>/<images> and FOLDER/val/<class>/<images>)")
    if is_shards(str(folder)):
        raise DataError(f"{folder} holds shards already (an info file listing them): train on it with --data {folder}")
    check_data(str(folder.resolve()))  # train/ and val/ (or test/), each class holding images
    (train, classes, train_samples), (test, test_classes, test_samples) = (_listing(folder, s, threads) for s in ("train", "test"))
    if test_classes != classes:
        differ = sorted(set(classes) ^ set(test_classes))
        raise DataError(f"{folder}/{test}/ and {folder}/train/ hold different classes ({', '.join(differ[:5])}): their "
                        f"labels would not agree; give both splits the same class folders (an empty one holds no images: "
                        f"add images to it or remove it)")
    # what is written, and so what a resumed run must find: every image (path, size, time, class) and
    # where each shard starts (not the options that chose it: --shard-size-mb 1000 and 1000.0 agree)
    digest = hashlib.sha256(json.dumps([FORMAT_VERSION, classes]).encode())
    samples = {train: train_samples, test: test_samples}
    shards: list[Shard] = []
    for split, listed in samples.items():
        prefix = len(str(folder / split)) + 1  # the paths' part below the split's folder
        for path, size, mtime_ns, label in zip(listed.paths, listed.sizes.tolist(), listed.mtimes_ns.tolist(),
                                               listed.labels.tolist()):
            digest.update(f"\n{split}/{path[prefix:]}\t{size}\t{mtime_ns}\t{label}".encode())
        each = _sample_bytes(listed.sizes).tolist()
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
            shards.append(Shard(f"{split}-{n:06d}.tar", split, first, stop, _tar_bytes(sum(each[first:stop]))))
        digest.update(f"\nshards {boundaries}".encode())
    return Plan(folder, tuple(classes), samples, tuple(shards), digest.hexdigest())


# ---------------------------------------------------------------------------- writing
def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _read_ahead(paths: list[str], threads: int) -> Iterator[bytes]:
    """The files' bytes in order, `threads` files read at once, a few dozen ahead (a cluster file system
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
    with atomic_path(out / shard.name) as tmp:
        with open(tmp, "wb") as f:
            with tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar:
                for number in range(shard.first, shard.stop):
                    path, size, label = listed.paths[number], int(listed.sizes[number]), int(listed.labels[number])
                    try:
                        data = next(contents)
                    except OSError as exc:
                        raise DataError(f"{path} cannot be read ({exc.strerror or exc}); it was there when the "
                                        "folder was listed: run `vitzoo shard` again once it is readable") from None
                    if len(data) != size:
                        raise DataError(f"{path} changed while it was sharded ({len(data)} bytes, {size} when "
                                        "listed): run `vitzoo shard` again once the folder is not being written")
                    key = plan.key(shard.split, number)
                    for name, payload in ((key + extension(path), data), (key + ".cls", str(label).encode())):
                        member = tarfile.TarInfo(name)
                        member.size, member.mode = len(payload), 0o644
                        member.mtime = int(listed.mtimes_ns[number]) // 10**9
                        tar.addfile(member, io.BytesIO(payload))
                        if payload is data:  # where its data starts: the archive's end less the data's blocks
                            offsets.append(tar.offset - _blocks(len(data)))
                    sizes.append(len(data))
                    progress.update(len(data))
            if f.tell() != shard.bytes:  # the plan's sizes decide resuming: they must be the files'
                raise RuntimeError(f"{shard.name}: wrote {f.tell()} bytes, planned {shard.bytes}")
    labels = listed.labels[shard.first:shard.stop]
    save_index(out / shard.name, ShardIndex(*(np.asarray(v, dtype=np.int64) for v in (offsets, sizes, labels))))


def _info(plan: Plan) -> dict:
    splits = {}
    for split in plan.samples:
        shards = [s for s in plan.shards if s.split == split]
        splits[split] = {"name": split, "num_samples": len(plan.samples[split]), "filenames": [s.name for s in shards],
                         "shard_lengths": [s.stop - s.first for s in shards]}
    return {"name": plan.folder.resolve().name, "classes": list(plan.classes), "splits": splits,
            "vitzoo": {"format": FORMAT_VERSION, "digest": plan.digest, "source": str(plan.folder.resolve())}}


def _digest_in(path: Path) -> str | None:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("vitzoo", {}).get("digest")
    except (OSError, ValueError, AttributeError):
        return None


@contextlib.contextmanager
def _one_writer(out: Path) -> Iterator[None]:
    """Hold OUT's lock: a second writer waits, then finds the shards written (no lock where the file
    system has none: one writer at a time is then the user's to keep)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(out, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _prepare(out: Path, plan: Plan, overwrite: bool) -> list[Shard]:
    """The shards still to write into OUT; refuses an OUT holding other files or other shards unless
    `overwrite` (then vitzoo's earlier files there are removed, the others kept)."""
    present = {p.name for p in out.iterdir()}
    others = sorted(n for n in present if not _OURS.match(n))
    if others and not overwrite:
        raise DataError(f"{out} holds files that are not vitzoo's shards ({', '.join(others[:3])}"
                        f"{' ...' if len(others) > 3 else ''}): choose a new or empty folder, or pass --overwrite to "
                        "write the shards beside them")
    ours = present - set(others)
    same = plan.digest in (_digest_in(out / INFO), _digest_in(out / PLAN))
    if ours and not same:
        if not overwrite:
            raise DataError(f"{out} holds shards of another folder or shard size (or of images changed since): pass "
                            "--overwrite to replace them, or choose another folder")
    for name in ours:  # what an earlier run left: its temporary files, or (overwritten) all of it
        if not same or name.endswith(".tmp"):
            (out / name).unlink(missing_ok=True)
    if same and (out / INFO).is_file() and all((out / s.name).is_file() for s in plan.shards):
        return []
    todo = []
    for shard in plan.shards:
        path = out / shard.name
        if path.is_file() and path.stat().st_size == shard.bytes:
            load_index(path)  # its index: kept, or read again where the run stopped before writing it
        else:
            todo.append(shard)
    return todo


def write_shards(folder: str | os.PathLike, out: str | os.PathLike, shard_mb: float = DEFAULT_SHARD_MB,
                 samples_per_shard: int | None = None, overwrite: bool = False, threads: int = 8,
                 progress: bool = True) -> dict:
    """Write the ImageFolder `folder` as shards in `out` (module docstring), or finish an interrupted run;
    returns the info written (`out/_info.json`). A DataError names what is wrong with the input or OUT."""
    check_number("shard_mb", shard_mb, float, "> 0")
    check_number("threads", threads, int, "> 0")
    if samples_per_shard is not None:
        check_number("samples_per_shard", samples_per_shard, int, "> 0")
    plan = plan_shards(folder, shard_mb, samples_per_shard, threads)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out} is a file; the shards are written into a folder: choose another path")
    where, splits = out.resolve(), [(plan.folder / split).resolve() for split in plan.samples]
    if where == plan.folder.resolve() or any(where == d or d in where.parents for d in splits):
        raise DataError(f"{out} is inside the folder being sharded; write the shards elsewhere (beside it)")
    out.mkdir(parents=True, exist_ok=True)
    from tqdm import tqdm

    with _one_writer(out):
        todo = _prepare(out, plan, overwrite)
        if not todo and (out / INFO).is_file():
            return json.loads((out / INFO).read_text(encoding="utf-8"))
        write_text(out / PLAN, json.dumps(_info(plan), indent=1))
        total, remaining = plan.image_bytes(plan.shards), plan.image_bytes(todo)
        paths = [path for shard in todo for path in plan.samples[shard.split].paths[shard.first:shard.stop]]
        contents = _read_ahead(paths, threads)
        with tqdm(total=total, initial=total - remaining, unit="B", unit_scale=True, desc=f"shard {plan.folder.name}",
                  disable=not progress) as bar:
            try:
                for shard in todo:
                    _write_shard(out, plan, shard, contents, bar)
            finally:
                contents.close()
        info = _info(plan)
        write_text(out / INFO, json.dumps(info, indent=1))
        (out / PLAN).unlink(missing_ok=True)
    return info


__all__ = ["DEFAULT_SHARD_MB", "MB", "Listed", "Plan", "Shard", "extension", "plan_shards", "write_shards"]
