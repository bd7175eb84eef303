"""The interface every weight format implements: the type a plugin provides, below the registry.

A format is registered through the `vitzoo_weight_formats` hook (`vitzoo/hookspecs.py`), the
built-in ones (vitzoo, timm, torchvision, transformers, official) exactly as a plugin's. Reading a
source (`vitzoo.checkpoints.sources`) gives a state dict and the JSON files beside it; the one
registered format that recognises them converts them into `ConvertedWeights`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from vitzoo.weights.converted import ConvertedWeights

# The JSON documents found beside the weights, by file name (config.json, preprocessor_config.json);
# empty for a single file.
Metadata = Mapping[str, dict]


class WeightFormat:
    """A checkpoint format: how to recognise its weights and turn them into vitzoo's.

    `name` is the registered name and the `ConvertedWeights.format` of what `convert` returns. A
    format only reads: a source hands it tensors (or numpy arrays from an .npz) and metadata.
    """

    name: str = ""
    marks: tuple[str, ...] = ()  # tensor names every checkpoint of the format has

    def recognises(self, keys: Collection[str], metadata: Metadata) -> bool:
        """Whether these tensor names (and the metadata) are this format's; by default, whether all
        of `marks` are among them. The formats must not overlap: weights two formats recognise are
        an error naming both."""
        return bool(self.marks) and set(self.marks) <= set(keys)

    def convert(self, state_dict: Mapping[str, Any], metadata: Metadata) -> ConvertedWeights:
        """vitzoo's state dict, the options the weights decide and their token grid. Tensors the
        format does not know are kept under their own names, so the strict loader reports them; a
        KeyError for a tensor the others imply is reported as an incomplete file."""
        raise NotImplementedError

    def hints(self, metadata: Metadata) -> dict[str, Any]:
        """Options for a config inferred from the weights that the weights cannot decide (image
        size, normalisation), from the metadata or the format's conventions."""
        return {}

    def labels(self, metadata: Metadata) -> list[str] | None:
        """The names of the classifier's classes when the metadata gives them (transformers'
        id2label), in class order; None otherwise."""
        return None


SUPPORTED = (
    "supported sources: a directory written by save_pretrained (config.json + model.safetensors); "
    "a transformers ViT directory (config.json + model.safetensors or pytorch_model.bin); "
    "a state dict file (.safetensors, .pth, .pt, .bin) in vitzoo's, timm's, torchvision's or "
    "transformers' names (or a plugin's weight format); an official .npz; "
    "hf-hub:ORG/NAME[@REVISION]"
)
