"""What an image goes through on its way to the model: decoding, augmentation, normalisation.

Datasets yield uint8 (C, H, W). Training augmentation is torchvision.transforms.v2 per sample, its
randomness a function of (seed, epoch, index) alone (`Transformed`); evaluation only resizes.
MixUp / CutMix act on batches (`batch_mixer`); `Normalizer` makes a uint8 batch normalised floats.

With `--decode device` the workers hand over a JPEG's bytes and its crop and flip, drawn from its
header's size by the transforms' own `make_params` (`EncodedSamples`); the device decodes the batch
and applies them with the same transforms (`decode_batch`). On the CPU both paths give the same
images to the bit; on a GPU nvJPEG and the resize differ by rounding.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils.data import Dataset

from vitzoo.errors import DataError

# torchvision warns at every decode that its codecs move to TorchCodec: said once, in the docs
warnings.filterwarnings("ignore", category=DeprecationWarning, message="The image decoding and "
                        "encoding capabilities of TorchVision are deprecated")


def read_bytes(path: str | Path) -> torch.Tensor:
    return torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8)


def decode_rgb(encoded: torch.Tensor) -> torch.Tensor:
    """Encoded bytes -> uint8 (3, H, W) RGB; PIL reads what torchvision.io does not (BMP, CMYK)."""
    from torchvision.io import ImageReadMode, decode_image

    try:
        return decode_image(encoded, mode=ImageReadMode.RGB)
    except RuntimeError:
        from PIL import Image
        from torchvision.transforms.v2.functional import pil_to_tensor

        with Image.open(io.BytesIO(encoded.numpy().tobytes())) as image:
            return pil_to_tensor(image.convert("RGB"))


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


def build_transform(img_size: tuple[int, int], augment: Augment | None):
    """uint8 (C, H, W) -> uint8 (C, *img_size); `augment=None` for evaluation (v2.Resize leaves an
    image of that size as it is)."""
    from torchvision.transforms import v2

    a = augment or Augment()
    ops: list[Any] = [v2.RandomResizedCrop(img_size, scale=(a.random_resized_crop, 1.0),
                                           antialias=True) if a.random_resized_crop > 0
                      else v2.Resize(img_size, antialias=True)]
    if a.crop_padding:
        ops.append(v2.RandomCrop(img_size, padding=a.crop_padding))
    if a.hflip:
        ops.append(v2.RandomHorizontalFlip())
    if a.randaugment:
        ops.append(v2.RandAugment(num_ops=2, magnitude=a.randaugment))
    return v2.Compose(ops)


def batch_mixer(augment: Augment, num_classes: int):
    """MixUp and/or CutMix on (images, labels) batches (one of them chosen per batch), or None."""
    from torchvision.transforms import v2

    chosen = ((v2.MixUp, augment.mixup), (v2.CutMix, augment.cutmix))
    mixers = [mix(alpha=alpha, num_classes=num_classes) for mix, alpha in chosen if alpha > 0]
    return (mixers[0] if len(mixers) == 1 else v2.RandomChoice(mixers)) if mixers else None


@contextlib.contextmanager
def sample_rng(seed: int, epoch: int, index: int):
    """The global torch generator seeded from (seed, epoch, index) alone, restored afterwards."""
    state = torch.get_rng_state()
    torch.default_generator.manual_seed(hash((seed, epoch, index)) % (2**63))
    try:
        yield
    finally:
        torch.set_rng_state(state)


def _seeded(seed: int, key):
    return sample_rng(seed, *key) if isinstance(key, tuple) else contextlib.nullcontext()


class Transformed(Dataset):
    """A raw dataset with a per-sample transform, indexed by an int (evaluation) or by the training
    sampler's key `(epoch, index)`, which seeds the transform."""

    def __init__(self, base: Dataset, transform, seed: int = 0) -> None:
        self.base, self.transform, self.seed, self.targets = base, transform, seed, base.targets

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key) -> tuple[torch.Tensor, int]:
        image, label = self.base[key[1] if isinstance(key, tuple) else key]
        return self.transform_sample(image, key), label

    def transform_sample(self, image: torch.Tensor, key) -> torch.Tensor:
        with _seeded(self.seed, key):
            return self.transform(image)


