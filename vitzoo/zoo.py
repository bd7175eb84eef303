"""The zoo: the named models of the paper (Table 1) and of the official repository, and the weights
its authors released for them (pretrained tags, `vitzoo.tags`).

A name is a complete `ViTConfig`; `vitzoo.create(name, **options)` changes options on top of it.
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
    return ViTConfig(stem="resnet", patch_size=1, stem_options={"layers": resnet_layers}, **SIZES[size])


MODELS: dict[str, ViTConfig] = {
    "vit_ti16": vit("ti", 16),
    "vit_s16": vit("s", 16),
    "vit_s32": vit("s", 32),
    "vit_b8": vit("b", 8),
    "vit_b16": vit("b", 16),
    "vit_b32": vit("b", 32),
    "vit_l16": vit("l", 16),
    "vit_l32": vit("l", 32),
    "vit_h14": vit("h", 14),
    "vit_b16_hybrid": hybrid("b", R50_S16),
    "vit_b32_hybrid": hybrid("b", R50_S32),
    "vit_l16_hybrid": hybrid("l", R50_S16),
    "vit_l32_hybrid": hybrid("l", R50_S32),
    "vit_s32_r26_hybrid": hybrid("s", R26_S32),
    "vit_b32_r26_hybrid": hybrid("b", R26_S32),
}

# timm's architecture names of the same models (its name ends in the resolution: `vit_tiny_patch16_224`,
# `vit_base_patch16_384`), so that a timm user's name builds the model it means (vitzoo.catalog.from_timm_name)
TIMM_ARCHITECTURES = {
    "vit_tiny_patch16": "vit_ti16",
    "vit_small_patch16": "vit_s16",
    "vit_small_patch32": "vit_s32",
    "vit_base_patch8": "vit_b8",
    "vit_base_patch16": "vit_b16",
    "vit_base_patch32": "vit_b32",
    "vit_large_patch16": "vit_l16",
    "vit_large_patch32": "vit_l32",
    "vit_huge_patch14": "vit_h14",
    "vit_base_r50_s16": "vit_b16_hybrid",
    "vit_large_r50_s32": "vit_l32_hybrid",
    "vit_small_r26_s32": "vit_s32_r26_hybrid",
    "vit_base_r26_s32": "vit_b32_r26_hybrid",
}


# ------------------------------------------------------------------------------- released weights
# The paper's ImageNet-21k checkpoints (`orig_in21k`, 224 px) and their ImageNet fine-tunes at 384 px
# as released (`orig_in21k_ft_in1k`), in the Hub repos that hold them today: timm's ports (timm format,
# preprocessing from their pretrained_cfg) and, where timm has none, google's transformers ports
# (ViTImageProcessor: straight bilinear resize, id2label with the ImageNet-1k names). timm's
# ImageNet-21k ports have no classifier (the released head was dropped). Accuracies: the paper's
# Table 5 (ImageNet-21k pre-training, ImageNet fine-tuning at 384 px).
TABLE_5 = "paper, Table 5"
README_224 = "official README: expected for the -224 fine-tune"
def _is_hybrid(model: str) -> bool:
    return MODELS[model].stem == "resnet"


def _timm_port(model: str, hub_name: str, tag: str, img_size: int, num_classes: int, **changes) -> PretrainedTag:
    """Weights in timm's port, `timm/{hub_name}`, with timm's pretrained_cfg: crop 1.0 at 384 px, else
    0.9; ImageNet-1k's class names for a 1000-way head; timm's ResNet numerics for the hybrids."""
    return PretrainedTag(model, tag, f"timm/{hub_name}", "timm", img_size=img_size, num_classes=num_classes,
                         crop_pct=1.0 if img_size == 384 else 0.9,
                         labels="imagenet-1k" if num_classes == 1000 else None,
                         options=HYBRID_NUMERICS if _is_hybrid(model) else {}, **changes)


def _in21k(model: str, timm_name: str, **changes) -> PretrainedTag:
    return _timm_port(model, f"{timm_name}.orig_in21k", "orig_in21k", 224, 0, **changes)


def _in1k_timm(model: str, timm_name: str, img_size: int, tag: str = "orig_in21k_ft_in1k", **changes) -> PretrainedTag:
    return _timm_port(model, f"{timm_name}.orig_in21k_ft_in1k", tag, img_size, 1000, **changes)


def _in1k_google(model: str, repo: str, **changes) -> PretrainedTag:
    return PretrainedTag(model, "orig_in21k_ft_in1k", f"google/{repo}", "transformers", img_size=384,
                         num_classes=1000, crop_pct=1.0, interpolation="bilinear", labels="imagenet-1k", **changes)


def _augreg(model: str, arch: str, img_size: int, pretraining: str, **changes) -> PretrainedTag:
    """The official repository's later AugReg weights ("How to train your ViT"), in timm's ports:
    `augreg_in21k` (ImageNet-21k, its 21,843-way head kept), `augreg_in21k_ft_in1k` and `augreg2_in21k_ft_in1k`
    (fine-tuned on ImageNet), `augreg_in1k` (ImageNet only); a `_384` suffix for the 384 px fine-tunes."""
    tag = pretraining + ("_384" if img_size == 384 else "")
    num_classes = 21843 if pretraining == "augreg_in21k" else 1000
    return _timm_port(model, f"{arch}_{img_size}.{pretraining}", tag, img_size, num_classes, **changes)


# (model, timm's architecture, [(resolution, pre-training)]) of every AugReg release of a vitzoo model
_IN21K, _FT, _FT2, _IN1K = "augreg_in21k", "augreg_in21k_ft_in1k", "augreg2_in21k_ft_in1k", "augreg_in1k"
AUGREG = (
    ("vit_ti16", "vit_tiny_patch16", [(224, _IN21K), (224, _FT), (384, _FT)]),
    ("vit_s16", "vit_small_patch16", [(224, _IN21K), (224, _FT), (384, _FT), (224, _IN1K), (384, _IN1K)]),
    ("vit_s32", "vit_small_patch32", [(224, _IN21K), (224, _FT), (384, _FT)]),
    ("vit_b8", "vit_base_patch8", [(224, _IN21K), (224, _FT), (224, _FT2)]),
    ("vit_b16", "vit_base_patch16", [(224, _IN21K), (224, _FT), (384, _FT), (224, _FT2), (224, _IN1K), (384, _IN1K)]),
    ("vit_b32", "vit_base_patch32", [(224, _IN21K), (224, _FT), (384, _FT), (224, _IN1K), (384, _IN1K)]),
    ("vit_l16", "vit_large_patch16", [(224, _IN21K), (224, _FT), (384, _FT)]),
    ("vit_s32_r26_hybrid", "vit_small_r26_s32", [(224, _IN21K), (224, _FT), (384, _FT)]),
    ("vit_l32_hybrid", "vit_large_r50_s32", [(224, _IN21K), (224, _FT), (384, _FT)]),
)
# models the paper released no weights for: the AugReg ImageNet fine-tune at 224 px is their default
_AUGREG_DEFAULTS = {"vit_ti16", "vit_s16", "vit_s32", "vit_b8", "vit_s32_r26_hybrid", "vit_l32_hybrid"}

PRETRAINED: tuple[PretrainedTag, ...] = (
    _in21k("vit_b16", "vit_base_patch16_224"),
    _in1k_timm("vit_b16", "vit_base_patch16_384", 384, default=True, accuracy=83.97, accuracy_source=TABLE_5),
    _in1k_timm("vit_b16", "vit_base_patch16_224", 224, tag="orig_in21k_ft_in1k_224", accuracy=81.2,
               accuracy_source=README_224),
    _in21k("vit_b32", "vit_base_patch32_224"),
    _in1k_google("vit_b32", "vit-base-patch32-384", default=True, accuracy=81.28, accuracy_source=TABLE_5),
    _in21k("vit_l16", "vit_large_patch16_224"),
    _in1k_google("vit_l16", "vit-large-patch16-384", default=True, accuracy=85.15, accuracy_source=TABLE_5),
    _in21k("vit_l32", "vit_large_patch32_224"),
    _in1k_timm("vit_l32", "vit_large_patch32_384", 384, default=True, accuracy=80.99, accuracy_source=TABLE_5),
    _in21k("vit_h14", "vit_huge_patch14_224", default=True),  # its only released weights
    _in21k("vit_b16_hybrid", "vit_base_r50_s16_224"),
    _in1k_timm("vit_b16_hybrid", "vit_base_r50_s16_384", 384, default=True),
) + tuple(
    _augreg(model, arch, size, pretraining, default=model in _AUGREG_DEFAULTS and (size, pretraining) == (224, _FT))
    for model, arch, releases in AUGREG for size, pretraining in releases
)
