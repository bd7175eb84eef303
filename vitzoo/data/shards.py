"""A dataset stored as WebDataset tar shards, read at random: few large files, not many small.

`--data` takes shards as a folder holding an info file (`_info.json` or `info.json`, in timm's
WebDataset reader's format; `vitzoo shard` writes one, with the class names) or as a brace pattern
(`DIR/train-{000000..000127}.tar`), whose validation split is the info file's beside them or the
same pattern with `train` -> `val` (`validation`, `test`).

A sample is WebDataset's: consecutive members that share a key (the name up to the first dot of its
last part), its image the member with an image extension, its class the integer in `.cls`. The
offsets come from the tar headers once (`ShardIndex`, kept as `SHARD.idx` beside the shard, else in
$VITZOO_CACHE/shard-index/). `ShardImages` reads each image with one positioned read, in the order
the shards list their samples: shards of a folder are that folder's dataset, sample for sample.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import os
import re
import resource
import tarfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from vitzoo.data.transforms import decode_rgb
from vitzoo.errors import DataError
from vitzoo.io import atomic_path, cache_dir

INFO_FILES = ("_info.json", "info.json")  # the names timm's WebDataset reader looks for, in order
TEST_SPLITS = ("val", "validation", "test")  # what a validation split may be called, in this order
IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "ppm", "pgm", "pbm", "bmp", "tif", "tiff", "gif")
_KEY_AND_SUFFIX = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # WebDataset's grouping rule
_BRACES = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")


@dataclass(frozen=True)
class ShardIndex:
    """The samples of one shard, in tar order: their image's offset and size, and their class."""

    offsets: np.ndarray
    sizes: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets)


def index_files(shard: Path) -> tuple[Path, Path]:
    """Where a shard's index is kept: beside it, else (a folder this user cannot write) cached."""
    digest = hashlib.sha256(str(shard.resolve()).encode()).hexdigest()[:16]
    cached = cache_dir() / "shard-index" / f"{digest}-{shard.name}.idx"
    return shard.with_name(shard.name + ".idx"), cached


def _stamp(shard: Path) -> tuple[int, int]:
    return (info := shard.stat()).st_size, info.st_mtime_ns


def _read_saved(path: Path, stamp: tuple[int, int]) -> ShardIndex | None:
    """The index saved at `path` if it was made from the shard as it is now (size, time)."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            if (int(saved["shard_bytes"]), int(saved["shard_mtime_ns"])) != stamp:
                return None
            return ShardIndex(*(saved[k].astype(np.int64) for k in ("offsets", "sizes", "labels")))
    except (OSError, ValueError, KeyError):  # none there, or not an index (a partial copy)
        return None


def save_index(shard: Path, index: ShardIndex) -> Path:
    """Save `index` beside `shard` where that folder is writable, else in vitzoo's cache."""
    size, mtime_ns = _stamp(shard)
    arrays = dict(shard_bytes=np.int64(size), shard_mtime_ns=np.int64(mtime_ns),
                  offsets=index.offsets, sizes=index.sizes, labels=index.labels)
    for target in index_files(shard):
        try:
            with atomic_path(target) as tmp, open(tmp, "wb") as f:
                np.savez(f, **arrays)
            return target
        except OSError:  # a read-only folder (shared data): the cache instead
            continue
    raise DataError(f"cannot save the index of {shard} beside it nor in "
                    f"{index_files(shard)[1].parent}: make one of them writable, or set "
                    "VITZOO_CACHE to a writable folder")


def load_index(shard: Path) -> ShardIndex:
    """The index of `shard`: the saved one while the shard is unchanged, else read and saved."""
    shard = Path(shard)
    try:
        stamp = _stamp(shard)
    except OSError as exc:
        raise DataError(f"shard {shard} cannot be read ({exc.strerror or exc}): check the path, or "
                        "write the shards again with `vitzoo shard`") from None
    for saved in index_files(shard):
        index = _read_saved(saved, stamp)
        if index is not None:
            return index
    index = read_headers(shard)
    save_index(shard, index)
    return index


