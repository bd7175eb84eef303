"""What an image goes through on its way to the model: decoding, augmentation, normalisation.

Datasets yield uint8 (C, H, W). Augmentation (training only) is torchvision.transforms.v2 per
sample, its randomness a function of (seed, epoch, index): the same whatever the worker count or
resume point (`Transformed`); evaluation only resizes. MixUp / CutMix act on batches
(`batch_mixer`), and `Normalizer` makes a uint8 batch on the device normalised floats.

With `--decode device` the workers hand over a JPEG's bytes and its crop and flip, drawn from its
header's size by the transforms' own `make_params` (`EncodedSamples`); the device decodes the batch
and applies them by the same transforms (`decode_batch`). On the CPU both paths give the same images
to the bit; on a GPU nvJPEG and the resize differ by rounding.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils.data import Dataset

from vitzoo.errors import DataError

# torchvision warns at every decode that its codecs are deprecated for TorchCodec's: said once in
# docs/datasets.md, not per image
warnings.filterwarnings("ignore", category=DeprecationWarning, message="The image decoding and "
                        "encoding capabilities of TorchVision are deprecated")


# ---------------------------------------------------------------------------- decoding
def read_bytes(path: str | Path) -> torch.Tensor:
    """A file's bytes as a 1-D uint8 tensor (what `torchvision.io.decode_*` takes)."""
    return torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8)


def decode_rgb(encoded: torch.Tensor) -> torch.Tensor:
    """An encoded image (1-D uint8) -> uint8 (3, H, W) RGB; PIL reads what torchvision.io does not
    (BMP, TIFF, PPM, a CMYK JPEG)."""
    from torchvision.io import ImageReadMode, decode_image

    try:
        return decode_image(encoded, mode=ImageReadMode.RGB)
    except RuntimeError:
        from PIL import Image
        from torchvision.transforms.v2 import functional as TF

        with Image.open(io.BytesIO(encoded.numpy().tobytes())) as image:
            return TF.pil_to_tensor(image.convert("RGB"))


# ---------------------------------------------------------------------------- augmentation
@dataclass(frozen=True)
class Augment:
    """Training augmentation (all off by default)."""

    random_resized_crop: float = 0.0  # > 0: RandomResizedCrop with scale (this, 1)
    crop_padding: int = 0  # > 0: RandomCrop of the image size after zero padding by this much
    hflip: bool = False
    randaugment: int = 0  # > 0: RandAugment(num_ops=2, magnitude=this)
    mixup: float = 0.0  # MixUp alpha (batch level)
    cutmix: float = 0.0  # CutMix alpha (batch level)


class Resize(torch.nn.Module):
    """v2.Resize, or nothing when the image has the size already."""

    def __init__(self, size: tuple[int, int]) -> None:
        super().__init__()
        from torchvision.transforms import v2

        self.size = tuple(size)
        self.resize = v2.Resize(self.size, antialias=True)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return image if tuple(image.shape[-2:]) == self.size else self.resize(image)


def build_transform(img_size: tuple[int, int], augment: Augment | None) -> Callable:
    """uint8 (C, H, W) -> uint8 (C, *img_size); `augment=None` for evaluation."""
    from torchvision.transforms import v2

    if augment is not None and augment.random_resized_crop > 0:
        ops: list[Any] = [v2.RandomResizedCrop(img_size, scale=(augment.random_resized_crop, 1.0),
                                               antialias=True)]
    else:
        ops = [Resize(img_size)]
    if augment is not None:
        if augment.crop_padding:
            ops.append(v2.RandomCrop(img_size, padding=augment.crop_padding))
        if augment.hflip:
            ops.append(v2.RandomHorizontalFlip())
        if augment.randaugment:
            ops.append(v2.RandAugment(num_ops=2, magnitude=augment.randaugment))
    return v2.Compose(ops)


def batch_mixer(augment: Augment, num_classes: int):
    """MixUp and/or CutMix on (images, labels) batches (one of them chosen per batch), or None."""
    from torchvision.transforms import v2

    mixers = []
    if augment.mixup > 0:
        mixers.append(v2.MixUp(alpha=augment.mixup, num_classes=num_classes))
    if augment.cutmix > 0:
        mixers.append(v2.CutMix(alpha=augment.cutmix, num_classes=num_classes))
    if not mixers:
        return None
    return mixers[0] if len(mixers) == 1 else v2.RandomChoice(mixers)


@contextlib.contextmanager
def sample_rng(seed: int, epoch: int, index: int) -> Iterator[None]:
    """The global torch generator seeded from (seed, epoch, index) alone, restored afterwards."""
    state = torch.get_rng_state()
    torch.default_generator.manual_seed(hash((seed, epoch, index)) % (2**63))
    try:
        yield
    finally:
        torch.set_rng_state(state)


