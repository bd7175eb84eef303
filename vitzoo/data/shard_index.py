"""Where each sample of a WebDataset tar shard lies: the offset and size of its image's bytes and its class,
read once from the tar headers and kept beside the shard.

A shard is a plain (uncompressed) tar file whose members are grouped into samples by WebDataset's rule:
consecutive members that share a key, the member's path up to the first dot of its last part
(`00000017_n01440764_10026.jpg` and `00000017_n01440764_10026.cls` are one sample). A sample's image is
its member with an image extension (`.jpg`, `.png`, `.webp`, ...), its class the integer written in its
`.cls` member; other members (`.json`, `.txt`) are skipped, as are WebDataset's `__*__` metadata members.

The index is read from the headers alone: tarfile seeks over each member's data, only the few bytes of
each `.cls` member are read. It is saved beside the shard (`SHARD.idx`, a NumPy .npz) where that folder
is writable, else in vitzoo's cache ($VITZOO_CACHE/shard-index/), and used while the shard's size and
modification time are those it was made from. `vitzoo shard` writes it as it writes the shard.
"""

from __future__ import annotations

import hashlib
import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitzoo.errors import DataError
from vitzoo.io import atomic_path, cache_dir

VERSION = 1  # of the index file's layout; an index of another version is made again
# the image extensions a sample's image may have, the first found taken (lower case, as WebDataset reads them)
IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "ppm", "pgm", "pbm", "bmp", "tif", "tiff", "gif")
# WebDataset's grouping rule: the key is the name up to the first dot of its last path component
_KEY_AND_SUFFIX = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


@dataclass(frozen=True)
class ShardIndex:
    """The samples of one shard, in tar order: where each image's bytes start and how many, its class."""

    offsets: np.ndarray  # int64, byte offset of the image's data in the shard
    sizes: np.ndarray  # int64, the image's bytes
    labels: np.ndarray  # int64, the class index of the .cls member

    def __len__(self) -> int:
        return len(self.offsets)


def index_file(shard: Path) -> Path:
    """The index beside `shard`."""
    return shard.with_name(shard.name + ".idx")


def _cached_file(shard: Path) -> Path:
    """The index in vitzoo's cache, for a shard in a folder this user cannot write (one per shard path)."""
    digest = hashlib.sha256(str(shard.resolve()).encode()).hexdigest()[:16]
    return cache_dir() / "shard-index" / f"{digest}-{shard.name}.idx"


def _stamp(shard: Path) -> tuple[int, int]:
    info = shard.stat()
    return info.st_size, info.st_mtime_ns


def _read(path: Path, stamp: tuple[int, int]) -> ShardIndex | None:
    """The index saved at `path` if it was made from a shard of this size and modification time."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            if int(saved["version"]) != VERSION or (int(saved["shard_bytes"]), int(saved["shard_mtime_ns"])) != stamp:
                return None
            return ShardIndex(saved["offsets"].astype(np.int64), saved["sizes"].astype(np.int64),
                              saved["labels"].astype(np.int64))
    except (OSError, ValueError, KeyError):  # none there, or not an index (a partial copy, another file)
        return None


def save_index(shard: Path, index: ShardIndex) -> Path:
    """Save `index` for `shard` as it is now (its size and modification time), beside it where that folder
    is writable, else in vitzoo's cache; returns where. Written atomically."""
    size, mtime_ns = _stamp(shard)
    arrays = dict(version=np.int64(VERSION), shard_bytes=np.int64(size), shard_mtime_ns=np.int64(mtime_ns),
                  offsets=index.offsets.astype(np.int64), sizes=index.sizes.astype(np.int64),
                  labels=index.labels.astype(np.int64))
    for target in (index_file(shard), _cached_file(shard)):
        try:
            with atomic_path(target) as tmp, open(tmp, "wb") as f:
                np.savez(f, **arrays)
            return target
        except OSError:  # a read-only folder (shared data): the cache instead
            continue
    raise DataError(f"cannot save the index of {shard} beside it nor in {_cached_file(shard).parent}: make one of "
                    "them writable, or set VITZOO_CACHE to a writable folder")


