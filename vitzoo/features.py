"""Feature maps of chosen blocks, as timm's `features_only=True` gives them: `create(name,
features_only=True, out_indices=...)` returns a `FeatureExtractor`, whose forward is the list of the
chosen blocks' outputs as (B, D, h, w) maps, and whose `feature_info` answers as timm's FeatureInfo.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

DEFAULT_OUT_INDICES = 3  # timm's default for a ViT: the last three blocks


class FeatureInfo:
    """The model's `feature_info` (module, num_chs, reduction per block) read as timm's FeatureInfo
    reads it: `idx=None` one value per returned map, an int that block's, a list those blocks'."""

    def __init__(self, info: list[dict[str, Any]], out_indices: Sequence[int]) -> None:
        self.info = [dict(entry, index=i) for i, entry in enumerate(info)]
        self.out_indices = tuple(out_indices)

    def get(self, key: str, idx: int | Sequence[int] | None = None):
        if isinstance(idx, int):
            return self.info[idx][key]
        return [self.info[i][key] for i in (self.out_indices if idx is None else idx)]

    def channels(self, idx: int | Sequence[int] | None = None):
        return self.get("num_chs", idx)

    def reduction(self, idx: int | Sequence[int] | None = None):
        return self.get("reduction", idx)

    def module_name(self, idx: int | Sequence[int] | None = None):
        return self.get("module", idx)

    def __getitem__(self, item: int) -> dict[str, Any]:
        return self.info[item]

    def __len__(self) -> int:
        return len(self.info)


class FeatureExtractor(nn.Module):
    """A model cut after its last chosen block, returning the chosen blocks' tokens as maps.

    `out_indices` as timm's (an int n: the last n blocks, a list: those); `norm` applies the final
    LayerNorm to each map (without it the norm is pruned, as timm's); `output_fmt` "NCHW" or "NLC";
    the class token is dropped. The maps follow the input's size."""

    def __init__(self, model: nn.Module, out_indices: int | Sequence[int] = DEFAULT_OUT_INDICES,
                 norm: bool = False, output_fmt: str = "NCHW") -> None:
        super().__init__()
        self.out_indices = tuple(model.prune_intermediate_layers(out_indices, prune_norm=not norm))
        self.model, self.norm, self.output_fmt = model, norm, output_fmt
        self.feature_info = FeatureInfo(model.feature_info, self.out_indices)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.model.forward_intermediates(x, indices=list(self.out_indices), norm=self.norm,
                                                output_fmt=self.output_fmt, intermediates_only=True)

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """The preprocessing the weights expect (timm's data helpers read it here too)."""
        return self.model.pretrained_cfg
