"""Images decoded where the model is: loader workers read the encoded bytes and draw each sample's
augmentation, the training process decodes a whole batch on its device and applies it there.

A JPEG's size is in its header, so a worker draws the random-resized crop and the flip without decoding
the image, from the same generator state as the worker path (`Transformed`: seeded from (seed, epoch,
index)) and through the transforms' own `make_params`; the device then applies them through the same
transforms' `transform`. On the CPU the two paths give the same images to the bit (the same decoder,
the same crops, the same kernels); on a GPU nvJPEG and the float resize differ from libjpeg-turbo and
the uint8 resize by rounding.

- `EncodedView(dataset)`: the encoded images of any dataset built on one that has `encoded(i)` (a
  `FileImages`, shards), through the subsets and class selections cut from it; `encoded_view` finds it;
- `device_ops(transform)`: the steps of a `build_transform` the device can apply (a random-resized crop
  or a resize, then a flip), or None: anything else (padding crops, RandAugment) stays in the workers;
- `EncodedSamples`: the worker's dataset, keyed as `Transformed` is; a sample that is not a JPEG is
  decoded and transformed in the worker, as before; `collate_encoded` batches them;
- `decode_batch` (vitzoo.data.on_device) turns a batch into uint8 images on the device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.utils.data import Dataset

from vitzoo.data.augment import Transformed, sample_rng
from vitzoo.data.decode import decode_rgb

# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic): the frame header holds the size
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# a row of a batch's `steps`: decoded in the worker (1) or to decode on the device (0), the crop's top,
# left, height, width (-1: no crop, the whole image resized), and whether to flip
DECODED, TOP, LEFT, HEIGHT, WIDTH, FLIP = range(6)


def jpeg_size(encoded: torch.Tensor) -> tuple[int, int] | None:
    """(height, width) from a JPEG's frame header, or None for anything that is not a readable JPEG
    (another format, a truncated header). Reads the markers up to the frame header, nothing else."""
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
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker in _SOF:
            if i + 9 > n:
                return None
            height, width = (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8]
            return (height, width) if height and width else None
        i += 2 + ((data[i + 2] << 8) | data[i + 3])
    return None


class EncodedView(Dataset):
    """`view[i]` is (the encoded bytes, label) of sample i of `dataset`, read from the dataset below it
    that has `encoded(i)`, through the wrappers that pick its samples (`Subset`, `KeptClasses`: anything
    with `dataset` and `indices`); the label is `dataset`'s own (a class selection renumbers them).
    Picklable, for loader workers started by fork server or spawn."""

    def __init__(self, dataset: Dataset) -> None:
        leaf, order = dataset, None
        while not callable(getattr(leaf, "encoded", None)):
            if not (hasattr(leaf, "dataset") and hasattr(leaf, "indices")):
                raise TypeError(f"{type(dataset).__name__} holds no encoded images (no dataset below it has `encoded(i)`)")
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
    """The encoded images of `dataset`, or None when it is not built on encoded images (tensors in memory)."""
    try:
        return EncodedView(dataset)
    except TypeError:
        return None


class DeviceOps(NamedTuple):
    """The steps of a transform the device applies: a random-resized crop or a resize (one of them),
    then a flip (or None)."""

    crop: Any  # v2.RandomResizedCrop, or None
    resize: Any  # vitzoo.data.augment's resize to the model's size (used when there is no crop)
    flip: Any  # v2.RandomHorizontalFlip, or None
    size: tuple[int, int]


def device_ops(transform: Callable) -> DeviceOps | None:
    """`transform` (a `build_transform`) as steps the device applies, or None when it holds a step that
    only the workers apply (a padded random crop, RandAugment)."""
    from torchvision.transforms import v2

    from vitzoo.data.augment import _Resize

    steps = list(getattr(transform, "transforms", [transform]))
    crop = resize = flip = None
    if steps and isinstance(steps[0], v2.RandomResizedCrop):
        crop = steps.pop(0)
    elif steps and isinstance(steps[0], _Resize):
        resize = steps.pop(0)
    if steps and isinstance(steps[0], v2.RandomHorizontalFlip):
        flip = steps.pop(0)
    if steps or (crop is None and resize is None):
        return None
    size = tuple(crop.size) if crop is not None else tuple(resize.size)
    return DeviceOps(crop, resize, flip, size)


def _method(transform: Any, name: str, before_0_21: str) -> Callable:
    """A v2 transform's method by its name since torchvision 0.21 (`make_params`, `transform`), or before."""
    return getattr(transform, name, None) or getattr(transform, before_0_21)


