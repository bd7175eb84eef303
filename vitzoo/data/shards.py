"""A dataset stored as WebDataset tar shards, read at random: few large files, not many small.

`--data` names shards as a folder with an info file (`_info.json` or `info.json`, timm's format)
or as a brace pattern (`DIR/train-{000000..000127}.tar`), whose validation split is the one the
info file beside them lists, else the files of the pattern with `train` -> `val` (or `validation`,
`test`). A sample is WebDataset's: consecutive members sharing a key, an image member and a `.cls`
member holding its class. Where each image lies is read from the tar headers once (`SHARD.idx`
beside the shard, else in $VITZOO_CACHE/shard-index/); `ShardImages` reads it with one `pread`.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import hashlib
import json
import os
import re
import resource
import tarfile
import threading
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset

from vitzoo.data.transforms import decode_rgb
from vitzoo.errors import DataError
from vitzoo.io import atomic_path, cache_dir

INFO_FILES = ("_info.json", "info.json")  # the names timm's WebDataset reader looks for, in order
TEST_SPLITS = ("val", "validation", "test")  # what a validation split may be called, in order
IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "ppm", "pgm", "pbm", "bmp", "tif", "tiff", "gif")
MAX_SHARDS = 100_000  # a brace pattern naming more is a typo, not a dataset
_KEY_AND_SUFFIX = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # WebDataset's grouping rule
_BRACES = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")


class ShardIndex(NamedTuple):
    """The samples of one shard, in tar order: their image's offset and size, and their class."""

    offsets: np.ndarray
    sizes: np.ndarray
    labels: np.ndarray


def index_files(shard: Path) -> tuple[Path, Path]:
    """Where a shard's index is kept: beside it, else (a folder this user cannot write) cached."""
    digest = hashlib.sha256(str(shard.resolve()).encode()).hexdigest()[:16]
    return (shard.with_name(shard.name + ".idx"),
            cache_dir() / "shard-index" / f"{digest}-{shard.name}.idx")


def load_index(shard: Path) -> ShardIndex:
    """The index of `shard`: the saved one while the shard's size and time are unchanged, else read
    from its headers and saved."""
    stat = Path(shard).stat()
    shard, stamp = Path(shard), (stat.st_size, stat.st_mtime_ns)
    for place in index_files(shard):
        try:
            with np.load(place, allow_pickle=False) as saved:
                if (int(saved["shard_bytes"]), int(saved["shard_mtime_ns"])) == stamp:
                    return ShardIndex(*(saved[k].astype(np.int64) for k in ShardIndex._fields))
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):  # none, or a partial copy
            pass
    index = read_headers(shard)
    for place in index_files(shard):
        try:
            with atomic_path(place) as tmp, open(tmp, "wb") as f:
                np.savez(f, shard_bytes=stamp[0], shard_mtime_ns=stamp[1], **index._asdict())
            return index
        except OSError:  # a read-only folder (shared data): the cache instead
            continue
    raise DataError(f"cannot save the index of {shard} beside it nor in vitzoo's cache: set "
                    "VITZOO_CACHE to a writable folder")


def read_headers(shard: Path) -> ShardIndex:
    """Index `shard` from its tar headers (the images' data skipped, the `.cls` texts read)."""
    keys: list[str] = []
    samples: list[dict[str, tuple[int, int]]] = []
    rows = []
    try:
        # unbuffered: a header is one 512-byte read, not a buffer's 8 KB of image data around it
        with open(shard, "rb", buffering=0) as f, tarfile.open(fileobj=f, mode="r:") as tar:
            for member in tar:
                match = _KEY_AND_SUFFIX.match(member.name)
                if member.isreg() and match:
                    if not keys or keys[-1] != match[1]:
                        keys.append(match[1])
                        samples.append({})
                    samples[-1][match[2].lower()] = (member.offset_data, member.size)
            f.seek(tar.offset)  # where the next header would be: an end-of-archive block
            if f.read(512) != bytes(512):
                raise DataError(f"shard {shard} is truncated: copy or write it again")
            for key, sample in zip(keys, samples):
                image = next((sample[s] for s in IMAGE_SUFFIXES if s in sample), None)
                if image is None or "cls" not in sample:
                    raise DataError(f"sample {key!r} of shard {shard} has no "
                                    f"{'image' if image is None else '.cls'} member")
                f.seek(sample["cls"][0])
                try:  # a class index, not a number that overflows a label
                    label = int(f.read(sample["cls"][1])) if sample["cls"][1] <= 40 else -1
                except ValueError:
                    label = -1
                if not 0 <= label < 2**31:
                    raise DataError(f"sample {key!r} of shard {shard}: its .cls member is not a "
                                    "class index")
                rows.append((*image, label))
    except tarfile.ReadError as exc:
        raise DataError(f"{shard} is not an uncompressed tar file ({exc}); a compressed shard "
                        "cannot be read at random: decompress it") from None
    if not rows:
        raise DataError(f"shard {shard} holds no samples")
    return ShardIndex(*np.asarray(rows, dtype=np.int64).T)


