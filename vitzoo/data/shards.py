"""A dataset stored as WebDataset tar shards, read at random: few large files, not many small.

`--data` names shards as a folder with an info file (`_info.json` or `info.json`, timm's format)
or as a brace pattern (`DIR/train-{000000..000127}.tar`), whose validation split is the one the
info file beside them lists, else the pattern's with `train` -> `val` (`validation`, `test`). A
sample is WebDataset's: consecutive members sharing a key, an image and a `.cls` (its class).
Where each image lies is read from the tar headers once (an index cached in
$VITZOO_CACHE/shard-index/); `ShardImages` reads it with one `pread`.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import hashlib
import io
import json
import os
import re
import resource
import tarfile
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


def load_index(shard: Path) -> ShardIndex:
    """The index of `shard`: read from its tar headers once, then from vitzoo's cache while the
    shard's path, size and time stay."""
    shard, stat = Path(shard), os.stat(shard)
    key = f"{shard.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    place = cache_dir() / "shard-index" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.npz"
    if place.is_file():
        with np.load(place) as saved:
            return ShardIndex(*(saved[k] for k in ShardIndex._fields))
    index = read_headers(shard)
    with atomic_path(place) as tmp, open(tmp, "wb") as f:
        np.savez(f, **index._asdict())
    return index


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
    else:
        items = body.split(",")
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
        splits[split] = tuple(folder / name for name in entry["filenames"])
        if not all(inside in p.resolve().parents for p in splits[split]):
            raise DataError(f"{path}: split {split!r} names a file outside {folder}")
    classes = info.get("classes")
    return splits, tuple(map(str, classes)) if isinstance(classes, list) else None


def is_shards(name: str) -> bool:
    """Whether `--data name` names shards: a folder with an info file listing splits, or `.tar`s."""
    return read_info(Path(name)) is not None if os.path.isdir(name) else name.endswith(".tar")


def locate(name: str) -> tuple[tuple[Path, ...], tuple[Path, ...], tuple | None]:
    """(training shards, validation shards, class names or None) of `--data name`, a folder with
    an info file or a pattern, every file there."""
    pattern = not os.path.isdir(name)
    train = tuple(map(Path, expand_braces(name))) if pattern else ()
    folder = train[0].parent if pattern else Path(name)
    splits, classes = read_info(folder) or ({}, None)
    train = train or splits.get("train", ())
    test = next((splits[s] for s in TEST_SPLITS if s in splits), ())
    base = os.path.basename(_BRACES.sub("*", name))
    for other in TEST_SPLITS if pattern and not test and "train" in base else ():
        test = tuple(sorted(folder.glob(base.replace("train", other))))
        if test:
            break
    if not train or not test:
        raise DataError(f"{name}: no {'validation' if train else 'training'} shards (an info file "
                        "lists none, and no val-*.tar is beside train-*.tar): write them with "
                        "`vitzoo shard`")
    missing = [str(p) for p in (*train, *test) if not p.is_file()]
    if missing:
        raise DataError(f"{len(missing)} shard file(s) of {name} are not there: "
                        f"{', '.join(missing[:3])}")
    return train, test, classes


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
    a file this process keeps open (at most `open_files_allowed()` of them)."""

    def __init__(self, shards, classes) -> None:
        indexes = [load_index(Path(p)) for p in shards]
        self.shards, self.classes = [str(p) for p in shards], list(classes)
        self.starts = np.cumsum([0] + [len(index.offsets) for index in indexes]).tolist()
        self.offsets, self.sizes, labels = (np.concatenate(arrays) for arrays in zip(*indexes))
        self.targets = torch.from_numpy(labels)
        self._files: dict[int, io.FileIO] = {}  # shard -> its file, this process's own

    def __len__(self) -> int:
        return self.starts[-1]

    def encoded(self, index: int) -> tuple[torch.Tensor, int]:
        shard = bisect.bisect_right(self.starts, index) - 1
        file = self._files.get(shard)  # held here: a thread clearing the dict cannot close it
        if file is None:
            if len(self._files) >= open_files_allowed():
                self._files.clear()  # each closes as it is dropped
            file = self._files[shard] = io.FileIO(self.shards[shard])
        data = os.pread(file.fileno(), int(self.sizes[index]), int(self.offsets[index]))
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), int(self.targets[index])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        data, label = self.encoded(index)
        return decode_rgb(data), label

    def __getstate__(self) -> dict:  # a worker started by a fork server opens its own files
        return {**self.__dict__, "_files": {}}


def load_shards(name: str, split: str) -> ShardImages:
    """The "train" or "test" split of the shards `name` names; without class names in an info file
    the classes are "0" ... up to the largest label."""
    train, test, classes = locate(name)
    classes = classes or tuple(str(c) for c in range(1 + max(
        int(load_index(p).labels.max()) for p in (*train, *test))))
    return ShardImages(train if split == "train" else test, classes)


def split_sizes(name: str) -> tuple[int, int]:
    """(training samples, validation samples) of the shards `name` names."""
    return tuple(sum(len(load_index(p).offsets) for p in files) for files in locate(name)[:2])