class Normalizer:
    """uint8 (B, C, H, W) on `device` -> normalised float; gray becomes `in_chans` channels. The
    mean and std are made once (per batch, each would be a copy that waits for the device)."""

    def __init__(self, mean, std, in_chans: int, device, dtype=torch.float32) -> None:
        self.in_chans, self.dtype = in_chans, dtype
        self.mean = torch.tensor(mean, device=device, dtype=dtype).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=device, dtype=dtype).view(1, -1, 1, 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.dtype).div_(255)
        if x.shape[1] == 1 and self.in_chans != 1:
            x = x.expand(-1, self.in_chans, -1, -1)
        elif self.in_chans == 1 and x.shape[1] != 1:
            x = x.mean(dim=1, keepdim=True)
        elif x.shape[1] != self.in_chans:
            raise DataError(f"images have {x.shape[1]} channels, the model takes {self.in_chans}")
        return (x - self.mean) / self.std


def normalize(images: torch.Tensor, mean, std, in_chans: int, dtype=torch.float32) -> torch.Tensor:
    return Normalizer(mean, std, in_chans, images.device, dtype)(images)


# ---------------------------------------------------------------------------- decoded on the device
# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic): they hold the size
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# a row of a batch's `steps`: decoded in the worker (1) or on the device (0), the crop's top, left,
# height and width (-1: no crop, the whole image resized), and whether to flip
DECODED, TOP, LEFT, HEIGHT, WIDTH, FLIP = range(6)


def jpeg_size(encoded: torch.Tensor) -> tuple[int, int] | None:
    """(height, width) from a JPEG's frame header, or None for anything but a readable JPEG."""
    data = memoryview(encoded.numpy())
    n, i = len(data), 2
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    while i + 4 <= n and data[i] == 0xFF:
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
    it with `encoded(i)` through the wrappers that pick samples (anything with `dataset` and
    `indices`); the label is `dataset`'s own. A TypeError where no dataset below has images."""

    def __init__(self, dataset: Dataset) -> None:
        leaf, order = dataset, None
        while not callable(getattr(leaf, "encoded", None)):
            if not (hasattr(leaf, "dataset") and hasattr(leaf, "indices")):
                raise TypeError(f"{type(dataset).__name__} holds no encoded images")
            picked = torch.as_tensor(leaf.indices, dtype=torch.long)
            order, leaf = (picked if order is None else picked[order]), leaf.dataset
        self.leaf, self.order, self.size = leaf, order, len(dataset)
        targets = getattr(dataset, "targets", None)
        self.targets = None if targets is None else torch.as_tensor(targets).long()

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
    resize: Any  # v2.Resize to the model's size, used when there is no crop
    flip: Any  # v2.RandomHorizontalFlip, or None
    size: tuple[int, int]


def device_ops(transform) -> DeviceOps | None:
    """`transform` (a `build_transform`) as steps the device applies, or None when it has a step
    only the workers apply (a padded random crop, RandAugment)."""
    from torchvision.transforms import v2

    steps = list(getattr(transform, "transforms", [transform]))
    first = steps.pop(0) if steps else None
    crop = first if isinstance(first, v2.RandomResizedCrop) else None
    resize = first if isinstance(first, v2.Resize) else None
    flip = steps.pop(0) if steps and isinstance(steps[0], v2.RandomHorizontalFlip) else None
    if steps or (crop is None and resize is None):
        return None
    return DeviceOps(crop, resize, flip, tuple((resize if crop is None else crop).size))


