"""What a weight format is written to, the built-in ones as a plugin's: a `WeightFormat`,
registered through the hook `vitzoo_weight_formats`, whose `convert` returns `ConvertedWeights`,
vitzoo's names and the options the weights decide. The formats are one module each (`official`,
`torchvision`, `timm`, `transformers`, `native`); `files` reads any of them safely, `infer` gives
the model a state dict describes, `card` and `publish` write and push, `hub` is the Hub.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

Metadata = Mapping[str, dict]  # the JSON files beside the weights by name (config.json, ...)


@dataclass
class ConvertedWeights:
    """Weights in vitzoo's names, their format, and the options they decide."""

    format: str
    state_dict: dict[str, torch.Tensor]
    config: dict[str, Any] = field(default_factory=dict)  # act, norm_eps, pool, head, ...
    grid: tuple[int, int] | None = None  # the token grid of the position embeddings


class WeightFormat:
    """A checkpoint format: `name` (its registered name), how to recognise it and convert it. No
    two formats may recognise the same weights."""

    name: str = ""
    marks: tuple[str, ...] = ()  # tensor names every checkpoint of the format has

    def recognises(self, keys: Collection[str], metadata: Metadata) -> bool:
        return bool(self.marks) and set(self.marks) <= set(keys)

    def convert(self, state_dict: Mapping[str, Any], metadata: Metadata) -> ConvertedWeights:
        """vitzoo's names, with tensors the format does not know kept for the strict loader."""
        raise NotImplementedError

    def hints(self, metadata: Metadata) -> dict[str, Any]:
        """Options the weights cannot decide (image size, normalisation) for an inferred model."""
        return {}

    def labels(self, metadata: Metadata) -> list[str] | None:
        """The classifier's class names, when the metadata gives them."""
        return None
