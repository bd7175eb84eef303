"""The zoo: the paper's named models (Table 1, Ti and S from the official repository, the hybrids),
each a complete `ViTConfig`, and the weights released for them, one `PretrainedTag` each. A tag is
data, as torchvision's `Weights`: its Hub repo and format, what the weights expect (`transforms()`),
their class names (`categories()`) and ImageNet top-1. Plugins add both through hooks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vitzoo.config import HYBRID_NUMERICS, ViTConfig

SIZES = {  # Table 1, plus Ti and S from the official repository
    "ti": dict(embed_dim=192, depth=12, mlp_dim=768, num_heads=3),
    "s": dict(embed_dim=384, depth=12, mlp_dim=1536, num_heads=6),
    "b": dict(embed_dim=768, depth=12, mlp_dim=3072, num_heads=12),
    "l": dict(embed_dim=1024, depth=24, mlp_dim=4096, num_heads=16),
    "h": dict(embed_dim=1280, depth=32, mlp_dim=5120, num_heads=16),
}
# the hybrids' ResNet blocks per stage: R50 of 3 stages (stride 16) or 4 (stride 32), R26
R50_S16, R50_S32, R26_S32 = (3, 4, 9), (3, 4, 6, 3), (2, 2, 2, 2)


def vit(size: str, patch_size: int) -> ViTConfig:
    return ViTConfig(patch_size=patch_size, **SIZES[size])


def hybrid(size: str, layers: tuple[int, ...]) -> ViTConfig:  # 1x1 patches of the ResNet's map
    return ViTConfig(stem="resnet", patch_size=1, stem_options={"layers": layers}, **SIZES[size])


# name -> (config, timm's architecture name, less its resolution: vit_tiny_patch16[_224])
TABLE_1: dict[str, tuple[ViTConfig, str | None]] = {
    "vit_ti16": (vit("ti", 16), "vit_tiny_patch16"),
    "vit_s16": (vit("s", 16), "vit_small_patch16"),
    "vit_s32": (vit("s", 32), "vit_small_patch32"),
    "vit_b8": (vit("b", 8), "vit_base_patch8"),
    "vit_b16": (vit("b", 16), "vit_base_patch16"),
    "vit_b32": (vit("b", 32), "vit_base_patch32"),
    "vit_l16": (vit("l", 16), "vit_large_patch16"),
    "vit_l32": (vit("l", 32), "vit_large_patch32"),
    "vit_h14": (vit("h", 14), "vit_huge_patch14"),
    "vit_b16_hybrid": (hybrid("b", R50_S16), "vit_base_r50_s16"),
    "vit_b32_hybrid": (hybrid("b", R50_S32), None),
    "vit_l16_hybrid": (hybrid("l", R50_S16), None),
    "vit_l32_hybrid": (hybrid("l", R50_S32), "vit_large_r50_s32"),
    "vit_s32_r26_hybrid": (hybrid("s", R26_S32), "vit_small_r26_s32"),
    "vit_b32_r26_hybrid": (hybrid("b", R26_S32), "vit_base_r26_s32"),
}
MODELS = {name: config for name, (config, _) in TABLE_1.items()}
TIMM_ARCHITECTURES = {timm: name for name, (_, timm) in TABLE_1.items() if timm}


def imagenet_1k() -> list[str]:
    """The 1000 ImageNet-1k class names in class order, from torchvision's metadata (offline)."""
    from torchvision.models import ViT_B_16_Weights

    return list(ViT_B_16_Weights.IMAGENET1K_V1.meta["categories"])


LABEL_SETS = {"imagenet-1k": imagenet_1k}  # a tag's `labels`: the class names its weights lack


@dataclass(frozen=True)
class PretrainedTag:
    """Released weights of a named model: where they are and what they expect."""

    model: str  # a registered model name, e.g. "vit_b16"
    tag: str  # e.g. "orig_in21k_ft_in1k"
    hub_id: str  # the Hub repo that holds them, ORG/NAME
    format: str  # the registered weight format of its files ("timm", "transformers", ...)
    img_size: int  # the resolution they were trained (fine-tuned) at
    num_classes: int  # 0: no classifier (features only)
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    crop_pct: float = 1.0
    interpolation: str = "bicubic"
    license: str = "apache-2.0"
    labels: str | None = None  # a key of LABEL_SETS, for weights that name no classes
    accuracy: float | None = None  # ImageNet top-1 (%), as `accuracy_source` reports it
    accuracy_source: str = ""
    default: bool = False  # the weights `create(model, pretrained=True)` loads
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)  # further options

    @property
    def name(self) -> str:
        return f"{self.model}.{self.tag}"

    def source(self, revision: str | None = None) -> str:
        return f"hf-hub:{self.hub_id}" + (f"@{revision}" if revision else "")

    def config_options(self) -> dict[str, Any]:
        """The options of the model these weights fit, and of their preprocessing."""
        return dict(img_size=self.img_size, num_classes=self.num_classes, mean=self.mean,
                    std=self.std, crop_pct=self.crop_pct, interpolation=self.interpolation,
                    **self.options)

    def categories(self) -> list[str] | None:
        return LABEL_SETS[self.labels]() if self.labels is not None else None

    def transforms(self, is_training: bool = False):
        return preprocessing((self.img_size,) * 2, self.crop_pct, self.interpolation, self.mean,
                             self.std, is_training=is_training)


