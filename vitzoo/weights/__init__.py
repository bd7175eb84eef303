"""Weights: reading checkpoints of every supported format into vitzoo models.

    layout       the names of the files a model directory or Hub repo holds, the Hub prefix, the grid
    checkpoint   `Checkpoint` (weights in vitzoo's names + the options they decide), `CheckpointError`
    formats      the `WeightFormat` interface and the registered formats (hook `vitzoo_weight_formats`)
    files        vitzoo's own format: save_pretrained's directory
    official, timm, torchvision, transformers   the foreign formats, one module each
    sources      reading a file, directory or Hub repo into a converted `Checkpoint`
    infer        the model a state dict describes

Building the model from a source is `vitzoo.pretrained` (the one weights module that imports the
model). The names this package once held are still found here, with a DeprecationWarning.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from vitzoo.errors import CheckpointError
from vitzoo.weights import formats, layout
from vitzoo.weights.checkpoint import Checkpoint
from vitzoo.weights.formats import SUPPORTED, WeightFormat

# name -> the module it moved to
_MOVED = {
    "load_pretrained": "vitzoo.pretrained",
    "Source": "vitzoo.weights.sources",
    "load_state_dict_file": "vitzoo.weights.sources",
    "open_source": "vitzoo.weights.sources",
    "read_checkpoint": "vitzoo.weights.sources",
    "HUB_PREFIX": "vitzoo.weights.layout",
    "WEIGHT_FILES": "vitzoo.weights.layout",
}


def __getattr__(name: str) -> Any:
    # a module attribute looked up at use, so that this package imports neither the Hub nor the model
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"vitzoo.weights.{name} moved to {_MOVED[name]}.{name}; import it from there",
                  DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(_MOVED[name]), name)


def detect(state_dict: dict, source: str, document: dict | None = None) -> Checkpoint:
    """Deprecated: `vitzoo.weights.formats.convert(state_dict, metadata, source)`."""
    warnings.warn("vitzoo.weights.detect is deprecated; use vitzoo.weights.formats.convert",
                  DeprecationWarning, stacklevel=2)
    return formats.convert(state_dict, {layout.CONFIG_NAME: document} if document else {}, source)[0]


__all__ = ["SUPPORTED", "Checkpoint", "CheckpointError", "WeightFormat", "detect"]
