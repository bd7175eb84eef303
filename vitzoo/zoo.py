"""The zoo: the named models of the paper (Table 1) and of the official repository.

A name is a complete `ViTConfig`; `vitzoo.create(name, **options)` changes options on top of it.
"""

from __future__ import annotations

from vitzoo.config import ViTConfig

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
    return ViTConfig(stem="resnet", patch_size=1, resnet_layers=resnet_layers, **SIZES[size])


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