def read_headers(shard: Path) -> ShardIndex:
    """Index `shard` from its tar headers (the images' data is skipped, the `.cls` texts read)."""
    keys: list[str] = []
    samples: list[dict[str, tuple[int, int]]] = []
    offsets, sizes, classes = [], [], []
    try:
        # unbuffered: a header is one 512-byte read, not a buffer's 8 KB of image data around it
        with open(shard, "rb", buffering=0) as f, tarfile.open(fileobj=f, mode="r:") as tar:
            for member in tar:
                name = member.name
                match = _KEY_AND_SUFFIX.match(name)
                metadata = "/" not in name and name.startswith("__") and name.endswith("__")
                if not member.isreg() or match is None or metadata:
                    continue  # no sample: WebDataset's metadata, or a name without an extension
                if not keys or keys[-1] != match.group(1):
                    keys.append(match.group(1))
                    samples.append({})
                samples[-1][match.group(2).lower()] = (member.offset_data, member.size)
            for key, sample in zip(keys, samples):
                image = next((sample[s] for s in IMAGE_SUFFIXES if s in sample), None)
                if image is None:
                    raise DataError(f"sample {key!r} of shard {shard} has no image member "
                                    f"({', '.join(sample)} only; vitzoo reads one of "
                                    f".{', .'.join(IMAGE_SUFFIXES)})")
                if "cls" not in sample:
                    raise DataError(f"sample {key!r} of shard {shard} has no .cls member (its "
                                    "class index, which vitzoo reads as timm's WebDataset reader "
                                    "does); write the shards with `vitzoo shard` or add a .cls "
                                    "member to every sample")
                f.seek(sample["cls"][0])
                text = f.read(sample["cls"][1])
                try:
                    classes.append(int(text.decode("ascii").strip()))
                except (UnicodeDecodeError, ValueError):
                    raise DataError(f"sample {key!r} of shard {shard}: its .cls member holds "
                                    f"{text[:40]!r}, not a class index (an integer)") from None
                offsets.append(image[0])
                sizes.append(image[1])
    except tarfile.ReadError as exc:
        raise DataError(f"{shard} is not an uncompressed tar file ({exc}); shards are read at "
                        "random, which a compressed one (.tar.gz) does not allow: decompress it, "
                        "or write the shards with `vitzoo shard`") from None
    if not offsets:
        raise DataError(f"shard {shard} holds no samples (no member with an image extension)")
    return ShardIndex(*(np.asarray(v, dtype=np.int64) for v in (offsets, sizes, classes)))


# ---------------------------------------------------------------------------- names and info files
def expand_braces(pattern: str) -> list[str]:
    """`a-{000..002}.tar` -> a-000.tar, a-001.tar, a-002.tar (the first number's zero padding kept);
    `{x,y}` -> x, y; several braces multiply."""
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    body, head, tail = match.group(1), pattern[:match.start()], pattern[match.end():]
    numbers = _RANGE.fullmatch(body)
    if numbers:
        first, last = int(numbers.group(1)), int(numbers.group(2))
        if last < first:
            raise DataError(f"{pattern}: the range {{{body}}} runs backwards; write "
                            f"{{{numbers.group(2)}..{numbers.group(1)}}}")
        width = len(numbers.group(1)) if numbers.group(1).startswith("0") else 0
        items = [str(n).zfill(width) for n in range(first, last + 1)]
    elif "," in body:
        items = body.split(",")
    else:
        raise DataError(f"{pattern}: {{{body}}} is neither a range {{000..127}} nor a list {{a,b}}")
    return [name for item in items for name in expand_braces(head + item + tail)]


def _as_glob(pattern: str) -> str:
    """The pattern with each brace matching any number (as many digits as its padding) or text."""
    def one(match: re.Match) -> str:
        first = (_RANGE.fullmatch(match.group(1)) or [None, ""])[1]
        return "[0-9]" * len(first) if first.startswith("0") else "*"

    return _BRACES.sub(one, pattern)


def read_info(folder: Path) -> tuple[Path, dict] | None:
    """The info file of a folder of shards and what it says, or None where there is none."""
    for name in INFO_FILES:
        path = folder / name
        if path.is_file():
            try:
                info = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise DataError(f"{path} is not a readable JSON info file ({exc}); write the "
                                "shards again with `vitzoo shard`, or remove it") from None
            if not isinstance(info, dict) or not isinstance(info.get("splits"), dict):
                return None  # another tool's info.json, not a shard listing
            return path, info
    return None