def preprocessing(img_size: tuple[int, int], crop_pct: float, interpolation: str, mean, std,
                  in_chans: int = 3, is_training: bool = False):
    """torchvision transforms v2: PIL images or uint8 tensors (C, H, W) in, normalised floats of
    `img_size` out. Evaluation resizes to img_size / crop_pct and takes the centre crop, as timm;
    `is_training` a random-resized crop (scale 0.08 to 1) and a flip, as the paper."""
    import torch
    from torchvision.transforms import v2

    height, width = img_size
    mode = v2.InterpolationMode(interpolation)
    # geometry before ToImage: a PIL image is resized as PIL, the same pixels as timm's
    gray = [v2.Grayscale(num_output_channels=1)] if in_chans == 1 else []  # predict reads RGB
    normalise = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), *gray,
                 v2.Normalize(mean=list(mean), std=list(std))]
    if is_training:
        crop = v2.RandomResizedCrop((height, width), scale=(0.08, 1.0), interpolation=mode,
                                    antialias=True)
        return v2.Compose([crop, v2.RandomHorizontalFlip(), *normalise])
    scaled = (math.floor(height / crop_pct), math.floor(width / crop_pct))
    resize = v2.Resize(scaled[0] if height == width else scaled, interpolation=mode, antialias=True)
    return v2.Compose([resize, v2.CenterCrop((height, width)), *normalise])


# The released weights, as the Hub holds them; each model's default first. A tag ending in _384 or
# _224 is at that resolution, orig_in21k_ft_in1k at 384, any other at 224; its classes: 1000 for
# in1k, none for orig_in21k (the head was dropped), 21,843 for in21k. The repo: timm's port,
# timm/ARCH_SIZE.TAG (less _384, _224), unless GOOGLE names transformers' port. `orig_` are the
# paper's checkpoints, `augreg` the official repository's later ones ("How to train your ViT").
AUGREG = "augreg_in21k_ft_in1k augreg_in21k augreg_in21k_ft_in1k_384"
IN1K = "augreg_in1k augreg_in1k_384"
RELEASES = {
    "vit_ti16": AUGREG,
    "vit_s16": f"{AUGREG} {IN1K}",
    "vit_s32": AUGREG,
    "vit_b8": "augreg_in21k_ft_in1k augreg_in21k augreg2_in21k_ft_in1k",
    "vit_b16": f"orig_in21k_ft_in1k orig_in21k orig_in21k_ft_in1k_224 {AUGREG} "
               f"augreg2_in21k_ft_in1k {IN1K}",
    "vit_b32": f"orig_in21k_ft_in1k orig_in21k {AUGREG} {IN1K}",
    "vit_l16": f"orig_in21k_ft_in1k orig_in21k {AUGREG}",
    "vit_l32": "orig_in21k_ft_in1k orig_in21k",
    "vit_h14": "orig_in21k",
    "vit_b16_hybrid": "orig_in21k_ft_in1k orig_in21k",
    "vit_s32_r26_hybrid": AUGREG,
    "vit_l32_hybrid": AUGREG,
}
GOOGLE = {"vit_b32.orig_in21k_ft_in1k": "google/vit-base-patch32-384",
          "vit_l16.orig_in21k_ft_in1k": "google/vit-large-patch16-384"}
TABLE_5 = "paper, Table 5"  # ImageNet-21k pre-training, fine-tuned at 384 px
ACCURACY = {"vit_b16.orig_in21k_ft_in1k": (83.97, TABLE_5),
            "vit_b16.orig_in21k_ft_in1k_224": (81.2, "official README: expected for the -224 "
                                                     "fine-tune"),
            "vit_b32.orig_in21k_ft_in1k": (81.28, TABLE_5),
            "vit_l16.orig_in21k_ft_in1k": (85.15, TABLE_5),
            "vit_l32.orig_in21k_ft_in1k": (80.99, TABLE_5)}


def release(model: str, tag: str, default: bool) -> PretrainedTag:
    """A tag by the rules above: timm's ports crop 0.9 (1.0 at 384 px), google's resize straight
    and bilinearly; timm's hybrids need timm's ResNet numerics."""
    size = 384 if tag.endswith("_384") or tag == "orig_in21k_ft_in1k" else 224
    classes = 1000 if "in1k" in tag else 0 if tag == "orig_in21k" else 21843
    name = f"{model}.{tag}"
    hub_id = GOOGLE.get(name, f"timm/{TABLE_1[model][1]}_{size}.{tag.removesuffix(f'_{size}')}")
    timm = name not in GOOGLE
    accuracy, source = ACCURACY.get(name, (None, ""))
    return PretrainedTag(model, tag, hub_id, "timm" if timm else "transformers", size, classes,
                         crop_pct=(1.0 if size == 384 else 0.9) if timm else 1.0,
                         interpolation="bicubic" if timm else "bilinear",
                         labels="imagenet-1k" if classes == 1000 else None, accuracy=accuracy,
                         accuracy_source=source, default=default,
                         options=HYBRID_NUMERICS if timm and MODELS[model].stem == "resnet" else {})


PRETRAINED = tuple(release(model, tag, i == 0) for model, tags in RELEASES.items()
                   for i, tag in enumerate(tags.split()))
