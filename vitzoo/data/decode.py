"""Image files to uint8 tensors: read the bytes, then decode them, as two steps.

Splitting the two lets the decoding happen where it is fastest. On the CPU a loader worker does both
(`FileImages.__getitem__`); on a GPU the workers only read bytes (`FileImages.encoded`) and the training
process decodes whole batches on the device. Decoding is `torchvision.io.decode_image` (libjpeg-turbo:
JPEG, PNG, WebP, GIF), about 2.5x PIL's speed on ImageNet-sized JPEGs; PIL reads what it cannot (BMP,
TIFF, PPM, a CMYK JPEG an old libjpeg refuses).
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import torch
from torch.utils.data import Dataset

# torchvision 0.29 warns at every decode that its image codecs are deprecated for TorchCodec's; they are
# still shipped and are what this machine's torch pairs with: said once here (docs/datasets.md), not per image
warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision are deprecated",
                        category=DeprecationWarning)


def read_bytes(path: str | Path) -> torch.Tensor:
    """A file's bytes as a 1-D uint8 tensor (what `torchvision.io.decode_*` takes)."""
    return torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8)


def decode_rgb(encoded: torch.Tensor) -> torch.Tensor:
    """An encoded image (1-D uint8) -> uint8 (3, H, W) RGB, grey and CMYK images converted."""
    from torchvision.io import ImageReadMode, decode_image

    try:
        return decode_image(encoded, mode=ImageReadMode.RGB)
    except RuntimeError:  # a format torchvision.io does not read: PIL does
        from PIL import Image
        from torchvision.transforms.v2 import functional as TF

        with Image.open(io.BytesIO(encoded.numpy().tobytes())) as image:
            return TF.pil_to_tensor(image.convert("RGB"))


class FileImages(Dataset):
    """Images stored one per file (an ImageFolder tree, a dataset's image files), with their labels:
    `dataset[i]` is (uint8 (3, H, W), label), decoded here; `encoded(i)` is (the file's bytes, label),
    for a decoder elsewhere (a GPU)."""

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


__all__ = ["FileImages", "decode_rgb", "read_bytes"]
