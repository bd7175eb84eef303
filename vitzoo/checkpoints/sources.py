"""Reading a source: a file, a directory or a Hub repo, into the weights it holds and the metadata
beside them, converted by the one registered weight format that recognises them (`WeightFormat`,
`vitzoo.weights.formats`; formats are looked up here, above the registry that holds them).

A source is a path or `hf-hub:ORG/NAME[@REVISION]`. Files are read by their type, never by running
code: `.safetensors`; `.pth` / `.pt` / `.bin` / `.ckpt` with `torch.load(weights_only=True)`; `.npz`
as arrays only. What the weights are is decided by their names, not by the file's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from vitzoo.checkpoints import native
from vitzoo.config import ViTConfig
from vitzoo.errors import CheckpointError, PluginError
from vitzoo.weights import hub
from vitzoo.io import interrupted_swap
from vitzoo.registry import get_registry
from vitzoo.weights.converted import ConvertedWeights, converting, read_failed
from vitzoo.weights.formats import SUPPORTED, Metadata, WeightFormat
from vitzoo.weights.layout import (CONFIG_NAME, HUB_PREFIX, METADATA_FILES, WEIGHT_FILES,
                                   WEIGHTS_NAME)

SAFETENSORS_SUFFIXES = (".safetensors",)
TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
NPZ_SUFFIXES = (".npz",)
ZIP_STARTS = (b"PK\x03\x04", b"PK\x05\x06")  # .npz (arrays or empty) and torch.save's: zip files
PICKLE_START = b"\x80"  # the PROTO opcode a pickle (torch's legacy format) starts with


@dataclass
class Source:
    """What a source holds: the converted weights, a saved vitzoo config when there is one, and
    hints for an inferred config (image size, normalisation) from the source's metadata."""

    checkpoint: ConvertedWeights
    saved_config: ViTConfig | None = None
    hints: dict[str, Any] = field(default_factory=dict)
    location: str = ""
    labels: list[str] | None = None  # the head's class names, when the metadata gives them


# ---------------------------------------------------------------------------------------- formats
def registered_formats() -> dict[str, WeightFormat]:
    """The registered formats by name."""
    formats = get_registry().tables()["weight_format"]
    for name, fmt in formats.items():
        if not isinstance(fmt, WeightFormat) or fmt.name != name:
            raise PluginError(f"weight format {name!r} must be a "
                              f"vitzoo.weights.formats.WeightFormat whose name is {name!r}, got "
                              f"{fmt!r}")
    return formats


def recognise(state_dict: Mapping[str, Any], metadata: Metadata, source: str,
              note: str = "") -> WeightFormat:
    """The one registered format that recognises these weights; `note` adds to the error if none."""
    keys = list(state_dict)
    found = [fmt for fmt in registered_formats().values() if fmt.recognises(keys, metadata)]
    if len(found) > 1:
        raise CheckpointError(f"{source}: the weights look like "
                              f"{' and like '.join(f.name for f in found)}; two weight formats "
                              "claim them, uninstall or fix one of the plugins")
    if not found:
        raise CheckpointError(f"{source}: the format of these weights is not recognised (keys such "
                              f"as {sorted(keys)[:6]}){note}. {SUPPORTED}")
    return found[0]


def recognise_and_convert(state_dict: Mapping[str, Any], metadata: Metadata, source: str,
                          note: str = "") -> tuple[ConvertedWeights, WeightFormat]:
    """The format that recognises these weights, and what its `convert` makes of them."""
    fmt = recognise(state_dict, metadata, source, note)
    with converting(fmt.name, source):
        return fmt.convert(state_dict, metadata), fmt


# ---------------------------------------------------------------------------------------- files
def _unwrap(obj: Any, path: str) -> dict[str, torch.Tensor]:
    """The tensor dict inside a torch.load result (training checkpoints nest it)."""
    for _ in range(3):
        if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            break
        if isinstance(obj, dict):
            inner = next((obj[k] for k in ("state_dict", "model", "model_state_dict",
                                           "module") if isinstance(obj.get(k), dict)), None)
            if inner is not None:
                obj = inner
                continue
        raise CheckpointError(f"{path} does not hold a state dict (a dict of tensor names to "
                              "tensors)")
    state_dict = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if state_dict and all(k.startswith("module.") for k in state_dict):  # from DataParallel / DDP
        state_dict = {k[len("module."):]: v for k, v in state_dict.items()}
    return state_dict


