"""Weights: reading checkpoints of every supported format into vitzoo models.

A source is a path or `hf-hub:ORG/NAME[@REVISION]`. Files and directories are recognised by their
keys, not their names: one module per foreign format (`official`, `timm`, `torchvision`,
`transformers`) says whether keys look like its own (`looks_like`) and converts them to vitzoo's
names and the options the weights decide (`convert` -> `Checkpoint`). `.pth` / `.bin` / `.pt` files
are read with `torch.load(weights_only=True)`: no pickled code runs.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitzoo.config import ConfigError, ViTConfig, shape_differences
from vitzoo.weights import files, official
from vitzoo.weights import timm as timm_format
from vitzoo.weights import torchvision as torchvision_format
from vitzoo.weights import transformers as transformers_format
from vitzoo.weights.checkpoint import HEAD_OPTIONS, Checkpoint, CheckpointError, build_model, converting, read_failed
from vitzoo.weights.infer import infer_config

HUB_PREFIX = "hf-hub:"
SAFETENSORS_SUFFIXES = (".safetensors",)
TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
# weight files looked for in a directory, in order of preference
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin")
SUPPORTED = (
    "supported sources: a directory written by save_pretrained (config.json + model.safetensors); "
    "a transformers ViT directory (config.json + model.safetensors or pytorch_model.bin); "
    "a state dict file (.safetensors, .pth, .pt, .bin) in vitzoo's, timm's, torchvision's or "
    "transformers' names; an official .npz; hf-hub:ORG/NAME[@REVISION]"
)


def _looks_vitzoo(keys) -> bool:
    keys = set(keys)
    return "stem.proj.weight" in keys and any(k.startswith("encoder.") for k in keys)


def _as_vitzoo(state_dict: dict[str, torch.Tensor]) -> Checkpoint:
    """A bare vitzoo state dict (e.g. a model.safetensors without its config.json)."""
    pos = state_dict.get("encoder.pos_embed.weight")
    grid = None
    if pos is not None:
        n = pos.shape[1] - int("cls_token" in state_dict)
        side = int(n**0.5)
        grid = (side, side) if side * side == n else None
    return Checkpoint(format="vitzoo", state_dict=dict(state_dict), config={}, grid=grid)


# (name, looks_like, convert) in the order they are tried
FORMATS = (
    ("vitzoo", _looks_vitzoo, _as_vitzoo),
    ("timm", timm_format.looks_like, timm_format.convert),
    ("torchvision", torchvision_format.looks_like, torchvision_format.convert),
    ("transformers", transformers_format.looks_like, transformers_format.convert),
    ("official", official.looks_official, None),  # official keys inside a state dict file are not expected
)


@dataclass
class Source:
    """What a source holds: the converted weights, a saved vitzoo config when there is one, and hints
    for an inferred config (image size, normalisation) from the source's metadata."""

    checkpoint: Checkpoint
    saved_config: ViTConfig | None = None
    hints: dict[str, Any] = field(default_factory=dict)
    location: str = ""


# ---------------------------------------------------------------------------------------- reading
def _unwrap(obj: Any, path: str) -> dict[str, torch.Tensor]:
    """The tensor dict inside a torch.load result (training checkpoints nest it)."""
    for _ in range(3):
        if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            break
        if isinstance(obj, dict):
            inner = next((obj[k] for k in ("state_dict", "model", "model_state_dict", "module") if isinstance(obj.get(k), dict)), None)
            if inner is not None:
                obj = inner
                continue
        raise CheckpointError(f"{path} does not hold a state dict (a dict of tensor names to tensors)")
    state_dict = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if state_dict and all(k.startswith("module.") for k in state_dict):  # saved from DataParallel / DDP
        state_dict = {k[len("module."):]: v for k, v in state_dict.items()}
    return state_dict


