"""Where images come from, and the splits cut from them.

Every dataset yields `(uint8 image (C, H, W), label)` at its own size and has `targets`: the named
ones (`fashion-mnist` from its idx files, the Debian package's first; the others by torchvision),
an ImageFolder (`DIR/train/<class>/*.jpg`, `DIR/val/`) or its shards, and `synthetic` images.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import os
import zlib
from pathlib import Path

import torch
from torch.utils.data import ConcatDataset, Dataset, Subset

from vitzoo.data import named, shards
from vitzoo.data.transforms import decode_rgb, read_bytes
from vitzoo.errors import DataError
from vitzoo.options import closest

SYSTEM_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
FASHION_FILES = {f"{split}-{kind}-ubyte": magic for split in ("train", "t10k")  # -> idx magic
                 for kind, magic in (("images-idx3", 2051), ("labels-idx1", 2049))}
NAMED = ("fashion-mnist", "cifar10", "cifar100", "oxford-pets", "flowers102", "synthetic")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
STATS = {  # per-channel mean and std of the training sets (pixels in [0, 1])
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
SYNTHETIC_SIZES = {"train": 10_000, "test": 2_000}
VALIDATION_SEED = 20_210_503  # held-out images never depend on --seed or --train-limit


@dataclasses.dataclass(frozen=True)
class DataInfo:
    """What the model needs to know about a dataset."""

    name: str
    num_classes: int
    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    classes: tuple[str, ...] | None = None  # the class names in label order, where known


# ---------------------------------------------------------------------------- checks
def _idx_path(folder: Path, name: str) -> Path | None:
    candidates = (folder / f"{name}.gz", folder / name, folder / "FashionMNIST" / "raw" / name)
    return next((path for path in candidates if path.is_file()), None)


def _read_idx(path: Path) -> torch.Tensor:
    """An idx file's items as uint8, its magic number and length checked."""
    name = path.name.removesuffix(".gz")
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            data = f.read()
    except (gzip.BadGzipFile, EOFError, zlib.error):
        data = b""
    header, item = (16, 784) if "images" in name else (8, 1)
    if (int.from_bytes(data[:4], "big") != FASHION_FILES[name]
            or len(data) != header + int.from_bytes(data[4:8], "big") * item):
        raise DataError(f"{path} is truncated or not an idx file: delete it and run with "
                        "--download")
    return torch.frombuffer(bytearray(data[header:]), dtype=torch.uint8)


def _fashion_folder(data_dir, download: bool = False) -> Path:
    """The folder of the four Fashion-MNIST files (.gz or not), downloaded first if asked."""
    system = data_dir is None and SYSTEM_FASHION_MNIST.is_dir()
    folder = SYSTEM_FASHION_MNIST if system else named.root_of(data_dir)
    if download and not system and not all(_idx_path(folder, n) for n in FASHION_FILES):
        named.download("fashion-mnist", data_dir)
    absent = [name for name in FASHION_FILES if not _idx_path(folder, name)]
    if absent:
        debian = "apt-get install dataset-fashion-mnist, or " if data_dir is None else ""
        raise DataError(f"Fashion-MNIST: {folder} lacks {absent[0]}.gz; {debian}"
                        f"{named.how_to_get('fashion-mnist', named.root_of(data_dir))}")
    return folder


def _folder_split(root: Path, split: str) -> Path:
    names = ("train",) if split == "train" else ("val", "test", "validation")
    found = next((root / name for name in names if (root / name).is_dir()), None)
    if found is None:
        raise DataError(f"image folder {root} has no {' or '.join(n + '/' for n in names)} "
                        f"subdirectory; expected {root}/train/<class>/<images> and val/")
    return found


def check_folder(root: Path) -> None:
    """A DataError unless `root` is an ImageFolder tree whose every class folder holds images."""
    for split_dir in (_folder_split(root, split) for split in ("train", "test")):
        classes = [d for d in sorted(split_dir.iterdir()) if d.is_dir()]
        empty = [d for d in classes if not any(f.name.lower().endswith(IMAGE_EXTENSIONS)
                                               for f in d.iterdir())]
        if empty or not classes:
            raise DataError(f"{(empty or [split_dir])[0]} holds no images in class folders: add "
                            "them, or remove the folder")


