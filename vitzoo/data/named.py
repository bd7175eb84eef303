"""The named datasets torchvision reads and downloads (`--download`).

The root is `--data-dir`, or $VITZOO_CACHE/datasets. torchvision's classes download, check each
archive's MD5, extract and read; their errors come with the fix: `--download`, or, offline, where
to put the archives (an archive put there by hand is checked and extracted by `--download`).
`oxford-pets`: "train" is torchvision's `trainval`; `flowers102`: "train" is `train` + `val`.
"""

from __future__ import annotations

import errno
import socket
import tarfile
import zipfile
from pathlib import Path

from vitzoo.errors import DataError
from vitzoo.io import cache_dir, out_of_space

# name -> torchvision's class, its folder under the root, classes, and the torchvision splits
# (kwargs of the class) that make vitzoo's "train" and "test"
TORCHVISION = {
    "fashion-mnist": ("FashionMNIST", "FashionMNIST/raw", 10, ({"train": True},),
                      ({"train": False},)),
    "cifar10": ("CIFAR10", "", 10, ({"train": True},), ({"train": False},)),
    "cifar100": ("CIFAR100", "", 100, ({"train": True},), ({"train": False},)),
    "oxford-pets": ("OxfordIIITPet", "oxford-iiit-pet", 37, ({"split": "trainval"},),
                    ({"split": "test"},)),
    "flowers102": ("Flowers102", "flowers-102", 102, ({"split": "train"}, {"split": "val"}),
                   ({"split": "test"},)),
}
# what a folder says when it cannot take the files (a full disk: io.out_of_space), not the network
FOLDER_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST}
DOWNLOAD_TIMEOUT_S = 60  # per network read: a silent mirror ends the download instead of hanging


def root_of(data_dir) -> Path:
    return Path(data_dir) if data_dir else cache_dir() / "datasets"


def splits(name: str, split: str) -> tuple[dict, ...]:
    return TORCHVISION[name][3 if split == "train" else 4]


def how_to_get(name: str, root: Path) -> str:
    """The fix for a dataset that is not there, or not whole."""
    return (f"run with --download; offline, put torchvision.datasets.{TORCHVISION[name][0]}'s "
            f"archives in {root / TORCHVISION[name][1]} first")


def open_split(name: str, data_dir, kwargs: dict, download: bool = False):
    """torchvision's dataset object for one split of `name`, downloaded first if asked and not
    there; its failure a DataError that says how to get the files."""
    import torchvision.datasets

    root, cls = root_of(data_dir), getattr(torchvision.datasets, TORCHVISION[name][0])
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(previous or DOWNLOAD_TIMEOUT_S)  # urllib waits forever otherwise
    try:
        return cls(str(root), download=download, **kwargs)
    except (RuntimeError, OSError, EOFError, ValueError, tarfile.TarError,
            zipfile.BadZipFile) as exc:
        fix = ("the folder or its disk is at fault, not the network: give another --data-dir or "
               "free space" if getattr(exc, "errno", None) in FOLDER_ERRNOS or out_of_space(exc)
               else how_to_get(name, root))
        raise DataError(f"{name} in {root}: {exc}; {fix}") from None
    finally:
        socket.setdefaulttimeout(previous)


def download(name: str, data_dir=None) -> Path:
    """Fetch `name` through torchvision into its root unless it is there; returns the root."""
    if name not in TORCHVISION:
        raise DataError(f"{name!r} cannot be downloaded: only {', '.join(TORCHVISION)} can")
    open_split(name, data_dir, splits(name, "test")[0], download=True)
    return root_of(data_dir)
