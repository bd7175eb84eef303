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
the stems of the paper's ViT_C-4GF and ViT_C-1GF.

Option `extra_layers` (`stem_options={"extra_layers": k}`, `--stem.extra-layers k`): the paper's larger
stems (ViT_C-18GF and -36GF) interleave stride-1 3x3 convolutions between the stride-2 ones (strides
2, 2, 1, 2, 1, 2); this adds k of them, one after each of the 2nd, 3rd, ... stride-2 convolutions,
keeping its width (conv, BN, ReLU; the token grid is unchanged). k is at most log2(P) - 2, so that
P = 16 with k = 2 has the paper's stride pattern. The widths still follow the doubling rule above, not
the paper's exact 18GF/36GF widths. Default 0: the 1GF/4GF stems.

The 3x3 convolutions have no bias (BatchNorm follows) and are He-initialised (fan_out, ReLU); the
final 1x1 projection is LeCun-normal with a zero bias, like vitzoo's patch projection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from vitzoo import hookimpl
from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError
from vitzoo.options import Options, check_fields

__all__ = ["ConvStem", "ConvStemOptions", "stem_channels", "vitzoo_stems"]

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


@dataclass
class ConvStemOptions(Options):
    """`stem_options` of stem="convstem"."""

    KIND = "stem 'convstem'"

    extra_layers: int = field(default=0, metadata={"help": "stride-1 3x3 conv + BN + ReLU layers, one after each "
                                                          "of the 2nd, 3rd, ... stride-2 ones (not the last), as "
                                                          "the paper's larger stems"})

    def __post_init__(self) -> None:
        check_fields(self, {"extra_layers": ">= 0"})


class ConvStem(nn.Module):
    """Stride-2 3x3 conv + BN + ReLU, log2(P) times (with `extra_layers` stride-1 ones among them), then
    a 1x1 conv to D (vitzoo stem contract)."""

    Options = ConvStemOptions

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
        extra, most = ConvStemOptions.from_dict(config.stem_options).extra_layers, max(0, p.bit_length() - 3)
        if extra > most:
            raise ConfigError(f"stem 'convstem' option extra_layers={extra} is more than the {most} places patch_size={p} "
                              f"has for one (after each stride-2 convolution but the first and the last); use "
                              f"extra_layers <= {most}")

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.check(config)
        p = config.patch_size
        self.channels = stem_channels(config.embed_dim, p)
        extra = ConvStemOptions.from_dict(config.stem_options).extra_layers
        plan = []  # (width, stride): a stride-1 layer after the 2nd, 3rd, ... stride-2 one keeps its width
        for i, width in enumerate(self.channels):
            plan += [(width, 2), (width, 1)] if 1 <= i <= extra else [(width, 2)]
        layers: list[nn.Module] = []
        in_channels = config.in_chans
        for out_channels, stride in plan:
            conv = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
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
