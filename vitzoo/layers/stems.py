"""Stems: the image as a sequence of tokens, x_p E of eq. (1).

`patch` cuts the image into P x P patches and projects each linearly (a P x P convolution with
stride P); `resnet` is the hybrid of section 3.1, whose patches are taken from a ResNet feature map
(patch size 1 by default, so "/16" is the total downsampling).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vitzoo.config import ViTConfig
from vitzoo.layers.init import lecun_normal_
from vitzoo.layers.resnet import NUMERICS, ResNet
from vitzoo.options import Options, option


def projection(in_channels: int, config: ViTConfig) -> nn.Conv2d:
    proj = nn.Conv2d(in_channels, config.embed_dim, config.patch_size, stride=config.patch_size)
    lecun_normal_(proj.weight)
    nn.init.zeros_(proj.bias)
    return proj


class PatchEmbedding(nn.Module):
    """Linear projection E of flattened P x P patches (eq. 1)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.proj = projection(config.in_chans, config)
        self.stride = (config.patch_size, config.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, D, h, w) -> (B, h * w, D)


@dataclass
class ResNetOptions(Options):
    """`stem_options` of stem="resnet"."""

    KIND = "stem 'resnet'"
    SHAPE = ("layers", "width")  # numerics change the numbers, not the architecture

    layers: tuple[int, ...] = option((), range="> 0", help="blocks per stage (R50: 3,4,9)")
    width: int = option(1, range="> 0", help="width factor: the root has 64 x width channels")
    numerics: str = option("official", choices=tuple(NUMERICS), help=(
        "weight standardisation and GroupNorm eps: the official model's, or timm's (its hybrid "
        "weights need them)"))

    def __post_init__(self) -> None:
        super().__post_init__()
        self.layers = tuple(self.layers)


class HybridEmbedding(nn.Module):
    """The ResNet's feature map, then the patch projection on it (section 3.1)."""

    Options = ResNetOptions

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        resnet = ResNetOptions.from_dict(config.stem_options)
        self.backbone = ResNet(config.in_chans, resnet.layers, resnet.width, resnet.numerics)
        self.proj = projection(self.backbone.out_channels, config)
        stride = self.backbone.stride * config.patch_size
        self.stride = (stride, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.backbone(x)).flatten(2).transpose(1, 2)
