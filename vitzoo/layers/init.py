"""Initialisers of the official (Flax) implementation, in PyTorch terms."""

from __future__ import annotations

import math

import torch
from torch import nn

# Flax's truncated normal is cut at two standard deviations; this factor restores the variance
TRUNC_STD_CORRECTION = 0.87962566103423978


@torch.no_grad()
def lecun_normal_(weight: torch.Tensor) -> torch.Tensor:
    """Flax `lecun_normal`: truncated normal with variance 1 / fan_in (Linear and Conv weights)."""
    std = math.sqrt(1.0 / weight[0].numel()) / TRUNC_STD_CORRECTION
    return nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)


@torch.no_grad()
def xavier_uniform_blocks_(weight: torch.Tensor, blocks: int) -> torch.Tensor:
    """Xavier-uniform on each of `blocks` row blocks: a fused q/k/v weight initialised as three
    D x D matrices, as the official code initialises query, key and value."""
    for block in weight.chunk(blocks, dim=0):
        nn.init.xavier_uniform_(block)
    return weight
