"""Weights as tensors: every supported checkpoint format converted into vitzoo's names. Pure: no
file is read or written here, and nothing here knows the Hub, the registry or the model.

    layout       the file names of a model directory or Hub repo, the Hub prefix, the grid
    converted    `ConvertedWeights`: weights in vitzoo's names + the options they decide
    formats      the `WeightFormat` interface a format implements (hook `vitzoo_weight_formats`)
    vitzoo_format, official, timm, torchvision, transformers   the built-in formats, one module each
    infer        the model a state dict describes

Files and the Hub are `vitzoo.checkpoints`; building the model from a source is
`vitzoo.pretrained`. A plugin's format: a `WeightFormat` whose `convert` returns `ConvertedWeights`.
"""

from __future__ import annotations

from vitzoo.weights.converted import ConvertedWeights
from vitzoo.weights.formats import WeightFormat

__all__ = ["ConvertedWeights", "WeightFormat"]
