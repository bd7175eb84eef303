"""Weights: reading checkpoints of every supported format into vitzoo models.

    layout       the names of the files a model directory or Hub repo holds, the Hub prefix, the grid
    checkpoint   `Checkpoint` (weights in vitzoo's names + the options they decide)
    formats      the `WeightFormat` interface and the registered formats (hook `vitzoo_weight_formats`)
    files        vitzoo's own format: save_pretrained's directory
    official, timm, torchvision, transformers   the foreign formats, one module each
    sources      reading a file, directory or Hub repo into a converted `Checkpoint`
    infer        the model a state dict describes

Building the model from a source is `vitzoo.pretrained` (the one weights module that imports the
model). A plugin's weight format is a `WeightFormat` whose `convert` returns a `Checkpoint`; both
are here.
"""

from __future__ import annotations

from vitzoo.weights.checkpoint import Checkpoint
from vitzoo.weights.formats import WeightFormat

__all__ = ["Checkpoint", "WeightFormat"]