def is_shards(name: str) -> bool:
    """Whether `--data name` names shards: a folder with an info file listing splits, or `.tar`s."""
    path = Path(name)
    return read_info(path) is not None if path.is_dir() else name.endswith(".tar")


class ShardSplits(NamedTuple):
    """The shard files of both splits, and the class names where known."""

    train: tuple[Path, ...]
    test: tuple[Path, ...]
    classes: tuple[str, ...] | None


def _listed(folder: Path, info_path: Path, info: dict, split: str) -> tuple[Path, ...]:
    entry = info["splits"][split]
    names = entry.get("filenames") if isinstance(entry, dict) else None
    if not names or not all(isinstance(n, str) for n in names):
        raise DataError(f"{info_path}: split {split!r} lists no shard files "
                        f"(splits.{split}.filenames)")
    if any("://" in n or n.startswith("pipe:") for n in names):
        raise DataError(f"{info_path}: split {split!r} lists URLs; vitzoo reads shards on a file "
                        "system at random, not streamed: copy them to a local or cluster file "
                        "system")
    return tuple(folder / n for n in names)


def _classes(info: dict | None) -> tuple[str, ...] | None:
    classes = (info or {}).get("classes")
    return tuple(str(c) for c in classes) if isinstance(classes, list) and classes else None


def _check_there(name: str, files, fix: str) -> None:
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise DataError(f"{len(missing)} shard file(s) of {name} are not there: "
                        f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}; {fix}, "
                        "or write them with `vitzoo shard`")


def locate(name: str) -> ShardSplits:
    """The shards `--data name` names (a folder with an info file, or a pattern), all there."""
    path = Path(name)
    if not path.is_dir():
        splits = _from_pattern(name)
    elif (found := read_info(path)) is None:
        raise DataError(f"{path} holds no shard info file ({' or '.join(INFO_FILES)}); write it "
                        "with `vitzoo shard FOLDER OUT`, or give the shards as a pattern "
                        "(DIR/train-{000000..000127}.tar)")
    else:
        info_path, info = found
        if "train" not in info["splits"]:
            raise DataError(f"{info_path} lists no train split (it has "
                            f"{', '.join(info['splits']) or 'none'})")
        test = next((s for s in TEST_SPLITS if s in info["splits"]), None)
        if test is None:
            raise DataError(f"{info_path} lists no validation split ({' or '.join(TEST_SPLITS)}; "
                            f"it has {', '.join(info['splits'])}): shard the folder's val/ too "
                            "(`vitzoo shard`)")
        train, tests = (_listed(path, info_path, info, s) for s in ("train", test))
        splits = ShardSplits(train, tests, _classes(info))
    _check_there(name, (*splits.train, *splits.test), "copy them there")
    return splits


def _from_pattern(pattern: str) -> ShardSplits:
    if "://" in pattern or pattern.startswith("pipe:"):
        raise DataError(f"{pattern}: vitzoo reads shards on a file system at random, not streamed "
                        "from a URL; copy them to a local or cluster file system, give their path")
    train = tuple(Path(p) for p in expand_braces(pattern))
    _check_there(pattern, train, "check the pattern")
    folder = train[0].parent
    found = read_info(folder)
    test = found and next((s for s in TEST_SPLITS if s in found[1]["splits"]), None)
    if test:  # an info file beside them lists their validation split
        return ShardSplits(train, _listed(folder, *found, test), _classes(found[1]))
    head, base = os.path.split(pattern)
    tried = []
    for alternative in TEST_SPLITS:
        other = os.path.join(head, base.replace("train", alternative))
        if other == pattern:
            break
        tried.append(other)
        files = [Path(p) for p in expand_braces(other)]
        if not all(f.is_file() for f in files):  # a validation split has fewer shards: any number
            files = sorted(folder.glob(_as_glob(os.path.basename(other))))
        if files:
            return ShardSplits(train, tuple(files), _classes(found[1]) if found else None)
    tried = " or ".join(tried) or "the pattern with train -> val"
    raise DataError(f"no validation shards found for {pattern}: no info file beside them lists a "
                    f"val split, and no files match {tried}; name the training shards "
                    "train-*.tar and the validation shards val-*.tar, or write both with "
                    "`vitzoo shard`")