def load_index(shard: Path) -> ShardIndex:
    """The index of `shard`: the saved one while the shard is unchanged, else read from its headers and saved."""
    shard = Path(shard)
    try:
        stamp = _stamp(shard)
    except OSError as exc:
        raise DataError(f"shard {shard} cannot be read ({exc.strerror or exc}): check the path, or write the "
                        "shards again with `vitzoo shard`") from None
    for saved in (index_file(shard), _cached_file(shard)):
        index = _read(saved, stamp)
        if index is not None:
            return index
    index = read_headers(shard)
    save_index(shard, index)
    return index


def read_headers(shard: Path) -> ShardIndex:
    """Index `shard` from its tar headers, WebDataset's grouping of members into samples."""
    samples: list[dict[str, tuple[int, int]]] = []
    keys: list[str] = []
    try:
        # unbuffered: a header is one 512-byte read, not a buffer's 8 KB of the image data around it
        with open(shard, "rb", buffering=0) as f, tarfile.open(fileobj=f, mode="r:") as tar:
            for member in tar:
                if not member.isreg():
                    continue
                name = member.name
                if "/" not in name and name.startswith("__") and name.endswith("__"):
                    continue  # WebDataset's metadata, no sample
                match = _KEY_AND_SUFFIX.match(name)
                if match is None:
                    continue  # no extension: WebDataset skips it too
                key, suffix = match.group(1), match.group(2).lower()
                if not keys or keys[-1] != key:
                    keys.append(key)
                    samples.append({})
                samples[-1][suffix] = (member.offset_data, member.size)
            offsets, sizes, classes = [], [], []
            for key, sample in zip(keys, samples):
                image = next((sample[s] for s in IMAGE_SUFFIXES if s in sample), None)
                if image is None:
                    raise DataError(f"sample {key!r} of shard {shard} has no image member ({', '.join(sample)} only; "
                                    f"vitzoo reads one of .{', .'.join(IMAGE_SUFFIXES)})")
                if "cls" not in sample:
                    raise DataError(f"sample {key!r} of shard {shard} has no .cls member (its class index, which "
                                    "vitzoo reads as timm's WebDataset reader does); write the shards with "
                                    "`vitzoo shard` or add a .cls member to every sample")
                f.seek(sample["cls"][0])
                text = f.read(sample["cls"][1])
                try:
                    classes.append(int(text.decode("ascii").strip()))
                except (UnicodeDecodeError, ValueError):
                    raise DataError(f"sample {key!r} of shard {shard}: its .cls member holds {text[:40]!r}, not a "
                                    "class index (an integer)") from None
                offsets.append(image[0])
                sizes.append(image[1])
    except tarfile.ReadError as exc:
        raise DataError(f"{shard} is not an uncompressed tar file ({exc}); shards are read at random, which a "
                        "compressed one (.tar.gz) does not allow: decompress it, or write the shards with "
                        "`vitzoo shard`") from None
    if not offsets:
        raise DataError(f"shard {shard} holds no samples (no member with an image extension)")
    as_array = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731
    return ShardIndex(as_array(offsets), as_array(sizes), as_array(classes))


def open_files_allowed() -> int:
    """How many shard files one process keeps open: half its limit of open files, raised first to the hard
    limit where the system lets it (one file per shard: ImageNet-21k at 1 GB a shard is ~1,500)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            target = 65_536 if hard == resource.RLIM_INFINITY else hard
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError):
                pass
        return max(8, soft // 2)
    except ImportError:  # not on POSIX
        return 256


def read_at(fd: int, offset: int, size: int) -> bytes:
    """`size` bytes at `offset` of an open file: one positioned read (pread; else a seek and a read),
    repeated only where the system returns fewer bytes than asked (reads over 2 GB). Fewer bytes than
    `size` come back only at the end of the file."""
    parts, done = [], 0
    while done < size:
        if hasattr(os, "pread"):
            part = os.pread(fd, size - done, offset + done)
        else:
            os.lseek(fd, offset + done, os.SEEK_SET)
            part = os.read(fd, size - done)
        if not part:
            break
        parts.append(part)
        done += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


__all__ = ["IMAGE_SUFFIXES", "ShardIndex", "index_file", "load_index", "open_files_allowed", "read_at",
           "read_headers", "save_index"]
