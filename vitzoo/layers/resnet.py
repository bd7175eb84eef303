"""The BiT ResNet of the hybrid models (section 3.1), as the official `models_resnet.py`: every
convolution weight-standardized, GroupNorm of 32 groups, post-activation bottlenecks with the stride
on the 3x3 conv, and TensorFlow "SAME" padding (asymmetric for even inputs: a symmetric one gives
other numbers). Module names follow the official parameter names (conv_root, gn_root, conv1, ...).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from vitzoo.layers.init import lecun_normal_

GROUPS = 32


# w' = (w - mean) / (std + ws_eps), or / sqrt(var + ws_eps) with ws_eps_in_sqrt; GroupNorm's eps
Numerics = NamedTuple("Numerics", [("ws_eps", float), ("ws_eps_in_sqrt", bool), ("gn_eps", float)])
# the ResNet stem's `numerics` option: the official model's, or timm's ResNetV2 (StdConv2dSame eps
# 1e-8, GroupNormAct eps 1e-5), which timm's converted hybrid weights need
NUMERICS = {"official": Numerics(1e-5, False, 1e-6), "timm": Numerics(1e-8, True, 1e-5)}


def same_pads(x: torch.Tensor, kernel: int, stride: int) -> list[int]:
    """TensorFlow "SAME" padding for F.pad: output size ceil(in / stride), the odd pixel after."""
    pads = []
    for size in (x.shape[-1], x.shape[-2]):
        total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
        pads += [total // 2, total - total // 2]
    return pads


def pad_same(x: torch.Tensor, kernel: int, stride: int, value: float = 0.0) -> torch.Tensor:
    pads = same_pads(x, kernel, stride)
    return F.pad(x, pads, value=value) if any(pads) else x


def conv2d_same(x: torch.Tensor, weight: torch.Tensor, stride: int) -> torch.Tensor:
    left, right, top, bottom = same_pads(x, weight.shape[-1], stride)
    if left == right and top == bottom:  # symmetric: the convolution pads by itself, no copy
        return F.conv2d(x, weight, None, stride, padding=(top, left))
    return F.conv2d(F.pad(x, [left, right, top, bottom]), weight, None, stride)


# padding that depends on the input's size: one node each in a torch.fx graph, whose input has none
torch.fx.wrap("conv2d_same")
torch.fx.wrap("pad_same")


class StdConv2d(nn.Conv2d):
    """Weight-standardized convolution with "SAME" padding, no bias."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 numerics: Numerics = NUMERICS["official"]) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding=0, bias=False)
        self.numerics = numerics
        lecun_normal_(self.weight)

    def standardized_weight(self) -> torch.Tensor:
        # in float32 whatever the weight's dtype: bf16 weights round the result once
        w, dtype, eps = self.weight.float(), self.weight.dtype, self.numerics.ws_eps
        if self.numerics.ws_eps_in_sqrt:
            # batch normalisation with the filters as channels: one fused kernel each way
            flat = F.batch_norm(w.reshape(1, w.shape[0], -1), None, None, training=True,
                                momentum=0.0, eps=eps)
            return flat.reshape(w.shape).to(dtype)
        std, mean = torch.std_mean(w, dim=(1, 2, 3), keepdim=True, correction=0)
        return ((w - mean) / (std + eps)).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv2d_same(x, self.standardized_weight(), self.stride[0])


def group_norm(channels: int, numerics: Numerics) -> nn.GroupNorm:
    return nn.GroupNorm(GROUPS, channels, eps=numerics.gn_eps)


class Bottleneck(nn.Module):
    """Post-activation bottleneck unit; `features` is the inner width, the output has 4x."""

    def __init__(self, in_channels: int, features: int, stride: int,
                 numerics: Numerics = NUMERICS["official"]) -> None:
        super().__init__()
        out_channels = 4 * features
        self.conv1 = StdConv2d(in_channels, features, 1, numerics=numerics)
        self.gn1 = group_norm(features, numerics)
        self.conv2 = StdConv2d(features, features, 3, stride, numerics=numerics)
        self.gn2 = group_norm(features, numerics)
        self.conv3 = StdConv2d(features, out_channels, 1, numerics=numerics)
        self.gn3 = group_norm(out_channels, numerics)
        nn.init.zeros_(self.gn3.weight)  # each residual branch starts as the identity
        self.needs_projection = in_channels != out_channels or stride != 1
        if self.needs_projection:
            self.conv_proj = StdConv2d(in_channels, out_channels, 1, stride, numerics=numerics)
            self.gn_proj = group_norm(out_channels, numerics)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = self.gn_proj(self.conv_proj(x)) if self.needs_projection else x
        # in place on GroupNorm's outputs, which its backward pass does not need
        y = F.relu(self.gn1(self.conv1(x)), inplace=True)
        y = F.relu(self.gn2(self.conv2(y)), inplace=True)
        return F.relu(self.gn3(self.conv3(y)).add_(residual), inplace=True)


class ResNet(nn.Module):
    """Root (7x7/2 conv, GroupNorm, ReLU, 3x3/2 max-pool), then stages of bottlenecks, stage i of
    inner width 64 * width_factor * 2**i, each but the first halving the resolution."""

    def __init__(self, in_chans: int, layers: tuple[int, ...], width_factor: int = 1,
                 numerics: str = "official") -> None:
        super().__init__()
        numerics = NUMERICS[numerics]
        width = channels = 64 * width_factor
        self.conv_root = StdConv2d(in_chans, width, 7, stride=2, numerics=numerics)
        self.gn_root = group_norm(width, numerics)
        self.stages = nn.ModuleList()
        for i, num_units in enumerate(layers):
            units = []
            for u in range(num_units):
                units.append(Bottleneck(channels, width * 2**i, 2 if i > 0 and u == 0 else 1,
                                        numerics))
                channels = 4 * width * 2**i
            self.stages.append(nn.Sequential(*units))
        self.out_channels = channels
        self.stride = 4 * 2 ** max(len(layers) - 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.gn_root(self.conv_root(x)), inplace=True)
        x = F.max_pool2d(pad_same(x, 3, 2, value=float("-inf")), kernel_size=3, stride=2)
        for stage in self.stages:
            x = stage(x)
        return x
