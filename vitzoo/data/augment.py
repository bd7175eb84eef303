"""Augmentation and resizing: what a raw split's uint8 images go through on their way to the model.

Augmentation (training only) is torchvision.transforms.v2, applied per sample; its randomness is a
function of (seed, epoch, sample index), so it does not depend on the number of loader workers and a
resumed run sees the same images as an uninterrupted one (`Transformed`). Evaluation only resizes to
the model's resolution (`build_transform(img_size, None)`). MixUp / CutMix act on batches (`batch_mixer`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset


@dataclass(frozen=True)
class Augment:
    """Training augmentation (all off by default)."""

    random_resized_crop: float = 0.0  # > 0: RandomResizedCrop with scale (this, 1)
    crop_padding: int = 0  # > 0: RandomCrop of the image size after zero padding by this many pixels
    hflip: bool = False
    randaugment: int = 0  # > 0: RandAugment(num_ops=2, magnitude=this)
    mixup: float = 0.0  # MixUp alpha (batch level)
    cutmix: float = 0.0  # CutMix alpha (batch level)


def build_transform(img_size: tuple[int, int], augment: Augment | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """uint8 (C, H, W) -> uint8 (C, *img_size); `augment=None` for evaluation."""
    from torchvision.transforms import v2

    ops: list[Any] = []
    if augment is not None and augment.random_resized_crop > 0:
        ops.append(v2.RandomResizedCrop(img_size, scale=(augment.random_resized_crop, 1.0), antialias=True))
    else:
        ops.append(_Resize(img_size))
    if augment is not None:
        if augment.crop_padding:
            ops.append(v2.RandomCrop(img_size, padding=augment.crop_padding))
        if augment.hflip:
            ops.append(v2.RandomHorizontalFlip())
        if augment.randaugment:
            ops.append(v2.RandAugment(num_ops=2, magnitude=augment.randaugment))
    return v2.Compose(ops)


class _Resize(torch.nn.Module):
    """v2.Resize that is a no-op when the image already has the size."""

    def __init__(self, size: tuple[int, int]) -> None:
        super().__init__()
        from torchvision.transforms import v2

        self.size = tuple(size)
        self.resize = v2.Resize(self.size, antialias=True)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return image if tuple(image.shape[-2:]) == self.size else self.resize(image)


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


class Transformed(Dataset):
    """A raw dataset with a per-sample transform.

    Indexed by an int (no randomness involved: evaluation) or by a key `(epoch, index)` from the
    training sampler: the global torch RNG is then seeded from (seed, epoch, index) for the transform
    and restored afterwards, so augmentation is reproducible whatever the worker count or resume point.
    """

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
        if isinstance(key, tuple):
            with sample_rng(self.seed, *key):
                return self.transform(image)
        return self.transform(image)


@contextmanager
def sample_rng(seed: int, epoch: int, index: int) -> Iterator[None]:
    """The global torch generator seeded for one sample's augmentation, from (seed, epoch, index) alone,
    and restored afterwards (every draw of a sample's transform happens inside)."""
    state = torch.get_rng_state()
    torch.default_generator.manual_seed(hash((seed, epoch, index)) % (2**63))
    try:
        yield
    finally:
        torch.set_rng_state(state)


__all__ = ["Augment", "Transformed", "batch_mixer", "build_transform", "sample_rng"]
