"""Class names, so that logits can be named: those the weights carry (a transformers config.json's
id2label, kept as `model.labels`), else a tag's label set. ImageNet-1k's names come with
torchvision, offline (its weights metadata lists them)."""

from __future__ import annotations

from collections.abc import Callable


def imagenet_1k() -> list[str]:
    """The 1000 ImageNet-1k class names in the standard class order (torchvision's)."""
    from torchvision.models import ViT_B_16_Weights  # its public weights metadata (no download)

    return list(ViT_B_16_Weights.IMAGENET1K_V1.meta["categories"])


LABEL_SETS: dict[str, Callable[[], list[str]]] = {"imagenet-1k": imagenet_1k}  # a tag's `labels`
