"""The named datasets torchvision reads and downloads (`--download`): where their files go, what
each archive must hash to, and the errors when they are missing, corrupt or cannot be fetched.

The root is `--data-dir`, or $VITZOO_CACHE/datasets. Downloads go through torchvision's classes
(fetch, check the MD5, extract), URLs and checksums read from them; offline, an archive put by hand
where torchvision would have downloaded it is verified and extracted without the network.
`oxford-pets`: "train" is torchvision's `trainval`; `flowers102`: "train" is `train` + `val`.
"""

from __future__ import annotations

import errno
import os
import socket
import tarfile
import zipfile
from pathlib import Path

from vitzoo.errors import DataError
from vitzoo.io import cache_dir

# name -> torchvision's class, its folder under the root, classes, the torchvision splits that
# make vitzoo's "train" and "test" (kwargs of the class)
TORCHVISION = {
    "fashion-mnist": ("FashionMNIST", "FashionMNIST", 10, ({"train": True},), ({"train": False},)),
    "cifar10": ("CIFAR10", "cifar-10-batches-py", 10, ({"train": True},), ({"train": False},)),
    "cifar100": ("CIFAR100", "cifar-100-python", 100, ({"train": True},), ({"train": False},)),
    "oxford-pets": ("OxfordIIITPet", "oxford-iiit-pet", 37, ({"split": "trainval"},),
                    ({"split": "test"},)),
    "flowers102": ("Flowers102", "flowers-102", 102, ({"split": "train"}, {"split": "val"}),
                   ({"split": "test"},)),
}
DOWNLOAD_TIMEOUT_S = 60  # per network read: a silent mirror ends the download instead of hanging
# failures of the local folder or disk, said as such (a download's others are the network's)
LOCAL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR,
                errno.EEXIST, errno.EISDIR}


def root_of(data_dir) -> Path:
    return Path(data_dir) if data_dir else cache_dir() / "datasets"


def torchvision_class(name: str):
    import torchvision.datasets

    return getattr(torchvision.datasets, TORCHVISION[name][0])


def splits(name: str, split: str) -> tuple[dict, ...]:
    return TORCHVISION[name][3 if split == "train" else 4]


def archives(name: str, root: Path) -> list[tuple[str, Path, str]]:
    """(URL, path, MD5) of each file torchvision downloads for `name`, read from its class."""
    cls, folder = torchvision_class(name), root / TORCHVISION[name][1]
    if name == "fashion-mnist":
        return [(cls.mirrors[0] + file, folder / "raw" / file, md5) for file, md5 in cls.resources]
    if name in ("cifar10", "cifar100"):
        return [(cls.url, root / cls.filename, cls.tgz_md5)]
    if name == "oxford-pets":
        return [(url, folder / url.rsplit("/", 1)[-1], md5) for url, md5 in cls._RESOURCES]
    return [(cls._download_url_prefix + file, folder / file, md5)
            for file, md5 in cls._file_dict.values()]


def expected(name: str, root: Path) -> list[tuple[Path, str | None]]:
    """What torchvision reads once the archives are extracted: (path, its MD5 where known)."""
    cls, folder = torchvision_class(name), root / TORCHVISION[name][1]
    if name == "fashion-mnist":
        return [(folder / "raw" / file.removesuffix(".gz"), None) for file, _ in cls.resources]
    if name in ("cifar10", "cifar100"):
        files = [*cls.train_list, *cls.test_list, (cls.meta["filename"], cls.meta["md5"])]
        return [(folder / file, md5) for file, md5 in files]
    if name == "oxford-pets":
        return [(folder / p, None) for p in ("images", "annotations/trainval.txt",
                                             "annotations/test.txt")]
    return [(folder / "jpg", None), *[(folder / cls._file_dict[k][0], cls._file_dict[k][1])
                                      for k in ("label", "setid")]]


def missing(name: str, root: Path) -> list[Path]:
    return [path for path, _ in expected(name, root) if not path.exists()]