def check_data(name: str, data_dir=None, download: bool = False) -> None:
    """A DataError unless the dataset can be read; `download`: fetch a named dataset that is not
    there through torchvision first."""
    if name == "synthetic":
        return
    if name == "fashion-mnist":
        _fashion_folder(data_dir, download)
    elif name in named.TORCHVISION:
        named.open_split(name, data_dir, named.splits(name, "test")[0], download)
    elif shards.is_shards(name):
        shards.locate(name)
    elif Path(name).is_dir():
        check_folder(Path(name))
    else:
        raise DataError(f"unknown dataset {name!r}: not one of {', '.join(NAMED)} and not a "
                        f"directory (DIR/train/<class>/..., or its shards).{closest(name, NAMED)}")


# ---------------------------------------------------------------------------- datasets
class TensorImages(Dataset):
    """Images held in memory as one uint8 tensor (N, C, H, W), with their class names if known."""

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, classes=None) -> None:
        self.images, self.targets, self.classes = images, targets.long(), classes

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.targets[index])


class FileImages(Dataset):
    """Images stored one per file: `dataset[i]` is (uint8 (3, H, W), label), `encoded(i)` (the
    file's bytes, label) for a decoder elsewhere (the device)."""

    def __init__(self, paths: list[str], targets: list[int], classes: list[str]) -> None:
        self.paths, self.classes = list(paths), list(classes)
        self.targets = torch.tensor(targets, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.paths)

    def encoded(self, index: int) -> tuple[torch.Tensor, int]:
        return read_bytes(self.paths[index]), int(self.targets[index])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        data, label = self.encoded(index)
        return decode_rgb(data), label


class FolderImages(FileImages):
    """An ImageFolder tree (`ROOT/<class>/<images>`) in torchvision's ImageFolder order (classes
    sorted, each class's folders walked in sorted order), never following a link to a folder
    above it (a loop)."""

    def __init__(self, root: Path) -> None:
        classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
        paths, targets = [], []
        for label, name in enumerate(classes):
            walked = []
            for folder, dirs, files in os.walk(os.path.join(root, name), followlinks=True):
                here = os.path.realpath(folder) + os.sep  # a subfolder this one is in: a loop
                dirs[:] = [d for d in dirs if not here.startswith(
                    os.path.realpath(os.path.join(folder, d)) + os.sep)]
                walked.append((folder, files))
            for folder, files in sorted(walked):
                paths += [os.path.join(folder, f) for f in sorted(files)
                          if f.lower().endswith(IMAGE_EXTENSIONS)]
            targets += [label] * (len(paths) - len(targets))
        super().__init__(paths, targets, classes)


class SyntheticImages(Dataset):
    """Random images whose class is visible: a smooth class template plus per-image noise. Image i
    of a split is a function of (seed, split, i); its label is i mod num_classes."""

    def __init__(self, size: int, num_classes: int, in_chans: int, img_size, seed: int,
                 split: str) -> None:
        self.size, self.num_classes, self.in_chans = size, num_classes, in_chans
        self.img_size = tuple(img_size)
        self.offset = (seed * 1_000_003 + (0 if split == "train" else 500_000_000)) % (2**62)
        coarse = torch.rand(num_classes, in_chans, 4, 4,
                            generator=torch.Generator().manual_seed(seed))
        smooth = torch.nn.functional.interpolate(coarse, size=self.img_size, mode="bilinear",
                                                 align_corners=False)
        self.templates = (smooth * 152).to(torch.uint8)  # 60% template + 40% noise, in uint8
        self.targets = torch.arange(size) % num_classes

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.offset + index)
        noise = torch.randint(0, 103, (self.in_chans, *self.img_size), generator=g,
                              dtype=torch.uint8)
        return self.templates[index % self.num_classes] + noise, index % self.num_classes


def _rgb_tensor(image) -> torch.Tensor:  # a named function: the loader's workers unpickle it
    from torchvision.transforms.v2.functional import pil_to_tensor

    return pil_to_tensor(image.convert("RGB"))


def load_split(name: str, split: str, data_dir=None, *, img_size=(28, 28), in_chans: int = 3,
               seed: int = 0, download: bool = False) -> Dataset:
    """The raw `split` ("train" or "test") of a dataset; `download`: fetch a named dataset that is
    not there first."""
    check_data(name, data_dir, download)
    if name == "synthetic":
        return SyntheticImages(SYNTHETIC_SIZES[split], 10, in_chans, img_size, seed, split)
    if name in STATS:
        return TensorImages(*_tensor_split(name, split == "train", data_dir and str(data_dir)))
    if name in named.TORCHVISION:  # Pets, Flowers: their splits one after the other
        parts = [named.open_split(name, data_dir, {**kwargs, "transform": _rgb_tensor})
                 for kwargs in named.splits(name, split)]
        joined = ConcatDataset(parts)
        joined.classes = list(parts[0].classes)
        joined.targets = torch.tensor([label for part in parts for label in part._labels])
        return joined
    if shards.is_shards(name):
        return shards.load_shards(name, split)
    return FolderImages(_folder_split(Path(name), split))