# ---------------------------------------------------------------------------- names and info files
def expand_braces(pattern: str) -> list[str]:
    """`a-{000..002}.tar` -> a-000.tar, a-001.tar, a-002.tar (the first number's zero padding
    kept); `{x,y}` -> x, y; several braces multiply; at most MAX_SHARDS names."""
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    body, numbers = match[1], _RANGE.fullmatch(match[1])
    if numbers:
        first, last = int(numbers[1]), int(numbers[2])
        if not first <= last < first + MAX_SHARDS:
            raise DataError(f"{pattern}: the range {{{body}}} runs backwards or is too long")
        width = len(numbers[1]) if numbers[1].startswith("0") else 0
        items = [str(n).zfill(width) for n in range(first, last + 1)]
    elif "," in body:
        items = body.split(",")
    else:
        raise DataError(f"{pattern}: {{{body}}} is neither a range {{000..127}} nor a list {{a,b}}")
    names: list[str] = []
    for item in items:
        names += expand_braces(pattern[:match.start()] + item + pattern[match.end():])
        if len(names) > MAX_SHARDS:
            raise DataError(f"{pattern} names over {MAX_SHARDS:,} shards")
    return names


def read_info(folder: Path) -> tuple[dict[str, tuple[Path, ...]], tuple | None] | None:
    """({split: its shard files}, class names or None) from a folder's info file, checked: every
    file lies inside the folder. None without one, or for another tool's info.json (no splits)."""
    path = next((folder / name for name in INFO_FILES if (folder / name).is_file()), None)
    try:
        info = json.loads(path.read_text(encoding="utf-8")) if path else None
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} is not a readable JSON info file ({exc}); write the shards "
                        "again with `vitzoo shard`") from None
    if not isinstance(info, dict) or not isinstance(info.get("splits"), dict):
        return None
    inside, splits = folder.resolve(), {}
    for split, entry in info["splits"].items():
        names = entry.get("filenames") if isinstance(entry, dict) else None
        if not names or not all(isinstance(n, str) for n in names):
            raise DataError(f"{path}: split {split!r} lists no shard files")
        splits[split] = tuple(folder / n for n in names)
        if not all(inside in p.resolve().parents for p in splits[split]):
            raise DataError(f"{path}: split {split!r} names a file outside {folder}")
    classes = info.get("classes")
    return splits, tuple(map(str, classes)) if isinstance(classes, list) else None


def is_shards(name: str) -> bool:
    """Whether `--data name` names shards: a folder with an info file listing splits, or `.tar`s."""
    return read_info(Path(name)) is not None if os.path.isdir(name) else name.endswith(".tar")


class ShardSplits(NamedTuple):
    train: tuple[Path, ...]
    test: tuple[Path, ...]
    classes: tuple[str, ...] | None


