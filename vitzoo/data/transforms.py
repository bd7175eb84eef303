"""What an image goes through on its way to the model: decoding, augmentation, normalisation.

Training augmentation is torchvision.transforms.v2 per sample, its randomness a function of
(seed, epoch, index) alone (`Transformed`); evaluation only resizes. MixUp / CutMix act on batches
(`batch_mixer`); `Normalizer` makes a uint8 batch normalised floats. With `--decode device` the
workers hand over a JPEG's bytes and its crop and flip, drawn from its header's size
(`EncodedSamples`); the device decodes the batch and applies them with the same transforms
(`decode_batch`): on the CPU the same images to the bit, on a GPU within rounding.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, Subset


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
def seeded(seed: int, key):
    """For a training key `(epoch, index)`, the global CPU generator seeded from (seed, epoch,
    index) alone and restored afterwards; an evaluation's int key leaves it as it is."""
    if not isinstance(key, tuple):
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(hash((seed, *key)) % (2**63))
        yield


class Transformed(Dataset):
    """A raw dataset with a per-sample transform, indexed by an int (evaluation) or by the training
    sampler's key `(epoch, index)`, which seeds the transform."""

    def __init__(self, base: Dataset, transform, seed: int = 0) -> None:
        self.base, self.transform, self.seed, self.targets = base, transform, seed, base.targets

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key) -> tuple[torch.Tensor, int]:
        image, label = self.base[key[1] if isinstance(key, tuple) else key]
        with seeded(self.seed, key):
            return self.transform(image), label


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
        return (x - self.mean) / self.std


# ---------------------------------------------------------------------------- decoded on the device
BOX = ("top", "left", "height", "width")


def jpeg_size(encoded: torch.Tensor) -> tuple[int, int] | None:
    """(height, width) from a JPEG's header, or None for anything but a readable JPEG."""
    from PIL import Image

    try:  # Pillow reads the header only
        with Image.open(io.BytesIO(encoded.numpy().tobytes())) as image:
            return image.size[::-1] if image.format in ("JPEG", "MPO") else None
    except (OSError, SyntaxError, ValueError):
        return None


def holds_files(dataset: Dataset) -> bool:
    """Whether `dataset`, under the subsets that pick its samples, reads encoded image files."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return callable(getattr(dataset, "encoded", None))


def device_ops(transform) -> tuple | None:
    """`transform` (a `build_transform`) as the steps the device applies, (a random resized crop
    or a resize, a flip or None), or None when it has a step only the workers apply (a padded
    random crop, RandAugment)."""
    from torchvision.transforms import v2

    steps = list(getattr(transform, "transforms", [transform]))
    flip = steps.pop() if isinstance(steps[-1], v2.RandomHorizontalFlip) else None
    if len(steps) != 1 or not isinstance(steps[0], (v2.RandomResizedCrop, v2.Resize)):
        return None
    return steps[0], flip


class EncodedSamples(Dataset):
    """A loader worker's dataset when the device decodes: sample `key` (an int or `(epoch, index)`)
    is (a JPEG's bytes, label, [its crop's top, left, height, width (-1s: resized whole), flip]),
    drawn from the header's size as the transforms draw them (the crop's `make_params`, then the
    flip's `torch.rand(1) < p`); any other image is decoded and transformed here, finished (3-D)."""

    def __init__(self, transformed: Transformed, ops: tuple) -> None:
        self.transformed, self.ops, self.targets = transformed, ops, transformed.targets

    def __len__(self) -> int:
        return len(self.transformed)

    def __getitem__(self, key) -> tuple[torch.Tensor, int, list[int]]:
        from torchvision.transforms import v2

        data, label = self.transformed.base.encoded(key[1] if isinstance(key, tuple) else key)
        size, (first, flip), box = jpeg_size(data), self.ops, [-1] * 4
        with seeded(self.transformed.seed, key):
            if size is None:
                return self.transformed.transform(decode_rgb(data)), label, [-1] * 5
            if isinstance(first, v2.RandomResizedCrop):
                params = first.make_params([torch.zeros((), dtype=torch.uint8).expand(3, *size)])
                box = [int(params[k]) for k in BOX]
            return data, label, [*box, int(flip is not None and bool(torch.rand(1) < flip.p))]


def collate_encoded(samples: list) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    payloads, labels, steps = zip(*samples)
    return list(payloads), torch.tensor(labels), torch.tensor(steps)


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


def decode_batch(batch: tuple, ops: tuple, device: torch.device):
    """(uint8 images (B, 3, H, W) on `device`, labels on the host) of a batch of `EncodedSamples`:
    its JPEGs decoded, then cropped or resized and flipped by the transforms' own kernels."""
    (payloads, labels, steps), (first, flip) = batch, ops
    jpegs = [i for i, payload in enumerate(payloads) if payload.dim() == 1]
    images = torch.empty((len(payloads), 3, *first.size), dtype=torch.uint8, device=device)
    for i, image in zip(jpegs, decode_jpegs([payloads[i] for i in jpegs], device)):
        *box, flipped = steps[i].tolist()
        image = first.transform(image, dict(zip(BOX, box)) if box[0] >= 0 else {})
        images[i] = flip.transform(image, {}) if flipped else image
    for i in set(range(len(payloads))) - set(jpegs):
        images[i] = payloads[i].to(device, non_blocking=True)
    return images, labels