class Transformed(Dataset):
    """A raw dataset with a per-sample transform, indexed by an int (evaluation: no randomness) or
    by the training sampler's key `(epoch, index)`, which seeds the transform (`sample_rng`)."""

    def __init__(self, base: Dataset, transform: Callable, seed: int = 0) -> None:
        self.base, self.transform, self.seed = base, transform, seed
        self.targets = base.targets

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key) -> tuple[torch.Tensor, int]:
        image, label = self.base[key[1] if isinstance(key, tuple) else key]
        return self.transform_sample(image, key), label

    def transform_sample(self, image: torch.Tensor, key) -> torch.Tensor:
        """The transform of sample `key`'s decoded image (seeded for a key `(epoch, index)`)."""
        seeded = sample_rng(self.seed, *key) if isinstance(key, tuple) else contextlib.nullcontext()
        with seeded:
            return self.transform(image)


# ---------------------------------------------------------------------------- normalisation
class Normalizer:
    """uint8 (B, C, H, W) on `device` -> normalised float; gray becomes `in_chans` channels. The
    mean and std are made once (per batch, each would be a copy that waits for the device)."""

    def __init__(self, mean, std, in_chans: int, device: torch.device | str,
                 dtype: torch.dtype = torch.float32) -> None:
        self.in_chans, self.dtype = in_chans, dtype
        self.mean = torch.tensor(mean, device=device, dtype=dtype).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=device, dtype=dtype).view(1, -1, 1, 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.dtype).div_(255)
        if x.shape[1] != self.in_chans:
            if x.shape[1] == 1:
                x = x.expand(-1, self.in_chans, -1, -1)
            elif self.in_chans == 1:
                x = x.mean(dim=1, keepdim=True)
            else:
                raise DataError(f"images have {x.shape[1]} channels but the model takes "
                                f"in_chans={self.in_chans}")
        return (x - self.mean) / self.std


