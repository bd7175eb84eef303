"""Pretrained tags: released weights of a named model, named `MODEL.TAG` (`vit_b16.orig_in21k_ft_in1k`).

A tag is data (`PretrainedTag`): the Hub repo that holds the weights, their format, and what the
weights expect (resolution, classes, normalisation, crop, interpolation). A plugin provides tags
through the `vitzoo_pretrained_tags` hook; the paper's are in `vitzoo.zoo.PRETRAINED`. Looking them up
in the registry (`MODEL.TAG@REVISION`, listing, the table in docs/pretrained.md) is `vitzoo.catalog`; downloading
and loading a tag's weights is `vitzoo.pretrained.resolve_tag`. This module imports nothing of vitzoo.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
    # the class names when the weights carry none: a key of vitzoo.labels.LABEL_SETS ("imagenet-1k")
    labels: str | None = None
    accuracy: float | None = None  # ImageNet top-1 (%) that `accuracy_source` reports for these weights
    accuracy_source: str = ""  # e.g. "paper, Table 5"
    default: bool = False  # the weights `create(model, pretrained=True)` loads
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)  # further ViTConfig options they need
    description: str = ""

    @property
    def name(self) -> str:
        return f"{self.model}{SEPARATOR}{self.tag}"

    def source(self, revision: str | None = None) -> str:
        """The `hf-hub:` reference of the weights (at `revision`)."""
        return f"hf-hub:{self.hub_id}" + (f"{REVISION_SEPARATOR}{revision}" if revision else "")

    def config_options(self) -> dict[str, Any]:
        """The ViTConfig options of the model the weights fit, and of their preprocessing."""
        return dict(img_size=self.img_size, num_classes=self.num_classes, mean=self.mean, std=self.std,
                    crop_pct=self.crop_pct, interpolation=self.interpolation, **self.options)