def draw_steps(ops: DeviceOps, height: int, width: int) -> list[int]:
    """One sample's crop and flip for an image of (height, width), drawn from the global generator
    as the transforms draw them (the crop's `make_params`, then the flip's `torch.rand(1) < p`)."""
    box = [-1] * 4
    if ops.crop is not None:
        stand_in = torch.zeros((), dtype=torch.uint8).expand(3, height, width)  # only its size
        params = ops.crop.make_params([stand_in])
        box = [int(params[k]) for k in ("top", "left", "height", "width")]
    return [0, *box, int(ops.flip is not None and bool(torch.rand(1) < ops.flip.p))]


def apply_steps(ops: DeviceOps, image: torch.Tensor, row: list[int]) -> torch.Tensor:
    """A decoded uint8 (3, H, W) image, on any device, cropped or resized and flipped as `row`
    says, by the transforms' own kernels."""
    if row[TOP] >= 0:
        image = ops.crop.transform(image, dict(zip(("top", "left", "height", "width"),
                                                   row[TOP:FLIP])))
    else:
        image = ops.resize(image)
    return ops.flip.transform(image, {}) if row[FLIP] else image


class EncodedSamples(Dataset):
    """A loader worker's dataset when the device decodes: sample `key` (an int or `(epoch, index)`)
    is (the JPEG's bytes, label, its steps); a sample that is not a JPEG is decoded and transformed
    here and comes as the finished uint8 image (its steps' DECODED entry says so)."""

    def __init__(self, transformed: Transformed, ops: DeviceOps) -> None:
        self.view, self.transformed, self.ops = EncodedView(transformed.base), transformed, ops
        self.targets = transformed.targets

    def __len__(self) -> int:
        return len(self.view)

    def __getitem__(self, key) -> tuple[torch.Tensor, int, list[int]]:
        data, label = self.view[key[1] if isinstance(key, tuple) else key]
        size = jpeg_size(data)
        if size is None:
            image = self.transformed.transform_sample(decode_rgb(data), key)
            return image, label, [1, -1, -1, -1, -1, 0]
        with _seeded(self.transformed.seed, key):
            return data, label, draw_steps(self.ops, *size)


class EncodedBatch(NamedTuple):
    payloads: list[torch.Tensor]  # a JPEG's bytes, or a finished uint8 image (steps[i, DECODED])
    labels: torch.Tensor
    steps: torch.Tensor  # (B, 6) int64, rows of `draw_steps`


def collate_encoded(samples: list[tuple[torch.Tensor, int, list[int]]]) -> EncodedBatch:
    payloads, labels, steps = zip(*samples)
    return EncodedBatch(list(payloads), torch.tensor(labels), torch.tensor(steps))


def decode_jpegs(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """uint8 (3, H, W) RGB images on `device`, the JPEGs decoded in one call (nvJPEG's batched
    decoder on CUDA); where it refuses one, each alone, and those it refuses by `decode_rgb`."""
    from torchvision.io import ImageReadMode, decode_jpeg

    def one(data: torch.Tensor) -> torch.Tensor:
        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=on)
        except RuntimeError:
            return decode_rgb(data)

    on = device if device.type == "cuda" else "cpu"
    try:
        images = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=on) if encoded else []
    except RuntimeError:
        images = [one(data) for data in encoded]
    return [image.to(device, non_blocking=True) for image in images]


def decode_batch(batch: EncodedBatch, ops: DeviceOps, device: torch.device):
    """(uint8 images (B, 3, *ops.size) on `device`, labels on the host) of an encoded batch."""
    rows = batch.steps.tolist()
    to_decode = [i for i, row in enumerate(rows) if not row[DECODED]]
    images = torch.empty((len(rows), 3, *ops.size), dtype=torch.uint8, device=device)
    for i, image in zip(to_decode, decode_jpegs([batch.payloads[i] for i in to_decode], device)):
        images[i] = apply_steps(ops, image, rows[i])
    for i in set(range(len(rows))) - set(to_decode):
        images[i] = batch.payloads[i].to(device, non_blocking=True)
    return images, batch.labels
