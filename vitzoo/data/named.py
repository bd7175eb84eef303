"""The named datasets torchvision reads and downloads: where their files go, what each archive must
hash to, and the errors when they are missing, corrupt or cannot be fetched.

Downloads go through torchvision's dataset classes (`download=True`: fetch, check the MD5, extract),
the URLs and checksums read from those classes. The root is `--data-dir`, or $VITZOO_CACHE/datasets
(default ~/.cache/vitzoo/datasets). Offline, an archive put by hand where torchvision would have
downloaded it is found, verified and extracted by `--download` without the network.

The transfer datasets of the paper's Tables 2 and 5: `oxford-pets` (37 classes; "train" is
torchvision's `trainval`, "test" its `test`) and `flowers102` (102 classes; "train" is `train` +
`val`, the labelled images the transfer setup trains on; "test" is `test`).
"""

from __future__ import annotations

import errno
import gzip
import os
import socket
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from vitzoo.errors import DataError
from vitzoo.io import cache_dir

# vitzoo's name -> the torchvision class, its folder under the root, classes, and the torchvision
# splits that make vitzoo's "train" and "test" (kwargs of the class)
TORCHVISION = {
    "fashion-mnist": ("FashionMNIST", "FashionMNIST", 10, ({"train": True},), ({"train": False},)),
    "cifar10": ("CIFAR10", "cifar-10-batches-py", 10, ({"train": True},), ({"train": False},)),
    "cifar100": ("CIFAR100", "cifar-100-python", 100, ({"train": True},), ({"train": False},)),
    "oxford-pets": ("OxfordIIITPet", "oxford-iiit-pet", 37, ({"split": "trainval"},),
                    ({"split": "test"},)),
    "flowers102": ("Flowers102", "flowers-102", 102, ({"split": "train"}, {"split": "val"}),
                   ({"split": "test"},)),
}
DOWNLOAD_TIMEOUT_S = 60  # per network read: a silent mirror ends the download instead of hanging it
# failures of the local folder or disk, said as such (a download's others are the network's)
LOCAL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR,
                errno.EEXIST, errno.EISDIR}


def root_of(data_dir: str | os.PathLike | None) -> Path:
    """The folder torchvision reads a named dataset from and downloads it into."""
    return Path(data_dir) if data_dir else cache_dir() / "datasets"


def torchvision_class(name: str):
    import torchvision.datasets

    return getattr(torchvision.datasets, TORCHVISION[name][0])


def splits(name: str, split: str) -> tuple[dict, ...]:
    """The torchvision split arguments that make vitzoo's `split` ("train" or "test")."""
    return TORCHVISION[name][3 if split == "train" else 4]


@dataclass(frozen=True)
class Archive:
    url: str
    folder: Path  # where torchvision downloads it to, and where to put it by hand
    filename: str
    md5: str

    @property
    def path(self) -> Path:
        return self.folder / self.filename


def archives(name: str, root: Path) -> list[Archive]:
    """The files torchvision downloads for `name`, read from its class (URLs, MD5s, folders)."""
    cls = torchvision_class(name)
    if name == "fashion-mnist":
        raw = root / "FashionMNIST" / "raw"
        return [Archive(cls.mirrors[0] + file, raw, file, md5) for file, md5 in cls.resources]
    if name in ("cifar10", "cifar100"):
        return [Archive(cls.url, root, cls.filename, cls.tgz_md5)]
    if name == "oxford-pets":
        return [Archive(url, root / "oxford-iiit-pet", url.rsplit("/", 1)[-1], md5)
                for url, md5 in cls._RESOURCES]
    return [Archive(cls._download_url_prefix + file, root / "flowers-102", file, md5)
            for file, md5 in cls._file_dict.values()]


def expected(name: str, root: Path) -> list[tuple[Path, str | None]]:
    """What torchvision reads once the archives are extracted: (path, its MD5 where known)."""
    cls = torchvision_class(name)
    folder = root / TORCHVISION[name][1]
    if name == "fashion-mnist":
        return [(folder / "raw" / file.removesuffix(".gz"), None) for file, _ in cls.resources]
    if name in ("cifar10", "cifar100"):
        files = [*cls.train_list, *cls.test_list, (cls.meta["filename"], cls.meta["md5"])]
        return [(folder / file, md5) for file, md5 in files]
    if name == "oxford-pets":
        return [(folder / "images", None), (folder / "annotations" / "trainval.txt", None),
                (folder / "annotations" / "test.txt", None)]
    return [(folder / "jpg", None), *[(folder / cls._file_dict[k][0], cls._file_dict[k][1])
                                      for k in ("label", "setid")]]


def missing(name: str, root: Path) -> list[Path]:
    return [path for path, _ in expected(name, root) if not path.exists()]