def _read_torch(path: str) -> dict[str, torch.Tensor]:
    try:
        with open(path, "rb") as f:
            start = f.read(4)
    except OSError as exc:
        raise read_failed(path, exc) from exc
    if start not in ZIP_STARTS and start[:1] != PICKLE_START:
        what = "empty" if not start else "neither the zip archive torch.save writes nor a pickle"
        raise CheckpointError(f"{path} is not a torch checkpoint: the file is {what}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        text = str(exc)
        # a class torch's safe unpickler will not build
        if "Unsupported global" in text or "GLOBAL " in text:
            raise CheckpointError(
                f"{path} holds Python objects besides tensors; vitzoo reads torch files with "
                "torch.load(weights_only=True) only and runs no pickled code. Re-save it as a "
                "plain state dict (torch.save(model.state_dict(), ...)) or as .safetensors. "
                f"({text.splitlines()[0]})"
            ) from exc
        raise read_failed(path, exc) from exc
    return _unwrap(obj, path)


def _read_npz(path: str) -> dict[str, np.ndarray]:
    """The arrays of an .npz file. Anything else (empty, not a zip, pickled objects) is a
    CheckpointError saying it is not a checkpoint: numpy's own advice would be to allow pickles."""
    try:
        with open(path, "rb") as f:
            start = f.read(4)
    except OSError as exc:
        raise read_failed(path, exc) from exc
    if start not in ZIP_STARTS:
        what = "empty" if not start else "not a zip archive of arrays, as an .npz is"
        raise CheckpointError(f"{path} is not a checkpoint: the file is {what}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.keys()}
    except ValueError as exc:  # numpy refuses object arrays without allow_pickle: never allow them
        raise CheckpointError(f"{path} is not a checkpoint: it holds pickled Python objects, which "
                              "vitzoo never loads (an official checkpoint holds arrays of numbers "
                              "only)") from exc
    except Exception as exc:  # zipfile and numpy raise several types for a truncated archive
        raise read_failed(path, exc) from exc


def load_state_dict_file(path: str | os.PathLike) -> dict[str, Any]:
    """The tensors of a .safetensors or torch file (`weights_only=True`: no pickled code runs), or
    the arrays of an .npz."""
    path = os.fspath(path)
    if path.endswith(SAFETENSORS_SUFFIXES):
        try:
            return load_file(path, device="cpu")
        except Exception as exc:  # safetensors raises its own error types for damaged files
            raise read_failed(path, exc) from exc
    if path.endswith(TORCH_SUFFIXES):
        return _read_torch(path)
    if path.endswith(NPZ_SUFFIXES):
        return _read_npz(path)
    raise CheckpointError(f"cannot read {path!r}: unknown file type. {SUPPORTED}")


def _unrecognised_note(path: str) -> str:
    # the official checkpoints are the only .npz files expected, so say what it is not
    if not path.endswith(NPZ_SUFFIXES):
        return ""
    return "; it is an .npz file but not an official ViT checkpoint"


def open_file(path: str) -> Source:
    """A weights file with no metadata beside it."""
    checkpoint, fmt = recognise_and_convert(load_state_dict_file(path), {}, path,
                                            _unrecognised_note(path))
    return Source(checkpoint, hints=fmt.hints({}), location=path, labels=fmt.labels({}))


# -------------------------------------------------------------------------------------- directories
def _metadata(directory: Path) -> dict[str, dict]:
    return {name: native.read_json_object(directory / name) for name in METADATA_FILES
            if (directory / name).exists()}


def _in_vitzoo_names(state_dict: dict[str, torch.Tensor], names: str,
                     source: str) -> dict[str, torch.Tensor]:
    """A saved model's weights in vitzoo's names: those written in timm's or transformers' layout
    (`vitzoo.checkpoints.layouts`) renamed back by that format's converter (its options are not
    used: the saved config decides the model)."""
    if names == native.FORMAT:
        return state_dict
    fmt = registered_formats()[names]
    if not fmt.recognises(list(state_dict), {}):
        raise CheckpointError(f"{source}: config.json says the weights are in {names}'s names, but "
                              f"they are not (keys such as {sorted(state_dict)[:6]}); save or push "
                              "the model again")
    with converting(names, source):
        return fmt.convert(state_dict, {}).state_dict


def open_directory(directory: str | os.PathLike) -> Source:
    """A directory written by save_pretrained (its config decides the model), or weights with the
    metadata of another library beside them."""
    directory = Path(directory)
    metadata = _metadata(directory)
    if native.is_saved(metadata.get(CONFIG_NAME)):
        saved_config = native.read_config(directory / CONFIG_NAME)
        weights = directory / WEIGHTS_NAME
        if not weights.exists():
            raise CheckpointError(f"{directory} has a {CONFIG_NAME} but no {WEIGHTS_NAME}")
        state_dict = _in_vitzoo_names(load_state_dict_file(weights),
                                      native.weight_names_of(metadata[CONFIG_NAME], weights),
                                      str(weights))
        checkpoint = ConvertedWeights(format=native.FORMAT, state_dict=state_dict, config={})
        native.check_describes(saved_config, checkpoint.state_dict, directory / CONFIG_NAME,
                               weights)
        return Source(checkpoint, saved_config=saved_config, location=str(directory),
                      labels=native.labels_of(metadata[CONFIG_NAME]))
    weights = next((directory / name for name in WEIGHT_FILES if (directory / name).exists()), None)
    if weights is None:
        found = sorted(p.name for p in directory.iterdir())[:10]
        raise CheckpointError(f"{directory} has no weights file ({' or '.join(WEIGHT_FILES)}); it "
                              f"holds {found}. {SUPPORTED}")
    checkpoint, fmt = recognise_and_convert(load_state_dict_file(weights), metadata, str(weights))
    return Source(checkpoint, hints=fmt.hints(metadata), location=str(weights),
                  labels=fmt.labels(metadata))


# --------------------------------------------------------------------------------------- any source
def open_hub(source: str, **hub_options: Any) -> Source:
    """A Hub repo, downloaded through the Hugging Face cache (`hub_options` go to
    `vitzoo.weights.hub.download`, which loads no cached file that does not match its hash)."""
    directory = hub.download(source, **hub_options)
    try:
        opened = open_directory(directory)
    except CheckpointError as exc:  # the files match the Hub's hashes: a new download cannot help
        raise CheckpointError(f"{exc}\n(the files of {source} in the cache are the ones the Hub "
                              "holds, hashes checked: the repo itself holds them so; pass a "
                              "revision (@REVISION) that holds a working model, or ask its owner "
                              "to push one)") from exc
    opened.location = f"{source} (cached at {directory})"
    return opened


def open_in_memory(weights: Mapping[str, Any] | torch.nn.Module) -> Source:
    """Weights in memory: a state dict (of any format vitzoo reads: timm's, torchvision's,
    transformers', the official names, vitzoo's) or the module that holds one, converted as a file's
    would be. A vitzoo model's own config decides its model, as a saved directory's does."""
    location = f"the {type(weights).__name__} given"
    saved_config = None
    if isinstance(weights, torch.nn.Module):
        config = getattr(weights, "config", None)
        saved_config = config if isinstance(config, ViTConfig) else None
        weights = weights.state_dict()
    not_tensors = sorted(str(k) for k, v in weights.items()
                         if not isinstance(v, (torch.Tensor, np.ndarray)))
    if not weights or not_tensors:
        raise CheckpointError(f"{location} is no state dict (tensor names to tensors): "
                              + (f"{len(not_tensors)} entries are not tensors, e.g. "
                                 f"{not_tensors[:3]}" if weights else "it is empty")
                              + ". Pass model.state_dict(), the model, or a path")
    state_dict = {str(k): torch.as_tensor(v) for k, v in weights.items()}
    if all(k.startswith("module.") for k in state_dict):  # from DataParallel / DDP
        state_dict = {k[len("module."):]: v for k, v in state_dict.items()}
    if saved_config is not None:
        checkpoint = ConvertedWeights(format=native.FORMAT, state_dict=state_dict, config={})
        return Source(checkpoint, saved_config=saved_config, location=location)
    checkpoint, fmt = recognise_and_convert(state_dict, {}, location)
    return Source(checkpoint, hints=fmt.hints({}), location=location, labels=fmt.labels({}))


def open_source(source: str | os.PathLike | Mapping[str, Any] | torch.nn.Module,
                **hub_options: Any) -> Source:
    """Read any supported source: a path, `hf-hub:ORG/NAME[@REVISION]` (see `open_hub`), or weights
    in memory (a state dict or a module: `open_in_memory`)."""
    if isinstance(source, (Mapping, torch.nn.Module)):
        return open_in_memory(source)
    text = os.fspath(source)
    if text.startswith(HUB_PREFIX):
        return open_hub(text, **hub_options)
    if not os.path.exists(text):
        kept = interrupted_swap(text)
        if kept is not None:
            raise FileNotFoundError(f"no checkpoint at {text!r}: an interrupted save left the "
                                    f"earlier one in {kept}; the next save to {text!r} puts it "
                                    "back first, or move it back yourself")
        raise FileNotFoundError(f"no checkpoint at {text!r} ({SUPPORTED})")
    return open_directory(text) if os.path.isdir(text) else open_file(text)


def read_checkpoint(source: str | os.PathLike) -> ConvertedWeights:
    """A checkpoint file or directory converted to vitzoo's names; the format is detected."""
    return open_source(source).checkpoint
