"""From a name or a source to a model in one pass, as timm's _factory.py: `resolve` works out the
config and the weights once, `Resolved.build` builds the model of that config. What the weights
decide (GELU, eps, pooling, head) follows them unless an option says otherwise; loading is strict;
a head of another size is replaced by a zero-initialised one and the position embeddings are
resampled to the size asked for, each said unless asked for.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from vitzoo.config import ViTConfig, from_timm_names
from vitzoo.errors import CheckpointError, ConfigError, HubError
from vitzoo.features import DEFAULT_OUT_INDICES, FeatureExtractor
from vitzoo.model import VisionTransformer
from vitzoo.options import described
from vitzoo.registry import lookup, resolve_config, shape_differences, weight_formats
from vitzoo.weights import (HEAD_OPTIONS, ConvertedWeights, check_state_dict, decided_options,
                            fits)
from vitzoo.weights.files import open_source
from vitzoo.weights.infer import infer
from vitzoo.weights.layout import HUB_PREFIX
from vitzoo.zoo import PretrainedTag, preprocessing

log = logging.getLogger("vitzoo")


@dataclass
class Resolved:
    """A model worked out before anything is built: its config, the weights it will hold (None:
    initialised), where they are from, their class names and tag."""

    config: ViTConfig
    checkpoint: ConvertedWeights | None = None
    location: str = ""
    labels: list[str] | None = None
    load_size: tuple[int, int] | None = None  # a saved model's own; else the weights' grid's
    tag: PretrainedTag | None = None
    strict: bool = True
    requested: dict[str, Any] = field(default_factory=dict)  # the options the user set

    def build(self, config: ViTConfig | None = None) -> VisionTransformer:
        """The model of `config` (default: the resolved one; training changes its classes)
        holding the weights: built, set to their grid, loaded, then resampled to its own."""
        config = config or self.config
        model = VisionTransformer(config)
        n = config.num_classes
        labels = self.labels if self.labels is not None and len(self.labels) == n else None
        if labels is None and self.tag is not None and n == self.tag.num_classes:
            labels = self.tag.categories()
        model.labels, model.pretrained_tag = labels, self.tag
        if self.checkpoint is None:
            return model
        at, grid = self.load_size, self.checkpoint.grid
        if at is None and grid is not None:
            at = (grid[0] * model.stride[0], grid[1] * model.stride[1])
        if at is not None and tuple(at) != config.img_size:
            model.set_img_size(at)
        weights, expected = dict(self.checkpoint.state_dict), model.state_dict()
        decided = self.checkpoint.config
        if any(getattr(config, k) != decided.get(k, getattr(config, k)) for k in HEAD_OPTIONS):
            log.warning("vitzoo: the weights' head has %s classes, the model %s: head replaced by "
                        "a zero-initialised %s layer", decided.get("num_classes"), n, config.head)
            weights = {**{k: v for k, v in weights.items() if not k.startswith("head.")},
                       **{k: v for k, v in expected.items() if k.startswith("head.")}}
        if self.strict:
            check_state_dict(model, weights, self.location)
        else:
            fitting = {k: v for k, v in weights.items() if k in expected and fits(v, expected[k])}
            if set(weights) != set(fitting) or set(expected) != set(fitting):
                log.warning("vitzoo: strict=False: not loaded %s; left at init %s",
                            sorted(set(weights) - set(fitting)),
                            sorted(set(expected) - set(fitting)))
            weights = fitting
        if not any(p.is_meta for p in model.parameters()):  # device="meta": nothing to copy
            model.load_state_dict(weights, strict=self.strict)
        if model.config.img_size != config.img_size:
            trained = model.config.img_size
            model.set_img_size(config.img_size)  # each position embedding by its own rule
            (log.info if "img_size" in self.requested else log.warning)(
                "vitzoo: the weights from %s are at %s px, the model at %s px: position "
                "embeddings resampled (img_size=%s keeps theirs)", self.location, trained,
                config.img_size, trained[0] if trained[0] == trained[1] else trained)
        return model


SOURCES = (str, os.PathLike, Mapping, torch.nn.Module)  # what `from_pretrained` reads
SAID = {"source": "a path, 'hf-hub:ORG/NAME', a state dict or a model holding one",
        "strict": "True or False"}


def _check_arguments(**given) -> None:
    """The arguments that are no model options, checked as options are."""
    said = {"pretrained": "True (the tag's weights), False or None (none), or " + SAID["source"],
            **SAID}
    types = {"pretrained": (type(None), bool, *SOURCES), "source": SOURCES, "strict": bool}
    for argument, value in given.items():
        if not isinstance(value, types[argument]):
            raise ConfigError(f"{argument} must be {said[argument]}, got {described(value)} "
                              f"({type(value).__name__})")


def _resolve(name: str | None, weights, options: dict[str, Any], strict: bool) -> Resolved:
    """The config, once: the named model's (its tag's, a timm name's), then the options; with
    `weights` (True: the tag's), a saved model's own, or without a name the one they describe,
    with their preprocessing and what they decide."""
    base, tag, hub, changes = None, None, weights is True, [options]
    if name is not None:
        base, tag, revision, implied = lookup(name, hub)
        changes = [implied, options]
        weights = tag.source(revision) if hub else weights
    resolved = Resolved(base, tag=tag if weights is not None else None, strict=strict,
                        requested=options)
    if weights is not None:
        try:
            src = open_source(weights, weight_formats())
        except HubError as exc:
            if tag is None:
                raise
            if not exc.not_cached:  # a wrong revision, token, ...: the Hub's answer says it
                raise HubError(f"{tag.name}: {exc}") from exc
            raise HubError(f"{tag.name}: {exc}\nTo work offline: HF_HUB_OFFLINE=1 with a cache "
                           f"that holds {tag.hub_id} (`vitzoo pull {tag.hub_id}` once online), "
                           f"or vitzoo.create({tag.name!r}, pretrained=PATH) on a local copy of "
                           "its files", not_cached=True) from exc
        checkpoint, saved = src.checkpoint, src.saved_config
        if hub and checkpoint.format != tag.format:
            raise CheckpointError(f"{src.location} holds {checkpoint.format} weights, not the "
                                  f"{tag.format} weights of {tag.name}: pass a revision "
                                  "(@REVISION) that holds them")
        others = {k: v for k, v in options.items() if k not in HEAD_OPTIONS}
        if saved is not None:  # a saved model is itself, whatever name was requested
            if base is not None and (differ := shape_differences(saved, base, *changes)):
                warnings.warn(f"{src.location} holds another model than the one requested: "
                              f"{', '.join(differ)}; loading the saved model", stacklevel=4)
            base, changes, resolved.load_size = saved, [others], saved.img_size
            checkpoint.config = {k: getattr(saved, k) for k in HEAD_OPTIONS}
        elif base is None:  # the model the weights describe
            base, changes = ViTConfig(), [infer(checkpoint, {**src.hints, **others},
                                                src.location)]
        else:  # the named model, with the preprocessing the source states unless asked
            changes.append({k: v for k, v in src.hints.items() if k not in options})
        changes.append(decided_options(checkpoint.config, options))
        resolved.checkpoint, resolved.labels = checkpoint, src.labels
        resolved.location = src.location
    try:
        resolved.config = resolve_config(base, *changes)
    except ConfigError as exc:
        where = f"{resolved.location}: " if resolved.location else ""
        raise ConfigError(f"{where}{exc}") from exc
    own = {"img_size": (tag.img_size,) * 2, "num_classes": tag.num_classes} if tag else {}
    differ = [k for k, v in own.items() if k not in options and getattr(resolved.config, k) != v]
    if weights is not None and not hub and differ:  # a local copy of the tag's files
        log.warning("vitzoo: the weights at %s give %s, not the tag %s's %s: kept (pass the option "
                    "to change it)", resolved.location,
                    ", ".join(f"{k}={getattr(resolved.config, k)!r}" for k in differ), tag.name,
                    ", ".join(f"{k}={own[k]!r}" for k in differ))
    return resolved


def resolve(name: str, pretrained: bool | str | os.PathLike | None = None, *,
            strict: bool = True, **options) -> Resolved:
    """What `create` builds, worked out once without building it (see `create`)."""
    _check_arguments(pretrained=pretrained, strict=strict)
    if not isinstance(name, str):
        raise ConfigError(f"name must be a model or tag name (a str; vitzoo list), got "
                          f"{type(name).__name__}")
    options = from_timm_names(options)
    source, repo = (None if pretrained is False else pretrained), name.startswith(HUB_PREFIX)
    if repo:  # as timm: a Hub repo's model, with its weights if pretrained
        if pretrained not in (None, False, True):
            raise ConfigError(f"{name!r} names a Hub repo's model: pass pretrained=True for its "
                              "weights, or give a model name with other weights")
        source = name
        name = None
    resolved = _resolve(name, source, options, strict)
    return Resolved(resolved.config, requested=options) if repo and not pretrained else resolved


def resolve_source(source, *, strict: bool = True, **options) -> Resolved:
    """What `from_pretrained` builds, worked out once without building it."""
    _check_arguments(source=source, strict=strict)
    options = from_timm_names(options)
    ViTConfig.check_option_names(options)
    return _resolve(None, source, options, strict)


def _device(device):
    return torch.device(device) if device is not None else contextlib.nullcontext()


def create(name: str, pretrained: bool | str | os.PathLike | None = None, *, strict: bool = True,
           device: str | torch.device | None = None, features_only: bool = False,
           out_indices: int | tuple[int, ...] | None = None,
           **options) -> VisionTransformer | FeatureExtractor:
    """A named model with options changed (`img_size=384`, `stem_options={"layers": (3, 4)}`).

    `name`: a model, a tag MODEL.TAG (its architecture and preprocessing), timm's name of a paper
    model, or hf-hub:ORG/NAME. `pretrained=True`: the tag's weights (the model's default tag) from
    the Hub, MODEL.TAG@REVISION at a revision; or weights of any format: a path, hf-hub:ORG/NAME,
    a state dict. `device="meta"` allocates nothing. `features_only=True`: timm's feature maps of
    the blocks `out_indices` (the last n, default 3; or those), a `FeatureExtractor`.
    """
    if out_indices is not None and not features_only:
        raise ConfigError(f"out_indices={out_indices!r} chooses the feature maps of "
                          "features_only=True: pass it too")
    if not isinstance(features_only, bool):
        raise ConfigError(f"features_only must be True or False, got {described(features_only)}")
    with _device(device):  # resolved there too: a meta model's memory is no bound
        resolved = resolve(name, pretrained, strict=strict, **options)
        model = resolved.build()
    if features_only:
        return FeatureExtractor(model, DEFAULT_OUT_INDICES if out_indices is None else out_indices)
    return model


def from_pretrained(source, *, strict: bool = True, device: str | torch.device | None = None,
                    **options) -> VisionTransformer:
    """The model saved with `save_pretrained`, pushed to the Hub (hf-hub:ORG/NAME[@REV]), or that
    weights of any format describe (a file, a state dict, a timm or transformers module);
    options change it (`num_classes`: a new head, `img_size`: resampled, `num_heads`)."""
    with _device(device):
        resolved = resolve_source(source, strict=strict, **options)
        return resolved.build()


def get_config(name: str, **options) -> ViTConfig:
    """The config `create(name, **options)` builds (timm's option names taken too)."""
    return resolve(name, **options).config


def transforms_for(model_or_config, *, is_training: bool = False):
    """torchvision transforms v2 for a model, a config, or a model or tag name: the preprocessing
    its weights expect (`is_training`: the training augmentation instead)."""
    config = (get_config(model_or_config) if isinstance(model_or_config, str)
              else getattr(model_or_config, "config", model_or_config))
    return preprocessing(config.img_size, config.crop_pct, config.interpolation, config.mean,
                         config.std, in_chans=config.in_chans, is_training=is_training)
