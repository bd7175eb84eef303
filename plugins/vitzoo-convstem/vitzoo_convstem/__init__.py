"""vitzoo plugin: `stem="convstem"`, the convolutional stem of Xiao et al. 2021.

"Early Convolutions Help Transformers See Better" replaces the ViT's patchify stem (one P x P
convolution with stride P) by a small stack of 3x3 convolutions with stride 2, each followed by
BatchNorm and ReLU, and a final 1x1 convolution to the model width D:

    [conv3x3 s2 -> BN -> ReLU] x log2(P)  ->  conv1x1 (C_last -> D, with bias)

P = patch_size must be a power of two >= 2: each stride-2 convolution halves the resolution, so
log2(P) of them give the same token grid as the P x P patches (`stride = (P, P)`).

Channel rule: the widths double from layer to layer and the last 3x3 convolution has D channels,
i.e. D / 2^(n-1), ..., D / 4, D / 2, D for n = log2(P) layers (rounded down, never below
min(D, 8)). For ViT-S/16 (D = 384) that is 48, 96, 192, 384, and for D = 192 it is 24, 48, 96, 192:
the stems of the paper's ViT_C-4GF and ViT_C-1GF. (The paper's larger models add stride-1 layers,
which this plugin does not; it keeps one stride-2 layer per halving.)

The 3x3 convolutions have no bias (BatchNorm follows) and are He-initialised (fan_out, ReLU); the
final 1x1 projection is LeCun-normal with a zero bias, like vitzoo's patch projection.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from vitzoo import hookimpl
from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError

__all__ = ["ConvStem", "stem_channels", "vitzoo_stems"]

MIN_CHANNELS = 8
_TRUNC_STD_CORRECTION = 0.87962566103423978  # variance of a normal truncated at 2 std


def _is_power_of_two(n: int) -> bool:
    return n >= 2 and n & (n - 1) == 0


def stem_channels(embed_dim: int, patch_size: int) -> list[int]:
    """Output channels of the stride-2 3x3 convolutions: doubling, the last one D."""
    if not _is_power_of_two(patch_size):
        raise ConfigError(f"convstem needs a power-of-two patch_size >= 2, got {patch_size}")
    layers = patch_size.bit_length() - 1  # log2(patch_size)
    floor = min(embed_dim, MIN_CHANNELS)
    return [max(floor, embed_dim >> (layers - 1 - i)) for i in range(layers)]


@torch.no_grad()
def _lecun_normal_(weight: torch.Tensor) -> None:
    std = math.sqrt(1.0 / weight[0].numel()) / _TRUNC_STD_CORRECTION
    nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)


class ConvStem(nn.Module):
    """Stride-2 3x3 conv + BN + ReLU, log2(P) times, then a 1x1 conv to D (vitzoo stem contract)."""

    @classmethod
    def check(cls, config: ViTConfig) -> None:
        p = config.patch_size
        if not _is_power_of_two(p):
            below = 1 << (p.bit_length() - 1)
            options = sorted({max(2, below), max(2, below) * 2})
            raise ConfigError(
                f"stem='convstem' needs patch_size to be a power of two >= 2 (it downsamples with "
                f"log2(patch_size) stride-2 3x3 convolutions), got patch_size={p}; use "
                + " or ".join(f"patch_size={o}" for o in options)
            )

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.check(config)
        p = config.patch_size
        self.channels = stem_channels(config.embed_dim, p)
        layers: list[nn.Module] = []
        in_channels = config.in_chans
        for out_channels in self.channels:
            conv = nn.Conv2d(in_channels, out_channels, 3, stride=2, padding=1, bias=False)
            nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
            layers += [conv, nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True)]
            in_channels = out_channels
        self.convs = nn.Sequential(*layers)
        self.proj = nn.Conv2d(in_channels, config.embed_dim, 1)
        _lecun_normal_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)
        self.stride = (p, p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, (H / P) * (W / P), D), tokens in row-major order of the grid."""
        feature_map = self.proj(self.convs(x))  # (B, D, H / P, W / P)
        return feature_map.flatten(2).transpose(1, 2)


@hookimpl
def vitzoo_stems():
    return {"convstem": ConvStem}