@functools.lru_cache(maxsize=8)  # read once per process: the benchmarks train many models in one
def _tensor_split(name: str, train: bool, data_dir: str | None):
    """uint8 images (N, C, H, W), labels and class names of an in-memory dataset."""
    if name == "fashion-mnist":
        from torchvision.datasets import FashionMNIST

        folder, prefix = _fashion_folder(data_dir), "train" if train else "t10k"
        images, labels = (_read_idx(_idx_path(folder, f"{prefix}-{kind}-ubyte"))
                          for kind in ("images-idx3", "labels-idx1"))
        return images.view(-1, 1, 28, 28), labels.long(), tuple(FashionMNIST.classes)
    ds = named.open_split(name, data_dir, {"train": train})  # MD5s checked here
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
    return images, torch.tensor(ds.targets), tuple(ds.classes)


def data_info(name: str, train_set: Dataset, in_chans: int = 3) -> DataInfo:
    half = (0.5,) * (in_chans if name == "synthetic" else 3)  # the paper's inputs in [-1, 1]
    if name == "synthetic":
        return DataInfo(name, train_set.num_classes, train_set.in_chans, half, half)
    if name in STATS:  # the class names too: a model trained on them can `vitzoo predict`
        mean, std = STATS[name]
        return DataInfo(name, named.TORCHVISION[name][2], len(mean), mean, std,
                        getattr(train_set, "classes", None))
    count = named.TORCHVISION[name][2] if name in named.TORCHVISION else len(train_set.classes)
    return DataInfo(name, count, 3, half, half, tuple(train_set.classes))


# ---------------------------------------------------------------------------- splits
class Picked(Subset):
    """The samples `indices` of `dataset`, labelled `targets` (a subset, or classes renumbered)."""

    def __init__(self, dataset: Dataset, indices: torch.Tensor, targets: torch.Tensor) -> None:
        super().__init__(dataset, indices.tolist())
        self.targets = targets

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.dataset[self.indices[index]][0], int(self.targets[index])

    def __getitems__(self, indices: list[int]) -> list:  # Subset's would skip our targets
        return [self[i] for i in indices]

    def encoded(self, index: int) -> tuple[torch.Tensor, int]:
        return self.dataset.encoded(self.indices[index])[0], int(self.targets[index])


def _picked(dataset: Dataset, indices: torch.Tensor) -> Picked:
    return Picked(dataset, indices, torch.as_tensor(dataset.targets)[indices])


def split_validation(dataset: Dataset, val_size: int) -> tuple[Dataset, Dataset | None]:
    """`(rest, validation)`: the first `val_size` samples of a random order seeded by
    `VALIDATION_SEED`, whatever the run's seed; `val_size=0` returns `(dataset, None)`."""
    if not val_size:
        return dataset, None
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(VALIDATION_SEED))
    return (_picked(dataset, order[val_size:].sort().values),
            _picked(dataset, order[:val_size].sort().values))


def subset(dataset: Dataset, limit: int | None, seed: int = 0) -> Dataset:
    """The first `limit` samples of a fixed random order (class-mixed), or the dataset itself."""
    if not limit or limit >= len(dataset):
        return dataset
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))
    return _picked(dataset, order[:limit].sort().values)


def keep_classes(dataset: Dataset, classes: tuple[int, ...], name: str) -> Dataset:
    """The samples of `classes`, relabelled by their place in it ((5, 6, 7) become 0-2)."""
    targets = torch.as_tensor(dataset.targets).long()
    count = int(targets.max()) + 1 if len(targets) else 0
    absent = [c for c in classes if not 0 <= c < count]
    if absent:
        raise DataError(f"classes={tuple(classes)}: {name} has classes 0-{count - 1}, not "
                        f"{', '.join(map(str, absent))}")
    relabel = torch.full((count,), -1, dtype=torch.long)
    for new, old in enumerate(classes):
        relabel[old] = new
    kept = (relabel[targets] >= 0).nonzero().flatten()
    return Picked(dataset, kept, relabel[targets[kept]])