# ---------------------------------------------------------------------------- the dataset
def open_files_allowed() -> int:
    """Half this process's limit of open files, raised first to the hard limit (ImageNet-21k at 1 GB
    a shard is ~1,500 shards)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 65_536 if hard == resource.RLIM_INFINITY else hard
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return max(8, soft // 2)


class ShardImages(Dataset):
    """The samples of `shards`, in order, of the classes named `classes`: `targets`, `dataset[i]` =
    (uint8 (3, H, W), label), `encoded(i)` = (the image's bytes, label). Each process opens the
    shard files it reads, at most `open_files_allowed()` at once."""

    def __init__(self, shards, classes) -> None:
        indexes = [load_index(Path(p)) for p in shards]
        self.shards, self.classes = [str(p) for p in shards], list(classes)
        self.starts = np.cumsum([0] + [len(index) for index in indexes]).tolist()
        self.offsets = np.concatenate([index.offsets for index in indexes])
        self.sizes = np.concatenate([index.sizes for index in indexes])
        self.targets = torch.from_numpy(np.concatenate([index.labels for index in indexes]))
        wrong = [c for c in self.targets.unique().tolist() if not 0 <= c < len(self.classes)]
        if wrong:
            raise DataError(f"the shards {self.shards[0]} ... hold class {wrong[0]}, outside the "
                            f"{len(self.classes)} classes their info file names")
        self._files: OrderedDict[int, int] = OrderedDict()  # shard -> this process's descriptor
        self._pid: int | None = None  # the process they are open in
        self._lock: threading.Lock | None = None

    def __len__(self) -> int:
        return self.starts[-1]

    def _descriptor(self, shard: int) -> int:
        """The shard's descriptor, opened if need be (past the limit, the least recent closed)."""
        fd = self._files.get(shard)
        if fd is None:
            while len(self._files) >= self._limit:
                os.close(self._files.popitem(last=False)[1])
            fd = self._files[shard] = os.open(self.shards[shard], os.O_RDONLY)
        else:
            self._files.move_to_end(shard)
        return fd

    def _close(self) -> None:
        for fd in self._files.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._files.clear()

    def encoded(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} of {len(self)}")
        shard = bisect.bisect_right(self.starts, index) - 1
        offset, size = int(self.offsets[index]), int(self.sizes[index])
        if self._pid != os.getpid():  # a forked worker: the parent's descriptors are not its own
            self._close()
            self._pid, self._limit, self._lock = os.getpid(), open_files_allowed(), threading.Lock()
        with self._lock:  # threads share the descriptors: none is closed under another's read
            data = os.pread(self._descriptor(shard), size, offset)
        if len(data) != size:
            raise DataError(f"shard {self.shards[shard]} ends before its sample "
                            f"{index - self.starts[shard]} (truncated or changed since it was "
                            "indexed): copy or write it again")
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), int(self.targets[index])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        data, label = self.encoded(index)
        return decode_rgb(data), label

    def __getstate__(self) -> dict:  # a worker started by a fork server opens its own files
        return {**self.__dict__, "_files": OrderedDict(), "_pid": None, "_lock": None}

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at exit os may be gone: the files close anyway
            if getattr(self, "_pid", None) == os.getpid():
                self._close()


def load_shards(name: str, split: str) -> ShardImages:
    """The "train" or "test" split of the shards `name` names."""
    splits = locate(name)
    classes = splits.classes or tuple(str(c) for c in range(1 + max(  # "0" ... the largest label
        int(load_index(p).labels.max()) for p in (*splits.train, *splits.test))))
    return ShardImages(splits.train if split == "train" else splits.test, classes)


def split_sizes(name: str) -> tuple[int, int]:
    """(training samples, validation samples) of the shards `name` names."""
    splits = locate(name)
    return tuple(sum(len(load_index(p)) for p in files) for files in (splits.train, splits.test))
