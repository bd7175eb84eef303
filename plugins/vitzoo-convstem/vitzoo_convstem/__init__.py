"""vitzoo plugin: `stem="convstem"`, the convolutional stem of Xiao et al. 2021, "Early
Convolutions Help Transformers See Better": instead of one P x P patch convolution,

    [conv3x3 stride 2 -> BN -> ReLU] x log2(P)  ->  conv1x1 to D (with bias)

so P = patch_size must be a power of two >= 2. The widths double up to D: D / 2^(n-1), ..., D / 2,
D (never below min(D, 8)); 48, 96, 192, 384 for ViT-S/16, the paper's ViT_C-4GF.

Option `extra_layers` (`stem_options={"extra_layers": k}`, `--stem.extra-layers k`): k stride-1
3x3 conv layers, one after each of the 2nd, 3rd, ... stride-2 ones (strides 2, 2, 1, 2, 1, 2 for
P = 16, k = 2), as the paper's larger stems.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vitzoo import hookimpl
from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError
from vitzoo.layers.init import lecun_normal_
from vitzoo.options import Options, option


def stem_channels(embed_dim: int, patch_size: int) -> list[int]:
    """The widths of the stride-2 3x3 convolutions: doubling, the last one D."""
    layers = patch_size.bit_length() - 1  # log2(patch_size)
    return [max(min(embed_dim, 8), embed_dim >> (layers - 1 - i)) for i in range(layers)]


@dataclass
class ConvStemOptions(Options):
    """`stem_options` of stem="convstem"."""

    KIND = "stem 'convstem'"

    extra_layers: int = option(0, range=">= 0", help=(
        "stride-1 3x3 conv + BN + ReLU layers, one after each of the 2nd, 3rd, ... stride-2 ones "
        "(not the last), as the paper's larger stems"))


class ConvStem(nn.Module):
    Options = ConvStemOptions

    @classmethod
    def check(cls, config: ViTConfig) -> None:
        p = config.patch_size
        if p < 2 or p & (p - 1):
            below = max(2, 1 << (p.bit_length() - 1))
            raise ConfigError(f"stem='convstem' needs patch_size to be a power of two >= 2 (it "
                              f"has log2(patch_size) stride-2 convolutions), got patch_size={p}; "
                              f"use patch_size={below} or patch_size={below * 2}")
        extra = ConvStemOptions.from_dict(config.stem_options).extra_layers
        most = max(0, p.bit_length() - 3)  # after each stride-2 conv but the first and the last
        if extra > most:
            raise ConfigError(f"stem 'convstem' option extra_layers={extra}: patch_size={p} has "
                              f"room for {most}; use extra_layers <= {most}")

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        p, extra = config.patch_size, ConvStemOptions.from_dict(config.stem_options).extra_layers
        layers, in_channels = [], config.in_chans
        for i, width in enumerate(stem_channels(config.embed_dim, p)):
            for stride in (2, 1) if 1 <= i <= extra else (2,):
                conv = nn.Conv2d(in_channels, width, 3, stride=stride, padding=1, bias=False)
                nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
                layers += [conv, nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
                in_channels = width
        self.convs = nn.Sequential(*layers)
        self.proj = nn.Conv2d(in_channels, config.embed_dim, 1)
        lecun_normal_(self.proj.weight)  # as vitzoo's patch projection
        nn.init.zeros_(self.proj.bias)
        self.stride = (p, p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, (H / P) * (W / P), D), tokens in row-major order of the grid."""
        return self.proj(self.convs(x)).flatten(2).transpose(1, 2)


@hookimpl
def vitzoo_stems():
    return {"convstem": ConvStem}
