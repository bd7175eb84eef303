"""Stems: the image as a sequence of tokens, x_p E of eq. (1).

`patch` cuts the image into P x P patches and projects each linearly; a P x P convolution with
stride P is exactly that projection. `resnet` is the hybrid of section 3.1: the patches are taken
from a ResNet feature map (patch size 1 by default, so "/16" is the total downsampling).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError
from vitzoo.layers.init import lecun_normal_
from vitzoo.layers.resnet import NUMERICS, ResNet
from vitzoo.options import Options, check_fields, closest


def _projection(in_channels: int, config: ViTConfig) -> nn.Conv2d:
    proj = nn.Conv2d(in_channels, config.embed_dim, config.patch_size, stride=config.patch_size)
    lecun_normal_(proj.weight)
    nn.init.zeros_(proj.bias)
    return proj


def _tokens(feature_map: torch.Tensor) -> torch.Tensor:
    """(B, D, h, w) -> (B, h * w, D), row-major over the grid."""
    return feature_map.flatten(2).transpose(1, 2)


class PatchEmbedding(nn.Module):
    """Linear projection E of flattened P x P patches (eq. 1)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.proj = _projection(config.in_chans, config)
        self.stride = (config.patch_size, config.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _tokens(self.proj(x))


@dataclass
class ResNetOptions(Options):
    """The hybrid's ResNet (`stem_options` of stem="resnet")."""

    KIND = "stem 'resnet'"
    SHAPE = ("layers", "width")  # numerics change the numbers, not the architecture

    layers: tuple[int, ...] = field(default=(), metadata={
        "help": "blocks per stage (R50's three stages: 3,4,9); () is the root alone"})
    width: int = field(default=1, metadata={
        "help": "width factor: the root has 64 x width channels"})
    # "official": (w - mean) / (std + 1e-5), GroupNorm eps 1e-6; "timm": (w - mean) /
    # sqrt(var + 1e-8), eps 1e-5 (what timm's hybrid weights need)
    numerics: str = field(default="official", metadata={
        "help": "weight standardisation and GroupNorm eps: the official model's, or timm's (its "
                "hybrid weights need it)"})

    def __post_init__(self) -> None:
        check_fields(self, {"width": "> 0"})
        if not isinstance(self.layers, (tuple, list)) or any(
                not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in self.layers):
            raise ConfigError("stem 'resnet' option layers must be positive block counts per "
                              f"stage, got {self.layers!r}")
        self.layers = tuple(self.layers)
        if self.numerics not in NUMERICS:
            raise ConfigError(f"stem 'resnet' option numerics={self.numerics!r} is not one of "
                              f"{tuple(NUMERICS)}." + closest(self.numerics, NUMERICS))


class HybridEmbedding(nn.Module):
    """ResNet feature map, then the patch projection on it (the hybrid of section 3.1)."""

    Options = ResNetOptions

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        resnet = ResNetOptions.from_dict(config.stem_options)
        self.backbone = ResNet(config.in_chans, resnet.layers, resnet.width, resnet.numerics)
        self.proj = _projection(self.backbone.out_channels, config)
        stride = self.backbone.stride * config.patch_size
        self.stride = (stride, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _tokens(self.proj(self.backbone(x)))