def _offline(name: str, root: Path) -> str:
    parts: dict[Path, list[str]] = {}
    for url, path, md5 in archives(name, root):
        parts.setdefault(path.parent, []).append(f"{path.name} (from {url}, MD5 {md5})")
    where = "; ".join(f"{', '.join(files)} in {folder}" for folder, files in parts.items())
    return f"put {where} and run with --download (the MD5s are checked)"


def how_to_get(name: str, root: Path) -> str:
    return (f"run with --download (download=True) to fetch it into {root}; offline, "
            f"{_offline(name, root)}; or give --data-dir DIR")


def not_found(name: str, root: Path, absent: list[Path]) -> DataError:
    folder = root / TORCHVISION[name][1]
    what = (f"{folder} lacks {', '.join(str(p.relative_to(folder)) for p in absent)}"
            if folder.exists() else f"no {folder}")
    return DataError(f"{name} not found: {what}; {how_to_get(name, root)}")


def explain(name: str, root: Path, exc: BaseException, downloading: bool) -> DataError:
    """The DataError for a torchvision failure: which file is corrupt, absent, or not fetched."""
    from torchvision.datasets.utils import calculate_md5

    known = [(path, md5) for _, path, md5 in archives(name, root)]
    known += [(path, md5) for path, md5 in expected(name, root) if md5]
    bad = [f"{path} (MD5 {got}, expected {md5})" for path, md5 in known
           if path.is_file() and (got := calculate_md5(path)) != md5]
    if bad:
        return DataError(f"{name}: corrupt or partial file {'; '.join(bad)}; delete it and run "
                         "again with --download")
    cause = " ".join(str(exc).split())[:400]
    if not downloading:
        absent = missing(name, root)
        return not_found(name, root, absent) if absent else DataError(
            f"{name} in {root} cannot be read ({cause}); delete {root / TORCHVISION[name][1]} "
            "and run with --download")
    files = ", ".join(p.name for _, p, _ in archives(name, root) if not p.is_file())
    where = f"{name} ({files or 'its archives'}) into {root}: {cause}"
    if isinstance(exc, OSError) and exc.errno in LOCAL_ERRNOS:
        return DataError(f"could not write {where}; the folder or its disk is at fault, not the "
                         "network: free some space, or give a --data-dir you can write to")
    return DataError(f"could not download {where}; check the network, or, offline, "
                     f"{_offline(name, root)}")


def download(name: str, data_dir=None) -> Path:
    """Fetch `name` through torchvision into its root (nothing is fetched when it is there), every
    archive's MD5 checked before it is extracted; returns the root."""
    if name not in TORCHVISION:
        raise DataError(f"{name!r} cannot be downloaded: only {', '.join(TORCHVISION)} can")
    root = root_of(data_dir)
    try:  # a folder we cannot write: said before the failure could be blamed on the network
        root.mkdir(parents=True, exist_ok=True)
        if not os.access(root, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "this user cannot write there")
    except OSError as exc:
        raise DataError(f"cannot download {name} into {root}: the folder cannot be created or "
                        f"written ({exc.strerror or exc}); give a --data-dir you can write to"
                        ) from None
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(previous or DOWNLOAD_TIMEOUT_S)  # urllib waits forever otherwise
    try:  # any split's class downloads the whole dataset
        torchvision_class(name)(str(root), download=True, **splits(name, "train")[0])
    except (RuntimeError, OSError, EOFError, tarfile.TarError, zipfile.BadZipFile) as exc:
        raise explain(name, root, exc, downloading=True) from None
    finally:
        socket.setdefaulttimeout(previous)
    return root


def require(name: str, data_dir, download_missing: bool = False) -> Path:
    """The root holding `name`'s extracted files, downloaded first if asked; cheap when they are
    there (no checksums)."""
    root = root_of(data_dir)
    if download_missing and missing(name, root):
        download(name, data_dir)
    absent = missing(name, root)
    if absent:
        raise not_found(name, root, absent)
    return root


def open_split(name: str, root: Path, kwargs: dict):
    """torchvision's dataset object for one split, its failures explained."""
    try:
        return torchvision_class(name)(str(root), download=False, **kwargs)
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        raise explain(name, root, exc, downloading=False) from None