def load_state_dict_file(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a .safetensors or a torch file (`weights_only=True`: no pickled code runs)."""
    path = os.fspath(path)
    if path.endswith(SAFETENSORS_SUFFIXES):
        from safetensors.torch import load_file

        try:
            return load_file(path, device="cpu")
        except Exception as exc:  # safetensors raises its own error types for damaged files
            raise read_failed(path, exc) from exc
    if path.endswith(TORCH_SUFFIXES):
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            text = str(exc)
            if "weights_only" in text or "Unsupported global" in text or "pickle" in text.lower():
                raise CheckpointError(
                    f"{path} holds Python objects besides tensors; vitzoo reads torch files with "
                    f"torch.load(weights_only=True) only and runs no pickled code. Re-save it as a plain "
                    f"state dict (torch.save(model.state_dict(), ...)) or as .safetensors. ({text.splitlines()[0]})"
                ) from exc
            raise read_failed(path, exc) from exc
        return _unwrap(obj, path)
    raise CheckpointError(f"cannot read {path!r}: unknown file type. {SUPPORTED}")


def detect(state_dict: dict[str, torch.Tensor], source: str, document: dict | None = None) -> Checkpoint:
    """Convert a state dict whose format is recognised from its keys."""
    keys = list(state_dict)
    for name, looks_like, convert in FORMATS:
        if looks_like(keys):
            if convert is None:
                raise CheckpointError(f"{source} has official (Flax) names; official checkpoints are read from .npz files")
            with converting(name, source):
                return convert(state_dict, document) if name == "transformers" else convert(state_dict)
    raise CheckpointError(
        f"{source}: the format of these weights is not recognised (keys such as {sorted(keys)[:6]}). {SUPPORTED}"
    )


def _timm_hints(document: dict) -> dict[str, Any]:
    """Image size and normalisation from a timm Hub repo's config.json (`pretrained_cfg`)."""
    cfg = document.get("pretrained_cfg") or {}
    hints: dict[str, Any] = {}
    if isinstance(cfg.get("input_size"), list) and len(cfg["input_size"]) == 3:
        hints["img_size"] = tuple(cfg["input_size"][1:])
    if cfg.get("mean") and cfg.get("std"):
        hints.update(mean=tuple(cfg["mean"]), std=tuple(cfg["std"]))
    return hints


def open_directory(directory: str | os.PathLike) -> Source:
    directory = Path(directory)
    config_path = directory / files.CONFIG_NAME
    document = files.read_json_object(config_path) if config_path.exists() else None
    if document is not None and document.get("format") == files.FORMAT:
        saved_config, checkpoint = files.read_saved(directory)
        return Source(checkpoint, saved_config=saved_config, location=str(directory))
    weights = next((directory / name for name in WEIGHT_FILES if (directory / name).exists()), None)
    if weights is None:
        found = sorted(p.name for p in directory.iterdir())[:10]
        raise CheckpointError(f"{directory} has no weights file ({' or '.join(WEIGHT_FILES)}); it holds {found}. {SUPPORTED}")
    state_dict = load_state_dict_file(weights)
    hints: dict[str, Any] = {}
    if document is not None and transformers_format.is_transformers_config(document):
        checkpoint = detect(state_dict, str(weights), document)
        hints.update(transformers_format.describe(document))
        processor = directory / "preprocessor_config.json"
        if processor.exists():
            proc = files.read_json_object(processor)
            if proc.get("image_mean") and proc.get("image_std"):
                hints.update(mean=tuple(proc["image_mean"]), std=tuple(proc["image_std"]))
    else:
        checkpoint = detect(state_dict, str(weights))
        if document is not None and "architecture" in document:
            hints.update(_timm_hints(document))
    if checkpoint.format == torchvision_format.FORMAT:
        hints.setdefault("mean", torchvision_format.MEAN)
        hints.setdefault("std", torchvision_format.STD)
    return Source(checkpoint, hints=hints, location=str(weights))


def open_source(source: str | os.PathLike, **hub_options: Any) -> Source:
    """Read any supported source: a path, or `hf-hub:ORG/NAME[@REVISION]` (downloaded through the
    Hugging Face cache; `hub_options` go to `vitzoo.hub.download`)."""
    text = os.fspath(source)
    if text.startswith(HUB_PREFIX):
        from vitzoo import hub

        directory = hub.download(text, **hub_options)
        try:
            opened = open_directory(directory)
        except CheckpointError as exc:
            damaged = hub.evict_damaged(directory)
            if damaged:
                raise CheckpointError(
                    f"{exc}\nThe cached {', '.join(damaged)} no longer match(es) the Hub's hash (damaged on disk) "
                    f"and was removed from the cache: the next call downloads it again"
                ) from exc
            raise
        opened.location = f"{text} (cached at {directory})"
        return opened
    if not os.path.exists(text):
        raise FileNotFoundError(f"no checkpoint at {text!r} ({SUPPORTED})")
    if os.path.isdir(text):
        return open_directory(text)
    if text.endswith(".npz"):
        with converting(official.FORMAT, text):
            return Source(official.read(text), location=text)
    checkpoint = detect(load_state_dict_file(text), text)
    hints = {}
    if checkpoint.format == torchvision_format.FORMAT:
        hints = {"mean": torchvision_format.MEAN, "std": torchvision_format.STD}
    return Source(checkpoint, hints=hints, location=text)


def read_checkpoint(source: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint file or directory and convert it to vitzoo's names; the format is detected."""
    return open_source(source).checkpoint


# ---------------------------------------------------------------------------------------- building
def _grid(config: ViTConfig) -> tuple[int, int]:
    from vitzoo.model import VisionTransformer

    with torch.device("meta"):  # the stem knows its stride; building on meta allocates nothing
        return VisionTransformer(config).grid


def _check_options_known(checkpoint: Checkpoint, location: str) -> None:
    """A converter may only decide options that ViTConfig has (a guard for new formats)."""
    unknown = [k for k in checkpoint.config if k not in ViTConfig.field_names()]
    if unknown:
        raise CheckpointError(
            f"the {checkpoint.format} weights at {location} need model options this vitzoo does not have "
            f"({', '.join(f'{k}={checkpoint.config[k]!r}' for k in unknown)}); upgrade vitzoo"
        )


def load_pretrained(
    config: ViTConfig | None,
    source: str | os.PathLike,
    requested: dict[str, Any],
    strict: bool = True,
    **hub_options: Any,
):
    """Build the model of `config` holding the weights at `source` (see `checkpoint.build_model`).

    With `config=None` the model is the one the source describes: a saved directory's config, a
    transformers config.json, or else a config inferred from the weights' shapes (`requested`
    options, e.g. `num_heads`, override it).
    """
    src = open_source(source, **hub_options)
    location = src.location or os.fspath(source)
    if src.saved_config is not None:
        # the saved config decides the model (also under a model name); the user's options change it
        saved = src.saved_config
        differ = shape_differences(saved, config) if config is not None else []
        if differ:  # the name is then only a label, which may surprise (training warns alike)
            warnings.warn(f"{location} holds another model than the one requested: {', '.join(differ)}; "
                          "loading the saved model", stacklevel=3)
        built = saved.replace(**{k: v for k, v in requested.items() if k not in HEAD_OPTIONS})
        checkpoint = src.checkpoint
        checkpoint.config = {k: getattr(saved, k) for k in HEAD_OPTIONS}
        checkpoint.grid = _grid(saved)
        return build_model(built, checkpoint, requested, location, strict=strict)
    checkpoint = src.checkpoint
    _check_options_known(checkpoint, location)
    if config is None:
        overrides = {k: v for k, v in requested.items() if k not in HEAD_OPTIONS}
        try:
            config = infer_config(checkpoint, overrides, src.hints)
        except ConfigError as exc:
            raise CheckpointError(f"cannot build a model for the weights at {location}: {exc}") from exc
    return build_model(config, checkpoint, requested, location, strict=strict)


__all__ = [
    "Checkpoint",
    "CheckpointError",
    "FORMATS",
    "SUPPORTED",
    "Source",
    "detect",
    "load_pretrained",
    "load_state_dict_file",
    "open_source",
    "read_checkpoint",
]
