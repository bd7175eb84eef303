"""Where images come from, read through torchvision, and the splits cut from them.

Each dataset yields `(uint8 image (C, H, W), label)` at its own resolution. The names:
`fashion-mnist` (the Debian package dataset-fashion-mnist, else `--data-dir`, else the cache,
$VITZOO_CACHE/datasets, where `--download` puts it); `cifar10`, `cifar100`, `oxford-pets`,
`flowers102` (torchvision's classes on `--data-dir` or the cache: vitzoo.data.named); a directory in
ImageFolder layout (`DIR/train/<class>/*.jpg`, `DIR/val/...` or `test/`); its WebDataset shards
(vitzoo.data.shards); `synthetic`: random images with a learnable class pattern, from the seed.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import ConcatDataset, Dataset, Subset

from vitzoo.data import named, shards
from vitzoo.data.transforms import decode_rgb, read_bytes
from vitzoo.errors import DataError
from vitzoo.options import closest

SYSTEM_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
FASHION_FILES = {  # file -> the idx magic number it must start with
    "train-images-idx3-ubyte": 2051,
    "train-labels-idx1-ubyte": 2049,
    "t10k-images-idx3-ubyte": 2051,
    "t10k-labels-idx1-ubyte": 2049,
}
NAMED = ("fashion-mnist", "cifar10", "cifar100", "oxford-pets", "flowers102", "synthetic")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# Per-channel statistics of the training sets (pixels in [0, 1]); recorded in the model config.
STATS = {
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
SYNTHETIC_SIZES = {"train": 10_000, "test": 2_000}
# The validation split's own seed, the same for every run: the held-out images never depend on
# --seed or --train-limit, so runs that differ only in those are validated on the same images.
VALIDATION_SEED = 20_210_503


@dataclass(frozen=True)
class DataInfo:
    """What the model needs to know about a dataset."""

    name: str
    num_classes: int
    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    classes: tuple[str, ...] | None = None  # the class names in label order, where known


# ---------------------------------------------------------------------------- checks
def _fashion_file(folder: Path, name: str) -> Path | None:
    candidates = [folder / f"{name}.gz", folder / name, folder / "FashionMNIST" / "raw" / name]
    return next((p for p in candidates if p.is_file()), None)


def _read_idx(path: Path, size: int = -1) -> bytes:
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
        return f.read(size)


def _fashion_source(data_dir: str | os.PathLike | None, download: bool = False) -> Path:
    """The folder holding the four Fashion-MNIST files (.gz or not), downloaded if asked."""
    if data_dir is None and SYSTEM_FASHION_MNIST.is_dir():
        folder = SYSTEM_FASHION_MNIST
    else:
        folder = named.root_of(data_dir)
        if download and not all(_fashion_file(folder, name) for name in FASHION_FILES):
            named.download("fashion-mnist", data_dir)
    if not folder.is_dir():
        hint = ("install it with `sudo apt-get install dataset-fashion-mnist`, pass --data-dir "
                "DIR, or " if data_dir is None else "pass a folder holding the four *-ubyte.gz "
                "files, or ")
        raise DataError(f"Fashion-MNIST not found: {folder} is not a directory; {hint}"
                        f"{named.how_to_get('fashion-mnist', folder)}")
    for name, magic in FASHION_FILES.items():
        path = _fashion_file(folder, name)
        if path is None:
            raise DataError(f"Fashion-MNIST in {folder} is incomplete: no {name}.gz (expected the "
                            f"four files {', '.join(f + '.gz' for f in FASHION_FILES)} there or in "
                            f"FashionMNIST/raw/); {named.how_to_get('fashion-mnist', folder)}")
        try:
            head = _read_idx(path, 4)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise DataError(f"Fashion-MNIST file {path} is unreadable or not gzip: {exc}") from None
        if len(head) < 4:
            raise DataError(f"{path} is truncated (no idx header)")
        if int.from_bytes(head, "big") != magic:
            raise DataError(f"Fashion-MNIST file {path} is malformed: idx magic "
                            f"{int.from_bytes(head, 'big')}, expected {magic}")
    return folder


def _folder_split(root: Path, split: str) -> Path:
    names = ("train",) if split == "train" else ("val", "test", "validation")
    for name in names:
        if (root / name).is_dir():
            return root / name
    raise DataError(f"image folder {root} has no {' or '.join(n + '/' for n in names)} "
                    f"subdirectory; expected {root}/train/<class>/<images> and "
                    f"{root}/val/<class>/<images>")


def _check_image_folder(split_dir: Path) -> None:
    classes = sorted(d for d in split_dir.iterdir() if d.is_dir())
    if not classes:
        raise DataError(f"{split_dir} has no class subdirectories (expected "
                        f"{split_dir}/<class>/<images>)")
    for d in classes:
        if not any(f.suffix.lower() in IMAGE_EXTENSIONS for f in d.iterdir()):
            raise DataError(f"class folder {d} holds no images ({', '.join(IMAGE_EXTENSIONS)}): "
                            "add its images, or remove the folder")


def check_data(name: str, data_dir: str | os.PathLike | None = None,
               download: bool = False) -> None:
    """A clear `DataError` if the dataset cannot be read; cheap (reads headers only). `download`:
    fetch a named dataset that is not there through torchvision first (vitzoo.data.named)."""
    if name == "synthetic":
        return
    if name == "fashion-mnist":
        _fashion_source(data_dir, download)
    elif name in named.TORCHVISION:
        named.require(name, data_dir, download)
    elif shards.is_shards(name):
        shards.locate(name)
    elif not Path(name).is_dir():
        raise DataError(f"unknown dataset {name!r}: not one of {', '.join(NAMED)} and not a "
                        "directory (an ImageFolder tree DIR/train/<class>/..., "
                        f"DIR/val/<class>/..., or its shards).{closest(name, NAMED)}")
    else:
        for split in ("train", "test"):
            _check_image_folder(_folder_split(Path(name), split))


# ---------------------------------------------------------------------------- raw datasets
class TensorImages(Dataset):
    """Images held in memory as one uint8 tensor (N, C, H, W); `classes`: their names in label
    order, where known (a model trained on it saves them, and `vitzoo predict` names by them)."""

    def __init__(self, images: torch.Tensor, targets: torch.Tensor,
                 classes: tuple[str, ...] | None = None) -> None:
        self.images = images
        self.targets = targets.long()
        self.classes = classes

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.targets[index])


class FileImages(Dataset):
    """Images stored one per file, with their labels: `dataset[i]` is (uint8 (3, H, W), label),
    `encoded(i)` (the file's bytes, label), for a decoder elsewhere (a GPU)."""

    def __init__(self, paths: list[str], targets: list[int], classes: list[str]) -> None:
        self.paths = list(paths)
        self.targets = torch.tensor(targets, dtype=torch.long)
        self.classes = list(classes)

    def __len__(self) -> int:
        return len(self.paths)

    def encoded(self, index: int) -> tuple[torch.Tensor, int]:
        return read_bytes(self.paths[index]), int(self.targets[index])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        data, label = self.encoded(index)
        return decode_rgb(data), label


class FolderImages(FileImages):
    """An ImageFolder tree (`ROOT/<class>/<image>`), listed by torchvision's `ImageFolder` (its
    class order and extensions)."""

    def __init__(self, root: Path) -> None:
        from torchvision.datasets import ImageFolder

        folder = ImageFolder(str(root), loader=lambda path: path)  # a listing: nothing is opened
        super().__init__([path for path, _ in folder.samples], folder.targets, folder.classes)


class TorchvisionImages(Dataset):
    """The splits of a torchvision dataset of image files (Pets, Flowers), one after the other,
    decoded to uint8 tensors (C, H, W) at their own sizes."""

    def __init__(self, parts: list) -> None:
        self.parts = ConcatDataset(parts)
        # the labels without decoding an image: torchvision keeps them in `_labels`
        self.targets = torch.tensor([label for part in parts for label in part._labels])
        self.classes = list(parts[0].classes)

    def __len__(self) -> int:
        return len(self.parts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from torchvision.transforms.v2 import functional as TF

        image, label = self.parts[index]
        return TF.pil_to_tensor(image.convert("RGB")), label


class SyntheticImages(Dataset):
    """Random images whose class is visible: a smooth class template plus per-image noise. Image i
    of a split is a function of (seed, split, i); its label is i mod num_classes."""

    def __init__(self, size: int, num_classes: int, in_chans: int, img_size: tuple[int, int],
                 seed: int, split: str) -> None:
        self.size, self.num_classes, self.in_chans = size, num_classes, in_chans
        self.img_size = tuple(img_size)
        self.offset = (seed * 1_000_003 + (0 if split == "train" else 500_000_000)) % (2**62)
        g = torch.Generator().manual_seed(seed)
        coarse = torch.rand(num_classes, in_chans, 4, 4, generator=g)
        smooth = torch.nn.functional.interpolate(coarse, size=self.img_size, mode="bilinear",
                                                 align_corners=False)
        self.templates = (smooth * 152).to(torch.uint8)  # 60% template + 40% noise, in uint8
        self.targets = torch.arange(size) % num_classes

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        label = index % self.num_classes
        g = torch.Generator().manual_seed(self.offset + index)
        noise = torch.randint(0, 103, (self.in_chans, *self.img_size), generator=g,
                              dtype=torch.uint8)
        return self.templates[label] + noise, label


def load_split(name: str, split: str, data_dir=None, *, img_size=(28, 28), in_chans: int = 3,
               seed: int = 0, download: bool = False) -> Dataset:
    """The raw `split` ("train" or "test") of a dataset, as uint8 tensors with a `.targets` tensor;
    `download`: fetch a named dataset that is not there first (checksums verified)."""
    check_data(name, data_dir, download)
    if name == "synthetic":
        return SyntheticImages(SYNTHETIC_SIZES[split], 10, in_chans, img_size, seed, split)
    if name in ("fashion-mnist", "cifar10", "cifar100"):
        folder = str(data_dir) if data_dir else None
        return TensorImages(*_tensor_split(name, split == "train", folder))
    if name in named.TORCHVISION:
        root = named.root_of(data_dir)
        return TorchvisionImages([named.open_split(name, root, kwargs)
                                  for kwargs in named.splits(name, split)])
    if shards.is_shards(name):
        return shards.load_shards(name, split)
    return FolderImages(_folder_split(Path(name), split))


@functools.lru_cache(maxsize=8)
def _tensor_split(name: str, train: bool, data_dir: str | None):
    """uint8 images (N, C, H, W), labels and class names of an in-memory dataset, read once per
    process (callers that train many small models in one process do not re-read the files)."""
    if name == "fashion-mnist":
        from torchvision.datasets import FashionMNIST

        folder, prefix = _fashion_source(data_dir), "train" if train else "t10k"
        parts = []
        for kind, header, shape in (("images-idx3", 16, (1, 28, 28)), ("labels-idx1", 8, ())):
            path = _fashion_file(folder, f"{prefix}-{kind}-ubyte")
            data = _read_idx(path)
            count = int.from_bytes(data[4:8], "big")
            if len(data) != header + count * (784 if shape else 1):
                raise DataError(f"Fashion-MNIST file {path} is truncated or altered: its header "
                                f"counts {count} items, its size does not; delete it and run with "
                                "--download")
            parts.append(torch.frombuffer(bytearray(data[header:]), dtype=torch.uint8)
                         .view(count, *shape))
        return parts[0], parts[1].long(), tuple(FashionMNIST.classes)
    # torchvision checks every batch file's MD5 here; a failure names the corrupt one
    ds = named.open_split(name, named.root_of(data_dir), {"train": train})
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
    return images, torch.tensor(ds.targets), tuple(ds.classes)


def data_info(name: str, train_set: Dataset, in_chans: int = 3) -> DataInfo:
    half = (0.5, 0.5, 0.5)  # the paper's models' normalisation, where no statistics are recorded
    if name == "synthetic":
        return DataInfo(name, train_set.num_classes, train_set.in_chans, (0.5,) * in_chans,
                        (0.5,) * in_chans)
    if name in STATS:  # the class names too: a model trained on them can `vitzoo predict`
        mean, std = STATS[name]
        return DataInfo(name, named.TORCHVISION[name][2], len(mean), mean, std,
                        getattr(train_set, "classes", None))
    count = named.TORCHVISION[name][2] if name in named.TORCHVISION else len(train_set.classes)
    return DataInfo(name, count, 3, half, half, tuple(train_set.classes))


# ---------------------------------------------------------------------------- splits
def _subset(dataset: Dataset, indices: torch.Tensor) -> Subset:
    part = Subset(dataset, indices.tolist())
    part.targets = dataset.targets[indices]
    return part


def split_validation(dataset: Dataset, val_size: int) -> tuple[Dataset, Dataset | None]:
    """`(rest, validation)`: the first `val_size` samples of a random order seeded by the constant
    `VALIDATION_SEED` held out, the same whatever the run's seed. Subset the rest afterwards
    (`subset(rest, limit, seed)`): the training subsets of one seed are then nested and never touch
    the validation set. `val_size=0` returns `(dataset, None)`."""
    if not val_size:
        return dataset, None
    if not 0 < val_size < len(dataset):
        raise ValueError(f"val_size={val_size} must be between 1 and {len(dataset) - 1} (the "
                         f"training split has {len(dataset)} images)")
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(VALIDATION_SEED))
    return (_subset(dataset, order[val_size:].sort().values),
            _subset(dataset, order[:val_size].sort().values))


def subset(dataset: Dataset, limit: int | None, seed: int = 0) -> Dataset:
    """The first `limit` samples of a fixed random order (class-mixed), or the dataset itself."""
    if not limit or limit >= len(dataset):
        return dataset
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))
    return _subset(dataset, order[:limit].sort().values)


