"""A dataset stored as WebDataset tar shards, read at random: few large files instead of millions of small ones.

`--data` (and `load_split`, `check_data`) takes shards two ways:

- a folder holding an info file (`_info.json` or `info.json`, the format of timm's WebDataset reader:
  `splits.<name>.filenames`, `shard_lengths`, `num_samples`), as `vitzoo shard` writes; vitzoo's also
  lists the class names (`classes`), in the label order of the ImageFolder the shards were made from;
- a brace pattern of shard files, `/data/in1k/train-{000000..000127}.tar` (or one `.tar`): the training
  split; its validation split is the info file's beside them (its split named val, validation or test),
  or else the same pattern with `train` -> `val` (`validation`, `test`), each brace matching any number.

`ShardImages` is a map-style dataset over the shards' samples, in the order the shards are listed and
the samples lie in them: shards made by `vitzoo shard` list a folder's images in the folder's own order,
so the training sampler, its exact resume and the per-sample augmentation see the same dataset, and a
run on the shards equals the run on the folder. Each sample is read with one positioned read of its
image's bytes (vitzoo.data.shard_index: the offsets, from the tar headers, indexed once); each process
opens the shard files itself, when it first reads them (a file object is never shared across a fork).

What this is not: WebDataset's streaming, where each rank and worker reads whole shards in sequence
and shuffles within a buffer. That reads the disk in sequence, but changes the order the images are
seen in with the number of ranks and workers, and cannot resume mid-epoch exactly.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from vitzoo.data.decode import decode_rgb
from vitzoo.data.shard_index import load_index, open_files_allowed, read_at
from vitzoo.errors import DataError

INFO_FILES = ("_info.json", "info.json")  # the names timm's WebDataset reader looks for, in its order
TEST_SPLITS = ("val", "validation", "test")  # what a validation split may be called, in this order
_BRACES = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")


# ---------------------------------------------------------------------------- names and info files
def expand_braces(pattern: str) -> list[str]:
    """`a-{000..002}.tar` -> a-000.tar, a-001.tar, a-002.tar; `{x,y}` -> x, y; several braces multiply.
    A range keeps the zero padding of its first number."""
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    body, head, tail = match.group(1), pattern[:match.start()], pattern[match.end():]
    numbers = _RANGE.fullmatch(body)
    if numbers:
        first, last = int(numbers.group(1)), int(numbers.group(2))
        if last < first:
            raise DataError(f"{pattern}: the range {{{body}}} runs backwards; write {{{numbers.group(2)}..{numbers.group(1)}}}")
        width = len(numbers.group(1)) if numbers.group(1).startswith("0") else 0
        items = [str(n).zfill(width) for n in range(first, last + 1)]
    elif "," in body:
        items = body.split(",")
    else:
        raise DataError(f"{pattern}: {{{body}}} is neither a range {{000..127}} nor a list {{a,b}}")
    return [name for item in items for name in expand_braces(head + item + tail)]


def _as_glob(pattern: str) -> str:
    """The pattern with each brace matching any number ([0-9] as many times as its padding) or any text."""
    def one(match: re.Match) -> str:
        numbers = _RANGE.fullmatch(match.group(1))
        if numbers and numbers.group(1).startswith("0"):
            return "[0-9]" * len(numbers.group(1))
        return "*"

    return _BRACES.sub(one, pattern)


def read_info(folder: Path) -> tuple[Path, dict] | None:
    """The info file of a folder of shards and what it says, or None where there is none."""
    for name in INFO_FILES:
        path = folder / name
        if path.is_file():
            try:
                info = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise DataError(f"{path} is not a readable JSON info file ({exc}); write the shards again with "
                                "`vitzoo shard`, or remove it") from None
            if not isinstance(info, dict) or not isinstance(info.get("splits"), dict):
                return None  # another tool's info.json, not a shard listing
            return path, info
    return None


def is_shards(name: str) -> bool:
    """Whether `--data name` names shards: a folder with an info file listing splits, or `.tar` files."""
    path = Path(name)
    if path.is_dir():
        return read_info(path) is not None
    return name.endswith(".tar")


@dataclass(frozen=True)
class ShardSplits:
    """The shard files of the training and validation splits, the class names where known, and the
    samples per shard where an info file counts them (None elsewhere)."""

    train: tuple[Path, ...]
    test: tuple[Path, ...]
    classes: tuple[str, ...] | None
    train_lengths: tuple[int, ...] | None = None
    test_lengths: tuple[int, ...] | None = None


def _listed(folder: Path, info_path: Path, info: dict, split: str) -> tuple[tuple[Path, ...], tuple[int, ...] | None]:
    entry = info["splits"][split]
    names = entry.get("filenames") if isinstance(entry, dict) else None
    if not names or not all(isinstance(n, str) for n in names):
        raise DataError(f"{info_path}: split {split!r} lists no shard files (splits.{split}.filenames)")
    if any("://" in n or n.startswith("pipe:") for n in names):
        raise DataError(f"{info_path}: split {split!r} lists URLs; vitzoo reads shards on a file system at random, "
                        "not streamed: copy them to a local or cluster file system")
    lengths = entry.get("shard_lengths")
    lengths = tuple(int(n) for n in lengths) if isinstance(lengths, list) and len(lengths) == len(names) else None
    return tuple(folder / n for n in names), lengths


def _classes(info: dict | None) -> tuple[str, ...] | None:
    classes = (info or {}).get("classes")
    return tuple(str(c) for c in classes) if isinstance(classes, list) and classes else None


def locate(name: str) -> ShardSplits:
    """The shards `--data name` names (a folder with an info file, or a pattern), every file checked to be there."""
    path = Path(name)
    if path.is_dir():
        found = read_info(path)
        if found is None:
            raise DataError(f"{path} holds no shard info file ({' or '.join(INFO_FILES)}); write it with "
                            "`vitzoo shard FOLDER OUT`, or give the shards as a pattern (DIR/train-{000000..000127}.tar)")
        info_path, info = found
        if "train" not in info["splits"]:
            raise DataError(f"{info_path} lists no train split (it has {', '.join(info['splits']) or 'none'})")
        test = next((s for s in TEST_SPLITS if s in info["splits"]), None)
        if test is None:
            raise DataError(f"{info_path} lists no validation split ({' or '.join(TEST_SPLITS)}; it has "
                            f"{', '.join(info['splits'])}): shard the folder's val/ too (`vitzoo shard`)")
        (train, train_lengths), (tests, test_lengths) = (_listed(path, info_path, info, s) for s in ("train", test))
        splits = ShardSplits(train, tests, _classes(info), train_lengths, test_lengths)
    else:
        splits = _from_pattern(name)
    missing = [str(p) for p in (*splits.train, *splits.test) if not p.is_file()]
    if missing:
        raise DataError(f"{len(missing)} shard file(s) of {name} are not there: {', '.join(missing[:3])}"
                        f"{' ...' if len(missing) > 3 else ''}; copy them there, or write them with `vitzoo shard`")
    return splits


def _from_pattern(pattern: str) -> ShardSplits:
    if "://" in pattern or pattern.startswith("pipe:"):
        raise DataError(f"{pattern}: vitzoo reads shards on a file system at random, not streamed from a URL; copy "
                        "them to a local or cluster file system and give their path")
    train = tuple(Path(p) for p in expand_braces(pattern))
    missing = [str(p) for p in train if not p.is_file()]
    if missing:
        raise DataError(f"{len(missing)} shard file(s) of {pattern} are not there: {', '.join(missing[:3])}"
                        f"{' ...' if len(missing) > 3 else ''}; check the pattern, or write them with `vitzoo shard`")
    folder = train[0].parent
    found = read_info(folder)
    if found is not None:  # the info beside them: the split these files are, and its validation split
        info_path, info = found
        names = {p.name for p in train}
        listed = {s: _listed(folder, info_path, info, s) for s in info["splits"]}
        given = next((s for s, (files, _) in listed.items() if names <= {f.name for f in files}), None)
        test = next((s for s in TEST_SPLITS if s in listed and s != given), None)
        if given is not None and test is not None:
            given_files, given_lengths = listed[given]
            lengths = dict(zip((f.name for f in given_files), given_lengths)) if given_lengths else None
            test_files, test_lengths = listed[test]
            return ShardSplits(train, test_files, _classes(info), lengths and tuple(lengths[p.name] for p in train),
                               test_lengths)
    head, base = os.path.split(pattern)
    tried = []
    for alternative in TEST_SPLITS:
        other = os.path.join(head, base.replace("train", alternative))
        if other == pattern:
            break
        tried.append(other)
        files = [Path(p) for p in expand_braces(other)]
        if not all(f.is_file() for f in files):  # the validation split has fewer shards: any number of them
            files = sorted(folder.glob(_as_glob(os.path.basename(other))))
        if files:
            return ShardSplits(train, tuple(files), _classes(found[1]) if found else None)
    raise DataError(f"no validation shards found for {pattern}: no info file beside them lists its split and a "
                    f"val split, and no files match {' or '.join(tried) or 'the pattern with train -> val'}; name "
                    "the training shards train-*.tar and the validation shards val-*.tar, or write both with `vitzoo shard`")


# ---------------------------------------------------------------------------- the dataset
class ShardImages(Dataset):
    """The samples of `shards` (in that order, then tar order) with the interface of
    `vitzoo.data.decode.FileImages`: `targets` (a long tensor), `classes`, `dataset[i]` = (uint8 (3, H, W),
    label) decoded by `decode_rgb`, `encoded(i)` = (the image's bytes as a 1-D uint8 tensor, label) for a
    decoder elsewhere. `classes`: the class names in label order (default "0", "1", ... up to the largest
    label). Each process opens the shard files it reads, lazily, at most `open_files_allowed()` at once."""

    def __init__(self, shards: list[Path] | tuple[Path, ...], classes: list[str] | tuple[str, ...] | None = None) -> None:
        indexes = [load_index(Path(p)) for p in shards]
        self.shards = [str(p) for p in shards]
        self.starts = np.cumsum([0] + [len(index) for index in indexes]).tolist()  # sample number of each shard's first
        self.offsets = np.concatenate([index.offsets for index in indexes])
        self.sizes = np.concatenate([index.sizes for index in indexes])
        labels = np.concatenate([index.labels for index in indexes])
        self.targets = torch.from_numpy(labels)
        top = int(labels.max()) if len(labels) else -1
        self.classes = list(classes) if classes is not None else [str(c) for c in range(top + 1)]
        if top >= len(self.classes) or (len(labels) and int(labels.min()) < 0):
            raise DataError(f"the shards {self.shards[0]} ... hold class {top if top >= len(self.classes) else int(labels.min())}, "
                            f"outside the {len(self.classes)} classes their info file names")
        self._files: OrderedDict[int, int] = OrderedDict()  # shard -> descriptor, this process's own
        self._pid: int | None = None  # the process they are open in
        self._lock: threading.Lock | None = None

    def __len__(self) -> int:
        return self.starts[-1]

    def _this_process(self) -> None:
        if self._pid != os.getpid():  # a new process (a forked worker): the parent's descriptors are not its own
            self._close()
            self._pid, self._limit, self._lock = os.getpid(), open_files_allowed(), threading.Lock()

    def _descriptor(self, shard: int) -> int:
        """The shard's descriptor, opened now if need be (the least recently read closed past the limit)."""
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
            try:
                os.close(fd)
            except OSError:
                pass
        self._files.clear()

    def encoded(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} of {len(self)}")
        shard = bisect.bisect_right(self.starts, index) - 1
        size = int(self.sizes[index])
        self._this_process()
        # threads of one process share the descriptors: where one may be closed to open another (more shards
        # than open files allowed), a read holds the lock, else it would read the file that took its number
        closing = len(self.shards) > self._limit
        with self._lock:
            fd = self._descriptor(shard)
            data = read_at(fd, int(self.offsets[index]), size) if closing else None
        if data is None:
            data = read_at(fd, int(self.offsets[index]), size)
        if len(data) != size:
            raise DataError(f"shard {self.shards[shard]} ends before sample {index - self.starts[shard]} (truncated "
                            "or changed since it was indexed): copy or write it again")
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), int(self.targets[index])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        data, label = self.encoded(index)
        return decode_rgb(data), label

    def __getstate__(self) -> dict:  # a worker started by spawn or a fork server opens its own files
        return {**self.__dict__, "_files": OrderedDict(), "_pid": None, "_lock": None}

    def __del__(self) -> None:
        try:
            if getattr(self, "_pid", None) == os.getpid():
                self._close()
        except Exception:  # at interpreter exit, when os may be gone: the descriptors close with the process
            pass


def _all_classes(splits: ShardSplits) -> tuple[str, ...]:
    """Class names where the info file has none: "0" ... up to the largest label of either split."""
    top = max(int(load_index(p).labels.max()) for p in (*splits.train, *splits.test))
    return tuple(str(c) for c in range(top + 1))


def load_shards(name: str, split: str) -> ShardImages:
    """The "train" or "test" split of the shards `name` names (see the module's docstring)."""
    splits = locate(name)
    return ShardImages(splits.train if split == "train" else splits.test, splits.classes or _all_classes(splits))


def split_sizes(name: str) -> tuple[int, int]:
    """(training samples, validation samples) of the shards `name` names: the info file's counts where
    it has them, else counted from the shards' indexes."""
    splits = locate(name)
    counts = []
    for files, lengths in ((splits.train, splits.train_lengths), (splits.test, splits.test_lengths)):
        counts.append(sum(lengths) if lengths is not None else sum(len(load_index(p)) for p in files))
    return counts[0], counts[1]


__all__ = ["INFO_FILES", "TEST_SPLITS", "ShardImages", "ShardSplits", "expand_braces", "is_shards", "load_shards",
           "locate", "read_info", "split_sizes"]
