"""Weights: reading checkpoints of every supported format into vitzoo models, and writing vitzoo's own.

    layout       the names of the files a model directory or Hub repo holds, the Hub prefix, the grid
    converted    `ConvertedWeights`: weights in vitzoo's names + the options they decide
    formats      the `WeightFormat` interface a format implements (hook `vitzoo_weight_formats`)
    native       vitzoo's own format: save_pretrained's directory, and a bare vitzoo state dict
    official, timm, torchvision, transformers   the foreign formats, one module each
    card         the model card README.md that save_pretrained writes
    publish      pushing save_pretrained's directory (or a model, saved first) to the Hub
    sources      reading a file, directory or Hub repo into `ConvertedWeights`, by the registered
                 format that recognises them
    infer        the model a state dict describes

Building the model from a source is `vitzoo.pretrained` (the one weights module that imports the
model). A plugin's weight format is a `WeightFormat` whose `convert` returns `ConvertedWeights`; both
are here for it.
"""

from __future__ import annotations

from vitzoo.weights.converted import ConvertedWeights
from vitzoo.weights.formats import WeightFormat

__all__ = ["ConvertedWeights", "WeightFormat"]