class KeptClasses(Dataset):
    """The samples of `dataset` whose class is one of `classes`, relabelled by their place in
    `classes` ((5, 6, 7, 8, 9) become 0-4), as the transfer benchmark pre-trains on one half of a
    dataset's classes and transfers to the other."""

    def __init__(self, dataset: Dataset, classes: tuple[int, ...]) -> None:
        targets = torch.as_tensor(dataset.targets).long()
        relabel = torch.full((int(targets.max()) + 1,), -1, dtype=torch.long)
        for new, old in enumerate(classes):
            if old < len(relabel):
                relabel[old] = new
        kept = relabel[targets] >= 0
        self.dataset, self.indices = dataset, kept.nonzero().flatten().tolist()
        self.targets = relabel[targets[kept]]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.dataset[self.indices[index]][0], int(self.targets[index])


def keep_classes(dataset: Dataset, classes: tuple[int, ...], name: str) -> Dataset:
    """`dataset` restricted to `classes`; a DataError names a class it does not have."""
    count = int(torch.as_tensor(dataset.targets).max()) + 1 if len(dataset) else 0
    absent = [c for c in classes if not 0 <= c < count]
    if absent:
        raise DataError(f"classes={tuple(classes)}: {name} has classes 0-{count - 1}, not "
                        f"{', '.join(map(str, absent))}")
    return KeptClasses(dataset, tuple(classes))


def classes_kept(info: DataInfo, classes: tuple[int, ...]) -> DataInfo:
    """The dataset's facts once restricted to `classes`: their number, their names in order."""
    names = tuple(info.classes[c] for c in classes) if info.classes else None
    return dataclasses.replace(info, num_classes=len(classes), classes=names)