def corrupt(name: str, root: Path) -> list[str]:
    """'PATH (MD5 x, expected y)' for every archive or extracted file whose MD5 is wrong."""
    from torchvision.datasets.utils import calculate_md5

    known = [(a.path, a.md5) for a in archives(name, root)]
    known += [(path, md5) for path, md5 in expected(name, root) if md5]
    return [f"{path} (MD5 {got}, expected {md5})" for path, md5 in known
            if path.is_file() and (got := calculate_md5(path)) != md5]


def _offline(name: str, root: Path) -> str:
    parts: dict[Path, list[str]] = {}
    for a in archives(name, root):
        parts.setdefault(a.folder, []).append(f"{a.filename} (from {a.url}, MD5 {a.md5})")
    where = "; ".join(f"{', '.join(files)} in {folder}" for folder, files in parts.items())
    return (f"put {where} and run with --download: torchvision verifies the MD5s and extracts them "
            "without the network")


def how_to_get(name: str, root: Path) -> str:
    """The sentence that says how to fetch `name` into `root`, online or offline."""
    return (f"run with --download (download=True in Python) to fetch it through torchvision into "
            f"{root}; offline, {_offline(name, root)}; --data-dir DIR reads another folder")


def not_found(name: str, root: Path, absent: list[Path]) -> DataError:
    folder = root / TORCHVISION[name][1]
    what = (f"no {folder}" if not folder.exists()
            else f"{folder} lacks {', '.join(str(p.relative_to(folder)) for p in absent)}")
    return DataError(f"{name} not found: {what}; {how_to_get(name, root)}")


def explain(name: str, root: Path, exc: BaseException, downloading: bool) -> DataError:
    """The DataError for a torchvision failure: which file is corrupt, or could not be fetched."""
    bad = corrupt(name, root)
    if bad:
        return DataError(f"{name}: corrupt or partial file{'s' if len(bad) > 1 else ''} "
                         f"{'; '.join(bad)} (an interrupted or altered download, or another file "
                         "under that name); delete it and run again with --download "
                         "(download=True) to fetch it anew")
    cause = " ".join(str(exc).split())[:400]
    if not downloading:
        absent = missing(name, root)
        if absent:
            return not_found(name, root, absent)
        return DataError(f"{name} in {root} cannot be read ({cause}); delete "
                         f"{root / TORCHVISION[name][1]} and run with --download (download=True) "
                         "to fetch it anew")
    files = ", ".join(a.path.name for a in archives(name, root) if not a.path.is_file())
    files = files or "its archives"
    if isinstance(exc, OSError) and exc.errno in LOCAL_ERRNOS:
        return DataError(f"could not write {name} ({files}) into {root}: {cause}; the folder or "
                         "its disk is at fault, not the network: free some space, or give a "
                         "--data-dir you can write to")
    return DataError(f"could not download {name} ({files}) into {root}: {cause}; check the network "
                     f"and run again, or, offline, {_offline(name, root)}")


def check_writable(name: str, root: Path) -> None:
    """A DataError, before anything is fetched, unless `root` is (or can be made) a folder this
    process writes into (else the failure would be blamed on the network)."""
    if root.exists() and not root.is_dir():
        raise DataError(f"cannot download {name} into {root}: it is a file, not a folder; give a "
                        "folder as --data-dir (it is created if missing)")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot download {name} into {root}: the folder cannot be created "
                        f"({exc.strerror or exc}); give a --data-dir you can write to") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise DataError(f"cannot download {name} into {root}: this user cannot write there; give a "
                        "--data-dir you can write to")


def download(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """Fetch `name` through torchvision into its root (nothing is fetched when it is there) and
    return the root; every archive's MD5 is checked before it is extracted."""
    if name not in TORCHVISION:
        raise DataError(f"{name!r} cannot be downloaded: only {', '.join(TORCHVISION)} can")
    root = root_of(data_dir)
    check_writable(name, root)
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(previous or DOWNLOAD_TIMEOUT_S)  # urllib waits forever otherwise
    try:  # any split's class downloads the whole dataset
        torchvision_class(name)(str(root), download=True, **splits(name, "train")[0])
    except (RuntimeError, OSError, EOFError, tarfile.TarError, zipfile.BadZipFile,
            gzip.BadGzipFile) as exc:
        raise explain(name, root, exc, downloading=True) from None
    finally:
        socket.setdefaulttimeout(previous)
    return root


def require(name: str, data_dir: str | os.PathLike | None, download_missing: bool = False) -> Path:
    """The root holding `name`'s extracted files, downloaded first if asked; a DataError naming the
    files and the folder otherwise. Cheap when the files are there (no checksums)."""
    root = root_of(data_dir)
    if missing(name, root) and download_missing:
        download(name, data_dir)
    absent = missing(name, root)
    if absent:
        raise not_found(name, root, absent)
    return root


def open_split(name: str, root: Path, kwargs: dict):
    """torchvision's dataset object for one split, its failures translated."""
    try:
        return torchvision_class(name)(str(root), download=False, **kwargs)
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        raise explain(name, root, exc, downloading=False) from None
