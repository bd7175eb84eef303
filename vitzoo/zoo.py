"""The zoo: the named models of the paper (Table 1, and Ti and S from the official repository) and
the weights released for them, one row per pretrained tag (`vitzoo.tags.PretrainedTag`).

A name is a complete `ViTConfig`; `vitzoo.create(name, **options)` changes options on top of it. A
tag carries its Hub repo, resolution, classes, preprocessing, class names and ImageNet top-1.
"""

from __future__ import annotations

from vitzoo.config import HYBRID_NUMERICS, ViTConfig
from vitzoo.tags import PretrainedTag

# Table 1 of the paper, plus Ti and S from the official repository.
SIZES = {
    "ti": dict(embed_dim=192, depth=12, mlp_dim=768, num_heads=3),
    "s": dict(embed_dim=384, depth=12, mlp_dim=1536, num_heads=6),
    "b": dict(embed_dim=768, depth=12, mlp_dim=3072, num_heads=12),
    "l": dict(embed_dim=1024, depth=24, mlp_dim=4096, num_heads=16),
    "h": dict(embed_dim=1280, depth=32, mlp_dim=5120, num_heads=16),
}

# ResNet blocks per stage of the hybrids: R50 with 3 stages (total stride 16) or 4 (stride 32), R26.
R50_S16 = (3, 4, 9)
R50_S32 = (3, 4, 6, 3)
R26_S32 = (2, 2, 2, 2)


def vit(size: str, patch_size: int) -> ViTConfig:
    return ViTConfig(patch_size=patch_size, **SIZES[size])


def hybrid(size: str, resnet_layers: tuple[int, ...]) -> ViTConfig:
    """Patches of size 1 taken from the ResNet feature map (paper, section 3.1)."""
    return ViTConfig(stem="resnet", patch_size=1, stem_options={"layers": resnet_layers},
                     **SIZES[size])


# name -> (config, timm's architecture name, which ends in the resolution: vit_tiny_patch16_224)
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
MODELS: dict[str, ViTConfig] = {name: config for name, (config, _) in TABLE_1.items()}
TIMM_ARCHITECTURES = {timm: name for name, (_, timm) in TABLE_1.items() if timm}

