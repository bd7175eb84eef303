"""The interface every weight format implements, and the lookup of the registered formats.

A format is registered through the `vitzoo_weight_formats` hook (`vitzoo/hookspecs.py`), the
built-in ones (vitzoo, timm, torchvision, transformers, official) exactly as a plugin's. Reading a
source (`vitzoo.weights.sources`) gives a state dict and the JSON files beside it; the one format
that recognises them converts them into a `Checkpoint`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from vitzoo.errors import CheckpointError, PluginError
from vitzoo.registry import get_registry
from vitzoo.weights.checkpoint import Checkpoint, converting

# The JSON documents found beside the weights, by file name (config.json, preprocessor_config.json);
# empty for a single file.
Metadata = Mapping[str, dict]


class WeightFormat:
    """A checkpoint format: how to recognise its weights and turn them into vitzoo's.

    `name` is the registered name and the `Checkpoint.format` of what `convert` returns. A format
    only reads: a source hands it tensors (torch tensors, or numpy arrays from an .npz) and metadata.
    """

    name: str = ""
    marks: tuple[str, ...] = ()  # tensor names every checkpoint of the format has

    def recognises(self, keys: Collection[str], metadata: Metadata) -> bool:
        """Whether these tensor names (and the metadata) are this format's; by default, whether all of
        `marks` are among them. The formats must not overlap: weights two formats recognise are an
        error naming both."""
        return bool(self.marks) and set(self.marks) <= set(keys)

    def convert(self, state_dict: Mapping[str, Any], metadata: Metadata) -> Checkpoint:
        """vitzoo's state dict, the options the weights decide and their token grid. Tensors the
        format does not know are kept under their own names, so the strict loader reports them; a
        KeyError for a tensor the others imply is reported as an incomplete file."""
        raise NotImplementedError

    def hints(self, metadata: Metadata) -> dict[str, Any]:
        """Options for a config inferred from the weights that the weights cannot decide (image size,
        normalisation), from the metadata or the format's conventions."""
        return {}

    def labels(self, metadata: Metadata) -> list[str] | None:
        """The names of the classifier's classes when the metadata gives them (transformers'
        id2label), in class order; None otherwise."""
        return None


def registered() -> dict[str, WeightFormat]:
    """The registered formats by name."""
    formats = get_registry().tables()["weight_format"]
    for name, fmt in formats.items():
        if not isinstance(fmt, WeightFormat) or fmt.name != name:
            raise PluginError(f"weight format {name!r} must be a vitzoo.weights.formats.WeightFormat whose name is "
                              f"{name!r}, got {fmt!r}")
    return formats


def recognise(state_dict: Mapping[str, Any], metadata: Metadata, source: str, note: str = "") -> WeightFormat:
    """The one registered format that recognises these weights; `note` adds to the error when none does."""
    keys = list(state_dict)
    found = [fmt for fmt in registered().values() if fmt.recognises(keys, metadata)]
    if len(found) > 1:
        raise CheckpointError(f"{source}: the weights look like {' and like '.join(f.name for f in found)}; "
                              "two weight formats claim them, uninstall or fix one of the plugins")
    if not found:
        raise CheckpointError(f"{source}: the format of these weights is not recognised (keys such as "
                              f"{sorted(keys)[:6]}){note}. {SUPPORTED}")
    return found[0]


def convert(state_dict: Mapping[str, Any], metadata: Metadata, source: str, note: str = "") -> tuple[Checkpoint, WeightFormat]:
    """The recognised format's `Checkpoint` of these weights, and the format."""
    fmt = recognise(state_dict, metadata, source, note)
    with converting(fmt.name, source):
        return fmt.convert(state_dict, metadata), fmt


SUPPORTED = (
    "supported sources: a directory written by save_pretrained (config.json + model.safetensors); "
    "a transformers ViT directory (config.json + model.safetensors or pytorch_model.bin); "
    "a state dict file (.safetensors, .pth, .pt, .bin) in vitzoo's, timm's, torchvision's or "
    "transformers' names (or a plugin's weight format); an official .npz; hf-hub:ORG/NAME[@REVISION]"
)
