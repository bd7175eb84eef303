"""Reading weights safely: a file, a directory, a Hub repo or tensors in memory, converted by the
one format that recognises their names. Nothing in a file runs: `.safetensors`; `.pth`, `.pt`,
`.bin`, `.ckpt` through `torch.load(weights_only=True)`; `.npz` as arrays, never pickles."""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitzoo.config import ViTConfig
from vitzoo.errors import CheckpointError
from vitzoo.weights import ConvertedWeights, WeightFormat, hub, native
from vitzoo.weights.layout import CONFIG_NAME, HUB_PREFIX, METADATA_FILES, WEIGHT_FILES
from vitzoo.weights.timm import TimmFormat
from vitzoo.weights.transformers import TransformersFormat

SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt", ".npz")
SUPPORTED = ("vitzoo reads a save_pretrained or transformers directory, a weights file "
             f"({', '.join(SUFFIXES)}) of a registered format, or hf-hub:ORG/NAME")
NESTED = ("state_dict", "model", "model_state_dict")  # where training checkpoints keep it


@dataclass
class Source:
    """The weights a source holds, where, and what came with them: a saved vitzoo config, options
    for an inferred config (image size, normalisation), the head's class names."""

    checkpoint: ConvertedWeights
    location: str
    saved_config: ViTConfig | None = None
    hints: dict[str, Any] = field(default_factory=dict)
    labels: list[str] | None = None


def read_failed(path, exc: BaseException) -> CheckpointError:
    """A file that did not read: the system's reason, or bytes that are not of its type (never
    the reader's own text: torch's advises running the pickles)."""
    if isinstance(exc, OSError):
        return CheckpointError(f"cannot read {path}: {exc.strerror or exc}")
    return CheckpointError(f"{path} is damaged, truncated or not a file of its type; save or "
                           "download it again")


