"""Pooling (class token or global average, Appendix D.3) and classification heads."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError
from vitzoo.layers.init import lecun_normal_
from vitzoo.options import Options, option


class Pool(nn.Module):
    num_prefix_tokens = 0  # the class tokens the model prepends

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()


class ClassTokenPool(Pool):
    """y = z_L^0: the representation is the (normed) class token."""

    num_prefix_tokens = 1
    tokens_read = 1  # the last block need not compute the patch tokens' outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0]


class GlobalAveragePool(Pool):
    """No class token: the mean of all tokens after the final LayerNorm (the official `gap`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


def classifier(in_features: int, num_classes: int) -> nn.Module:
    """A zero-initialised linear classifier (the official `head`), or none for num_classes=0."""
    if num_classes == 0:
        return nn.Identity()
    fc = nn.Linear(in_features, num_classes)
    nn.init.zeros_(fc.weight)
    nn.init.zeros_(fc.bias)
    return fc


class LinearHead(nn.Module):
    """One linear layer, as used when fine-tuning."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.num_features = config.embed_dim
        self.fc = classifier(config.embed_dim, config.num_classes)

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return x if pre_logits else self.fc(x)


@dataclass
class MLPHeadOptions(Options):
    """`head_options` of head="mlp"."""

    KIND = "head 'mlp'"

    representation_size: int | None = option(None, range="> 0",
                                             help="the width of the pre-logits layer (required)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.representation_size is None:
            raise ConfigError("head='mlp' needs head_options={'representation_size': N} "
                              "(--head.representation-size N)")


class MLPHead(nn.Module):
    """Pre-logits Dense + tanh of `representation_size`, then the classifier (pre-training)."""

    Options = MLPHeadOptions

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        size = MLPHeadOptions.from_dict(config.head_options).representation_size
        self.num_features = size
        self.pre_logits = nn.Linear(config.embed_dim, size)
        lecun_normal_(self.pre_logits.weight)  # Flax Dense: lecun-normal kernel, zero bias
        nn.init.zeros_(self.pre_logits.bias)
        self.fc = classifier(size, config.num_classes)

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = torch.tanh(self.pre_logits(x))
        return x if pre_logits else self.fc(x)