def draw_steps(ops: DeviceOps, height: int, width: int) -> list[int]:
    """One sample's crop and flip for an image of (height, width), drawn from the global generator as the
    transforms draw them when applied (the crop's `make_params`, then the flip's `torch.rand(1) < p`)."""
    top = left = crop_h = crop_w = -1
    if ops.crop is not None:
        stand_in = torch.zeros((), dtype=torch.uint8).expand(3, height, width)  # its size is all that is read
        params = _method(ops.crop, "make_params", "_get_params")([stand_in])
        top, left, crop_h, crop_w = (int(params[k]) for k in ("top", "left", "height", "width"))
    flip = ops.flip is not None and bool(torch.rand(1) < ops.flip.p)  # v2 skips the flip when rand >= p
    return [0, top, left, crop_h, crop_w, int(flip)]


def apply_steps(ops: DeviceOps, image: torch.Tensor, row: list[int]) -> torch.Tensor:
    """One decoded uint8 (3, H, W) image, on any device, cropped and resized to the model's size and
    flipped as `row` (a row of `draw_steps`) says, by the transforms' own kernels."""
    if row[TOP] >= 0:
        box = {"top": row[TOP], "left": row[LEFT], "height": row[HEIGHT], "width": row[WIDTH]}
        image = _method(ops.crop, "transform", "_transform")(image, box)
    else:
        image = ops.resize(image)
    if row[FLIP]:
        image = _method(ops.flip, "transform", "_transform")(image, {})
    return image


class EncodedSamples(Dataset):
    """What a loader worker does when the device decodes: sample `key` (an int, or `(epoch, index)` from
    the training sampler) is (the JPEG's bytes, label, its steps), the steps drawn as `transformed`
    would draw them; a sample that is not a JPEG is decoded and transformed here, by `transformed`
    itself, and comes as the finished uint8 image (its steps' first entry says so)."""

    def __init__(self, transformed: Transformed, ops: DeviceOps) -> None:
        self.view, self.transformed, self.ops = EncodedView(transformed.base), transformed, ops
        self.targets = transformed.targets

    def __len__(self) -> int:
        return len(self.view)

    def __getitem__(self, key) -> tuple[torch.Tensor, int, list[int]]:
        epoch, index = key if isinstance(key, tuple) else (None, key)
        data, label = self.view[index]
        size = jpeg_size(data)
        if size is None:  # not a JPEG: the worker path, for this sample
            return self.transformed.transform_sample(decode_rgb(data), key), label, [1, -1, -1, -1, -1, 0]
        seeded = sample_rng(self.transformed.seed, epoch, index) if epoch is not None else contextlib.nullcontext()
        with seeded:
            return data, label, draw_steps(self.ops, *size)


class EncodedBatch(NamedTuple):
    payloads: list[torch.Tensor]  # a JPEG's bytes, or a finished uint8 image (steps[i, DECODED] == 1)
    labels: torch.Tensor
    steps: torch.Tensor  # (B, 6) int64, rows of `draw_steps`


def collate_encoded(samples: list[tuple[torch.Tensor, int, list[int]]]) -> EncodedBatch:
    payloads, labels, steps = zip(*samples)
    return EncodedBatch(list(payloads), torch.tensor(labels, dtype=torch.long), torch.tensor(steps, dtype=torch.long))


__all__ = ["DeviceOps", "EncodedBatch", "EncodedSamples", "EncodedView", "apply_steps", "collate_encoded", "device_ops",
           "draw_steps", "encoded_view", "jpeg_size"]