def normalize(images: torch.Tensor, mean, std, in_chans: int,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 (B, C, H, W) on any device -> normalised float (one batch)."""
    return Normalizer(mean, std, in_chans, images.device, dtype)(images)


# ---------------------------------------------------------------------------- decoded on the device
# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic): they hold the size
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# a row of a batch's `steps`: decoded in the worker (1) or to decode on the device (0), the crop's
# top, left, height, width (-1: no crop, the whole image resized), and whether to flip
DECODED, TOP, LEFT, HEIGHT, WIDTH, FLIP = range(6)


def jpeg_size(encoded: torch.Tensor) -> tuple[int, int] | None:
    """(height, width) from a JPEG's frame header, or None for anything but a readable JPEG."""
    data = memoryview(encoded.numpy())
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    i = 2
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
        elif marker in _SOF:
            if i + 9 > n:
                return None
            height, width = (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8]
            return (height, width) if height and width else None
        else:
            i += 2 + ((data[i + 2] << 8) | data[i + 3])
    return None


class EncodedView(Dataset):
    """`view[i]`: (the encoded bytes, label) of sample i of `dataset`, read from the dataset below
    it that has `encoded(i)`, through the wrappers that pick samples (anything with `dataset` and
    `indices`: `Subset`, `KeptClasses`); the label is `dataset`'s own. Picklable."""

    def __init__(self, dataset: Dataset) -> None:
        leaf, order = dataset, None
        while not callable(getattr(leaf, "encoded", None)):
            if not (hasattr(leaf, "dataset") and hasattr(leaf, "indices")):
                raise TypeError(f"{type(dataset).__name__} holds no encoded images")
            picked = torch.as_tensor(leaf.indices, dtype=torch.long)
            order = picked if order is None else picked[order]
            leaf = leaf.dataset
        self.leaf, self.order = leaf, order
        targets = getattr(dataset, "targets", None)
        self.targets = None if targets is None else torch.as_tensor(targets).long()
        self.size = len(dataset)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        data, label = self.leaf.encoded(index if self.order is None else int(self.order[index]))
        return data, (label if self.targets is None else int(self.targets[index]))


def encoded_view(dataset: Dataset) -> EncodedView | None:
    """The encoded images of `dataset`, or None when it holds none (tensors in memory)."""
    try:
        return EncodedView(dataset)
    except TypeError:
        return None


class DeviceOps(NamedTuple):
    """The steps of a transform the device applies: a crop or a resize, then a flip (or None)."""

    crop: Any  # v2.RandomResizedCrop, or None
    resize: Any  # `Resize` to the model's size, used when there is no crop
    flip: Any  # v2.RandomHorizontalFlip, or None
    size: tuple[int, int]


def device_ops(transform: Callable) -> DeviceOps | None:
    """`transform` (a `build_transform`) as steps the device applies, or None when a step of it only
    the workers apply (a padded random crop, RandAugment)."""
    from torchvision.transforms import v2

    steps = list(getattr(transform, "transforms", [transform]))
    crop = resize = flip = None
    if steps and isinstance(steps[0], v2.RandomResizedCrop):
        crop = steps.pop(0)
    elif steps and isinstance(steps[0], Resize):
        resize = steps.pop(0)
    if steps and isinstance(steps[0], v2.RandomHorizontalFlip):
        flip = steps.pop(0)
    if steps or (crop is None and resize is None):
        return None
    return DeviceOps(crop, resize, flip, tuple(crop.size if crop is not None else resize.size))


def draw_steps(ops: DeviceOps, height: int, width: int) -> list[int]:
    """One sample's crop and flip for an image of (height, width), drawn from the global generator
    as the transforms draw them (the crop's `make_params`, then the flip's `torch.rand(1) < p`)."""
    top = left = crop_h = crop_w = -1
    if ops.crop is not None:
        stand_in = torch.zeros((), dtype=torch.uint8).expand(3, height, width)  # its size counts
        params = ops.crop.make_params([stand_in])
        top, left, crop_h, crop_w = (int(params[k]) for k in ("top", "left", "height", "width"))
    flip = ops.flip is not None and bool(torch.rand(1) < ops.flip.p)
    return [0, top, left, crop_h, crop_w, int(flip)]


def apply_steps(ops: DeviceOps, image: torch.Tensor, row: list[int]) -> torch.Tensor:
    """A decoded uint8 (3, H, W) image, on any device, cropped, resized and flipped as `row` says,
    by the transforms' own kernels."""
    if row[TOP] >= 0:
        box = {"top": row[TOP], "left": row[LEFT], "height": row[HEIGHT], "width": row[WIDTH]}
        image = ops.crop.transform(image, box)
    else:
        image = ops.resize(image)
    return ops.flip.transform(image, {}) if row[FLIP] else image


class EncodedSamples(Dataset):
    """A loader worker's dataset when the device decodes: sample `key` (an int, or `(epoch, index)`)
    is (the JPEG's bytes, label, its steps); a sample that is not a JPEG is decoded and transformed
    here and comes as the finished uint8 image (its steps' DECODED entry says so)."""

    def __init__(self, transformed: Transformed, ops: DeviceOps) -> None:
        self.view, self.transformed, self.ops = EncodedView(transformed.base), transformed, ops
        self.targets = transformed.targets

    def __len__(self) -> int:
        return len(self.view)

    def __getitem__(self, key) -> tuple[torch.Tensor, int, list[int]]:
        epoch, index = key if isinstance(key, tuple) else (None, key)
        data, label = self.view[index]
        size = jpeg_size(data)
        if size is None:
            image = self.transformed.transform_sample(decode_rgb(data), key)
            return image, label, [1, -1, -1, -1, -1, 0]
        seed = self.transformed.seed
        with sample_rng(seed, epoch, index) if epoch is not None else contextlib.nullcontext():
            return data, label, draw_steps(self.ops, *size)


class EncodedBatch(NamedTuple):
    payloads: list[torch.Tensor]  # a JPEG's bytes, or a finished uint8 image (steps[i, DECODED])
    labels: torch.Tensor
    steps: torch.Tensor  # (B, 6) int64, rows of `draw_steps`


def collate_encoded(samples: list[tuple[torch.Tensor, int, list[int]]]) -> EncodedBatch:
    payloads, labels, steps = zip(*samples)
    return EncodedBatch(list(payloads), torch.tensor(labels, dtype=torch.long),
                        torch.tensor(steps, dtype=torch.long))


def decode_jpegs(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """uint8 (3, H, W) RGB images on `device`, the JPEGs decoded in one call (nvJPEG's batched
    decoder on CUDA); where it refuses one, each alone, those it refuses by `decode_rgb`."""
    from torchvision.io import ImageReadMode, decode_jpeg

    if not encoded:
        return []
    on = device if device.type == "cuda" else "cpu"
    try:
        images = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=on)
    except RuntimeError:
        images = []
        for data in encoded:
            try:
                images.append(decode_jpeg(data, mode=ImageReadMode.RGB, device=on))
            except RuntimeError:
                images.append(decode_rgb(data))
    return [image.to(device, non_blocking=True) for image in images]


def decode_batch(batch: EncodedBatch, ops: DeviceOps,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 images (B, 3, *ops.size) on `device`, labels on the host) of an encoded batch."""
    rows = batch.steps.tolist()
    to_decode = [i for i, row in enumerate(rows) if not row[DECODED]]
    images = torch.empty((len(rows), 3, *ops.size), dtype=torch.uint8, device=device)
    for i, image in zip(to_decode, decode_jpegs([batch.payloads[i] for i in to_decode], device)):
        images[i] = apply_steps(ops, image, rows[i])
    for i, row in enumerate(rows):
        if row[DECODED]:
            images[i] = batch.payloads[i].to(device, non_blocking=True)
    return images, batch.labels