# The released weights, as the Hub holds them today. Per model: (tag, Hub repo, resolution,
# classes, further fields). timm/ repos are timm's ports (their pretrained_cfg: crop 1.0 at 384 px,
# else 0.9); google/ repos are transformers' ports (a straight bilinear resize). A 1000-way head is
# ImageNet-1k's; 0 classes: the released head was dropped. `orig_` are the paper's checkpoints,
# `augreg` the official repository's later ones ("How to train your ViT"); top-1: the paper's
# Table 5 (ImageNet-21k pre-training, fine-tuned at 384 px).
DEFAULT = {"default": True}  # the tag `create(model, pretrained=True)` loads
TABLE_5 = "paper, Table 5"
RELEASES: dict[str, list[tuple]] = {
    "vit_ti16": [
        ("augreg_in21k", "timm/vit_tiny_patch16_224.augreg_in21k", 224, 21843),
        ("augreg_in21k_ft_in1k", "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k", 224, 1000,
         DEFAULT),
        ("augreg_in21k_ft_in1k_384", "timm/vit_tiny_patch16_384.augreg_in21k_ft_in1k", 384, 1000),
    ],
    "vit_s16": [
        ("augreg_in21k", "timm/vit_small_patch16_224.augreg_in21k", 224, 21843),
        ("augreg_in21k_ft_in1k", "timm/vit_small_patch16_224.augreg_in21k_ft_in1k", 224, 1000,
         DEFAULT),
        ("augreg_in21k_ft_in1k_384", "timm/vit_small_patch16_384.augreg_in21k_ft_in1k", 384, 1000),
        ("augreg_in1k", "timm/vit_small_patch16_224.augreg_in1k", 224, 1000),
        ("augreg_in1k_384", "timm/vit_small_patch16_384.augreg_in1k", 384, 1000),
    ],
    "vit_s32": [
        ("augreg_in21k", "timm/vit_small_patch32_224.augreg_in21k", 224, 21843),
        ("augreg_in21k_ft_in1k", "timm/vit_small_patch32_224.augreg_in21k_ft_in1k", 224, 1000,
         DEFAULT),
        ("augreg_in21k_ft_in1k_384", "timm/vit_small_patch32_384.augreg_in21k_ft_in1k", 384, 1000),
    ],
    "vit_b8": [
        ("augreg_in21k", "timm/vit_base_patch8_224.augreg_in21k", 224, 21843),
        ("augreg_in21k_ft_in1k", "timm/vit_base_patch8_224.augreg_in21k_ft_in1k", 224, 1000,
         DEFAULT),
        ("augreg2_in21k_ft_in1k", "timm/vit_base_patch8_224.augreg2_in21k_ft_in1k", 224, 1000),
    ],
    "vit_b16": [
        ("orig_in21k", "timm/vit_base_patch16_224.orig_in21k", 224, 0),
        ("orig_in21k_ft_in1k", "timm/vit_base_patch16_384.orig_in21k_ft_in1k", 384, 1000,
         dict(DEFAULT, accuracy=83.97, accuracy_source=TABLE_5)),
        ("orig_in21k_ft_in1k_224", "timm/vit_base_patch16_224.orig_in21k_ft_in1k", 224, 1000,
         dict(accuracy=81.2, accuracy_source="official README: expected for the -224 fine-tune")),
        ("augreg_in21k", "timm/vit_base_patch16_224.augreg_in21k", 224, 21843),
        ("augreg_in21k_ft_in1k", "timm/vit_base_patch16_224.augreg_in21k_ft_in1k", 224, 1000),
        ("augreg_in21k_ft_in1k_384", "timm/vit_base_patch16_384.augreg_in21k_ft_in1k", 384, 1000),
        ("augreg2_in21k_ft_in1k", "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", 224, 1000),
        ("augreg_in1k", "timm/vit_base_patch16_224.augreg_in1k", 224, 1000),
        ("augreg_in1k_384", "timm/vit_base_patch16_384.augreg_in1k", 384, 1000),
    ],
    "vit_b32": [
        ("orig_in21k", "timm/vit_base_patch32_224.orig_in21k", 224, 0),
        ("orig_in21k_ft_in1k", "google/vit-base-patch32-384", 384, 1000,
         dict(DEFAULT, accuracy=81.28, accuracy_source=TABLE_5)),
        ("augreg_in21k", "timm/vit_base_patch32_224.augreg_in21k", 224, 21843),
        ("augreg_in21k_ft_in1k", "timm/vit_base_patch32_224.augreg_in21k_ft_in1k", 224, 1000),
        ("augreg_in21k_ft_in1k_384", "timm/vit_base_patch32_384.augreg_in21k_ft_in1k", 384, 1000),
        ("augreg_in1k", "timm/vit_base_patch32_224.augreg_in1k", 224, 1000),
        ("augreg_in1k_384", "timm/vit_base_patch32_384.augreg_in1k", 384, 1000),
    ],
    "vit_l16": [
        ("orig_in21k", "timm/vit_large_patch16_224.orig_in21k", 224, 0),
        ("orig_in21k_ft_in1k", "google/vit-large-patch16-384", 384, 1000,
         dict(DEFAULT, accuracy=85.15, accuracy_source=TABLE_5)),
        ("augreg_in21k", "timm/vit_large_patch16_224.augreg_in21k", 224, 21843),
        ("augreg_in21k_ft_in1k", "timm/vit_large_patch16_224.augreg_in21k_ft_in1k", 224, 1000),
        ("augreg_in21k_ft_in1k_384", "timm/vit_large_patch16_384.augreg_in21k_ft_in1k", 384, 1000),
    ],
    "vit_l32": [
        ("orig_in21k", "timm/vit_large_patch32_224.orig_in21k", 224, 0),
        ("orig_in21k_ft_in1k", "timm/vit_large_patch32_384.orig_in21k_ft_in1k", 384, 1000,
         dict(DEFAULT, accuracy=80.99, accuracy_source=TABLE_5)),
    ],
    "vit_h14": [
        ("orig_in21k", "timm/vit_huge_patch14_224.orig_in21k", 224, 0, DEFAULT),
    ],
    "vit_b16_hybrid": [
        ("orig_in21k", "timm/vit_base_r50_s16_224.orig_in21k", 224, 0),
        ("orig_in21k_ft_in1k", "timm/vit_base_r50_s16_384.orig_in21k_ft_in1k", 384, 1000, DEFAULT),
    ],
    "vit_s32_r26_hybrid": [
        ("augreg_in21k", "timm/vit_small_r26_s32_224.augreg_in21k", 224, 21843),
        ("augreg_in21k_ft_in1k", "timm/vit_small_r26_s32_224.augreg_in21k_ft_in1k", 224, 1000,
         DEFAULT),
        ("augreg_in21k_ft_in1k_384", "timm/vit_small_r26_s32_384.augreg_in21k_ft_in1k", 384, 1000),
    ],
    "vit_l32_hybrid": [
        ("augreg_in21k", "timm/vit_large_r50_s32_224.augreg_in21k", 224, 21843),
        ("augreg_in21k_ft_in1k", "timm/vit_large_r50_s32_224.augreg_in21k_ft_in1k", 224, 1000,
         DEFAULT),
        ("augreg_in21k_ft_in1k_384", "timm/vit_large_r50_s32_384.augreg_in21k_ft_in1k", 384, 1000),
    ],
}


def release(model: str, tag: str, hub_id: str, img_size: int, num_classes: int,
            fields: dict | None = None) -> PretrainedTag:
    """A row of RELEASES as a tag: its format and preprocessing from the repo's organisation, its
    class names from its head, timm's ResNet numerics for a hybrid."""
    timm = hub_id.startswith("timm/")
    preprocessing = (dict(crop_pct=1.0 if img_size == 384 else 0.9) if timm
                     else dict(crop_pct=1.0, interpolation="bilinear"))
    return PretrainedTag(model, tag, hub_id, "timm" if timm else "transformers", img_size=img_size,
                         num_classes=num_classes, **preprocessing,
                         labels="imagenet-1k" if num_classes == 1000 else None,
                         options=HYBRID_NUMERICS if timm and MODELS[model].stem == "resnet" else {},
                         **(fields or {}))


PRETRAINED: tuple[PretrainedTag, ...] = tuple(
    release(model, *row) for model, rows in RELEASES.items() for row in rows)