def _all_there(name: str, files) -> None:
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise DataError(f"{len(missing)} shard file(s) of {name} are not there: "
                        f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")


def locate(name: str) -> ShardSplits:
    """The shards `--data name` names (a folder with an info file, or a pattern), all there."""
    if os.path.isdir(name):
        splits, classes = read_info(Path(name)) or ({}, None)
        test = next((splits[s] for s in TEST_SPLITS if s in splits), None)
        if "train" not in splits or test is None:
            raise DataError(f"{name}: its info file lists no train or no validation split "
                            f"({' or '.join(TEST_SPLITS)}); write it with `vitzoo shard`")
        found = ShardSplits(splits["train"], test, classes)
    else:
        train = tuple(Path(p) for p in expand_braces(name))
        _all_there(name, train)
        splits, classes = read_info(train[0].parent) or ({}, None)
        test = next((splits[s] for s in TEST_SPLITS if s in splits), ())
        base = os.path.basename(_BRACES.sub("*", name))
        for other in TEST_SPLITS if not test and "train" in base else ():
            test = tuple(sorted(train[0].parent.glob(base.replace("train", other))))
            if test:
                break
        if not test:
            raise DataError(f"no validation shards for {name}: no info file beside them lists "
                            "them, and no val-*.tar; write both with `vitzoo shard`")
        found = ShardSplits(train, test, classes)
    _all_there(name, (*found.train, *found.test))
    return found


# ---------------------------------------------------------------------------- the dataset
@functools.cache  # once per process
def open_files_allowed() -> int:
    """Half this process's limit of open files, raised first to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return max(8, min(soft, 1 << 20) // 2)


class ShardImages(Dataset):
    """The samples of `shards` in order, of the classes named `classes`: `targets`, `dataset[i]` =
    (uint8 (3, H, W), label), `encoded(i)` = (the image's bytes, label), read with one `pread` of
    a descriptor this process keeps (at most `open_files_allowed()` of them)."""

    def __init__(self, shards, classes) -> None:
        indexes = [load_index(Path(p)) for p in shards]
        self.shards, self.classes = [str(p) for p in shards], list(classes)
        self.starts = np.cumsum([0] + [len(index.offsets) for index in indexes]).tolist()
        self.offsets, self.sizes, labels = (np.concatenate(arrays) for arrays in zip(*indexes))
        if len(labels) and labels.max() >= len(self.classes):
            raise DataError(f"the shards {self.shards[0]} ... hold class {labels.max()}, outside "
                            f"the {len(self.classes)} classes their info file names")
        self.targets = torch.from_numpy(labels)
        self._files: dict[int, int] = {}  # shard -> descriptor (a forked worker's are its own)
        self._lock = threading.Lock()  # no descriptor is closed under another thread's read

    def __len__(self) -> int:
        return self.starts[-1]

    def _close(self) -> None:
        while self._files:
            with contextlib.suppress(OSError):
                os.close(self._files.popitem()[1])

    def encoded(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} of {len(self)}")
        shard = bisect.bisect_right(self.starts, index) - 1
        with self._lock:
            fd = self._files.get(shard)
            if fd is None:
                if len(self._files) >= open_files_allowed():
                    self._close()
                fd = self._files[shard] = os.open(self.shards[shard], os.O_RDONLY)
            data = os.pread(fd, int(self.sizes[index]), int(self.offsets[index]))
        if len(data) != self.sizes[index]:
            raise DataError(f"shard {self.shards[shard]} is shorter than its index says: copy or "
                            "write it again")
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), int(self.targets[index])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        data, label = self.encoded(index)
        return decode_rgb(data), label

    def __getstate__(self) -> dict:  # a spawned worker opens its own files
        return {**self.__dict__, "_files": {}, "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at exit os may be gone: the files close anyway
            self._close()


def load_shards(name: str, split: str) -> ShardImages:
    """The "train" or "test" split of the shards `name` names; without class names in an info file
    the classes are "0" ... up to the largest label."""
    splits = locate(name)
    classes = splits.classes or tuple(str(c) for c in range(1 + max(
        int(load_index(p).labels.max()) for p in (*splits.train, *splits.test))))
    return ShardImages(splits.train if split == "train" else splits.test, classes)


def split_sizes(name: str) -> tuple[int, int]:
    """(training samples, validation samples) of the shards `name` names."""
    splits = locate(name)
    return tuple(sum(len(load_index(p).offsets) for p in files)
                 for files in (splits.train, splits.test))