def read_json(path) -> dict:
    """A JSON object file; a CheckpointError says what is wrong with it."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise read_failed(path, exc) from exc
    except ValueError as exc:  # not UTF-8, not JSON
        raise CheckpointError(f"{path} is not valid JSON in UTF-8 ({exc})") from exc
    if not isinstance(document, dict):
        raise CheckpointError(f"{path} is not a JSON object")
    return document


def load_file(path) -> dict[str, Any]:
    """The tensors of a weights file, or the arrays of an .npz, by its type."""
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1]
    if suffix not in SUFFIXES:
        raise CheckpointError(f"cannot read {path!r}: unknown file type. {SUPPORTED}")
    try:
        if suffix == ".safetensors":
            from safetensors.torch import load_file as load_safetensors

            return load_safetensors(path, device="cpu")
        if suffix == ".npz":
            if not zipfile.is_zipfile(path):  # numpy would try it as a pickle
                raise CheckpointError(f"{path} is no .npz archive, or a damaged one")
            with np.load(path, allow_pickle=False) as npz:
                return {k: npz[k] for k in npz.keys()}
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except CheckpointError:
        raise
    except Exception as exc:  # each reader raises its own types for damaged bytes
        if "allow_pickle" in str(exc) or "GLOBAL" in str(exc):
            raise CheckpointError(f"{path} holds Python objects besides tensors, which vitzoo "
                                  "never loads: save the tensors alone") from None
        raise read_failed(path, exc) from exc
    nested = [loaded[k] for k in NESTED if isinstance(loaded, dict) and k in loaded]
    return nested[0] if nested else loaded


def convert(state_dict: Mapping[str, Any], metadata: dict, location: str,
            formats: dict[str, WeightFormat]) -> Source:
    """The weights converted by the one format of `formats` that recognises their names."""
    if not isinstance(state_dict, Mapping) or not state_dict or not all(
            isinstance(v, (torch.Tensor, np.ndarray)) for v in state_dict.values()):
        raise CheckpointError(f"{location} holds no state dict (tensor names to tensors)")
    state_dict = {str(k).removeprefix("module."): torch.as_tensor(v)  # DDP's prefix
                  for k, v in state_dict.items()}
    found = [f for f in formats.values() if f.recognises(list(state_dict), metadata)]
    if len(found) != 1:
        raise CheckpointError(
            f"{location}: the weights look like {' and like '.join(f.name for f in found)}; "
            "uninstall or fix one of the plugins" if found else f"{location}: the format of "
            f"these weights is not recognised (keys such as {sorted(state_dict)[:6]}). {SUPPORTED}")
    with converting(found[0].name, location):
        checkpoint = found[0].convert(state_dict, metadata)
    return Source(checkpoint, location, hints=found[0].hints(metadata),
                  labels=found[0].labels(metadata))


@contextmanager
def converting(fmt: str, source: str):
    """A tensor the converter needs but the file lacks: an incomplete file, not a KeyError."""
    try:
        yield
    except KeyError as exc:
        raise CheckpointError(f"{source} has the names of a {fmt} checkpoint but lacks the tensor "
                              f"{exc.args[0]!r}: save or download it again") from None


def open_directory(directory, formats: dict[str, WeightFormat]) -> Source:
    """A save_pretrained directory (its config decides the model), or weights with another
    library's metadata beside them."""
    directory = Path(directory)
    metadata = {name: read_json(directory / name) for name in METADATA_FILES
                if (directory / name).exists()}
    weights = next((directory / n for n in WEIGHT_FILES if (directory / n).exists()), None)
    if weights is None:
        raise CheckpointError(f"{directory} has no weights file ({' or '.join(WEIGHT_FILES)})")
    if not native.is_saved(metadata.get(CONFIG_NAME)):
        return convert(load_file(weights), metadata, str(weights), formats)
    config, names, labels = native.read_config(metadata[CONFIG_NAME], directory / CONFIG_NAME)
    state_dict = load_file(weights)
    if names != native.FORMAT:  # written in timm's or transformers' names: renamed back
        fmt = {"timm": TimmFormat, "transformers": TransformersFormat}[names]()
        if not fmt.recognises(list(state_dict), {}):
            raise CheckpointError(f"{directory / CONFIG_NAME} says the weights are in {names}'s "
                                  "names, but they are not: save or push the model again")
        with converting(names, str(weights)):
            state_dict = fmt.convert(state_dict, {}).state_dict
    native.check_describes(config, state_dict, directory / CONFIG_NAME)
    return Source(ConvertedWeights(native.FORMAT, state_dict), str(directory), config,
                  labels=labels)


def open_source(source, formats: dict[str, WeightFormat]) -> Source:
    """A path, hf-hub:ORG/NAME[@REVISION] (through the Hugging Face cache, hashes checked), or
    weights in memory: a state dict or a module (a vitzoo model's config decides its model); read
    by the one of the registered `formats` that recognises them."""
    if isinstance(source, (Mapping, torch.nn.Module)):
        location = f"the {type(source).__name__} given"
        weights = source.state_dict() if isinstance(source, torch.nn.Module) else source
        if isinstance(getattr(source, "config", None), ViTConfig):  # a vitzoo model: itself
            return Source(ConvertedWeights(native.FORMAT, dict(weights)), location, source.config)
        return convert(weights, {}, location, formats)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"weights are a path, 'hf-hub:ORG/NAME', a state dict or a module holding "
                        f"one (pretrained=True: the tag's), not {type(source).__name__}")
    text = os.fspath(source)
    if text.startswith(HUB_PREFIX):
        directory = hub.download(text)
        try:
            opened = open_directory(directory, formats)
        except CheckpointError as exc:  # the files match the Hub's hashes
            raise CheckpointError(f"{exc}\n(the repo itself holds them so: pass a revision "
                                  "(@REVISION) that holds a working model)") from exc
        opened.location = f"{text} (cached at {directory})"
        return opened
    if not os.path.exists(text):
        raise FileNotFoundError(f"no checkpoint at {text!r}. {SUPPORTED}")
    if os.path.isdir(text):
        return open_directory(text, formats)
    return convert(load_file(text), {}, text, formats)
