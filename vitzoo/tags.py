"""Pretrained tags: released weights of a named model, named `MODEL.TAG` (`vit_b16.orig_in21k`).

A tag is data, as torchvision's `Weights` are: the Hub repo that holds the weights, their format,
what they expect (resolution, classes, normalisation, crop, interpolation: `transforms()`), their
class names (`categories()`) and their ImageNet top-1. The paper's are the rows of `vitzoo.zoo`; a
plugin adds its own through the `vitzoo_pretrained_tags` hook; `vitzoo.catalog` looks them up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vitzoo.labels import LABEL_SETS

SEPARATOR = "."  # MODEL.TAG
REVISION_SEPARATOR = "@"  # MODEL.TAG@REVISION


@dataclass(frozen=True)
class PretrainedTag:
    """Released weights of a named model: where they are and what they expect."""

    model: str  # the registered model name, e.g. "vit_b16"
    tag: str  # e.g. "orig_in21k_ft_in1k"
    hub_id: str  # the Hub repo that holds them, ORG/NAME
    format: str  # the registered weight format of the repo's files ("timm", "transformers", ...)
    img_size: int  # the resolution they were trained (fine-tuned) at
    num_classes: int  # of their classifier; 0 = no classifier (features only)
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    crop_pct: float = 1.0
    interpolation: str = "bicubic"
    license: str = "apache-2.0"
    # the class names when the weights carry none: a key of vitzoo.labels.LABEL_SETS
    labels: str | None = None
    accuracy: float | None = None  # ImageNet top-1 (%) that `accuracy_source` reports
    accuracy_source: str = ""  # e.g. "paper, Table 5"
    default: bool = False  # the weights `create(model, pretrained=True)` loads
    # further ViTConfig options they need
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    description: str = ""

    @property
    def name(self) -> str:
        return f"{self.model}{SEPARATOR}{self.tag}"

    def source(self, revision: str | None = None) -> str:
        """The `hf-hub:` reference of the weights (at `revision`)."""
        return f"hf-hub:{self.hub_id}" + (f"{REVISION_SEPARATOR}{revision}" if revision else "")

    def config_options(self) -> dict[str, Any]:
        """The ViTConfig options of the model the weights fit, and of their preprocessing."""
        return dict(img_size=self.img_size, num_classes=self.num_classes, mean=self.mean,
                    std=self.std, crop_pct=self.crop_pct, interpolation=self.interpolation,
                    **self.options)

    def categories(self) -> list[str] | None:
        """The names of the head's classes, in class order (None where the tag names none)."""
        return LABEL_SETS[self.labels]() if self.labels is not None else None

    def transforms(self, is_training: bool = False):
        """The preprocessing these weights expect (see `preprocessing`)."""
        return preprocessing((self.img_size, self.img_size), self.crop_pct, self.interpolation,
                             self.mean, self.std, is_training=is_training)


def preprocessing(img_size: tuple[int, int], crop_pct: float, interpolation: str, mean, std,
                  in_chans: int = 3, is_training: bool = False):
    """`torchvision.transforms.v2.Compose`: PIL images or uint8 tensors (C, H, W) in, normalised
    float tensors of `img_size` out. Evaluation resizes the shorter side to img_size / crop_pct and
    takes the centre crop (crop_pct 1.0 resizes straight to img_size); `is_training` takes a
    random-resized crop (scale 0.08 to 1) and a horizontal flip instead, the paper's and timm's."""
    import torch
    from torchvision.transforms import v2

    height, width = img_size
    mode = v2.InterpolationMode(interpolation)
    # a PIL image is resized as a PIL image (ToImage after the geometry), as timm's transforms do:
    # the same pixels as timm's, where resizing the tensor differs by rounding.
    # A one-channel model (Fashion-MNIST's) takes the image's luma: predict reads images as RGB
    gray = [v2.Grayscale(num_output_channels=1)] if in_chans == 1 else []
    normalise = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), *gray,
                 v2.Normalize(mean=list(mean), std=list(std))]
    if is_training:
        crop = v2.RandomResizedCrop((height, width), scale=(0.08, 1.0), interpolation=mode,
                                    antialias=True)
        return v2.Compose([crop, v2.RandomHorizontalFlip(), *normalise])
    # as timm: floor(size / crop_pct); a square input resizes the shorter side, keeping the aspect
    scaled = (math.floor(height / crop_pct), math.floor(width / crop_pct))
    resize = v2.Resize(scaled[0] if height == width else scaled, interpolation=mode, antialias=True)
    return v2.Compose([resize, v2.CenterCrop((height, width)), *normalise])
