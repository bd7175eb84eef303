"""From a name or a source to a model in one pass, as timm's _factory.py: `resolve` works out the
config and the weights once, `Resolved.build` builds the model of that config and loads them.
What the weights decide (GELU, eps, pooling, head) follows them unless an option says otherwise;
loading is strict; a head of another size is replaced by a zero-initialised one and the position
embeddings are resampled to the size asked for, each said unless asked for.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from vitzoo.config import ViTConfig, from_timm_names
from vitzoo.errors import CheckpointError, ConfigError, HubError
from vitzoo.features import DEFAULT_OUT_INDICES, FeatureExtractor
from vitzoo.model import VisionTransformer
from vitzoo.registry import lookup, resolve_config, weight_formats
from vitzoo.weights import ConvertedWeights
from vitzoo.weights.files import open_source
from vitzoo.weights.infer import infer
from vitzoo.weights.layout import HUB_PREFIX
from vitzoo.zoo import PretrainedTag, preprocessing

log = logging.getLogger("vitzoo")
HEAD_OPTIONS = ("num_classes", "head", "head_options")  # another head replaces the weights'
NUMERICS = ("act", "norm_eps")  # the weights decide them, an option may change them
SHAPE_OPTIONS = ("stem", "patch_size", "embed_dim", "depth", "num_heads", "mlp_dim")


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
    requested: dict[str, Any] = field(default_factory=dict)  # the options the user set

    def build(self, config: ViTConfig | None = None) -> VisionTransformer:
        """The model of `config` (default: the resolved one; training changes its classes)
        holding the weights: set to their size, loaded, then resampled to its own."""
        config = config or self.config
        model = VisionTransformer(config)
        n = config.num_classes
        labels = self.labels if self.labels is not None and len(self.labels) == n else None
        if labels is None and self.tag is not None and n == self.tag.num_classes:
            labels = self.tag.categories()
        model.labels, model.pretrained_tag = labels, self.tag
        if self.checkpoint is None:
            return model
        (sh, sw), grid = model.stride, self.checkpoint.grid
        trained = tuple(self.load_size or (grid and (grid[0] * sh, grid[1] * sw)) or
                        config.img_size)
        if trained != config.img_size:
            model.set_img_size(trained)
        weights, expected = dict(self.checkpoint.state_dict), model.state_dict()
        decided = self.checkpoint.config
        if any(getattr(config, k) != decided.get(k, getattr(config, k)) for k in HEAD_OPTIONS):
            log.warning("vitzoo: the weights' head has %s classes, the model %s: head replaced by "
                        "a zero-initialised %s layer", decided.get("num_classes"), n, config.head)
            weights = {k: v for k, v in weights.items() if not k.startswith("head.")}
            weights.update((k, v) for k, v in expected.items() if k.startswith("head."))
        integers = [f"{k}: {str(v.dtype)[6:]}" for k, v in sorted(weights.items())
                    if k in expected and expected[k].is_floating_point()
                    and not v.is_floating_point()]
        if integers:  # torch would cast them into float weights
            raise CheckpointError(f"the weights from {self.location} hold integers where the "
                                  f"model has floats: {', '.join(integers)}")
        if next(model.parameters()).is_meta:  # device="meta": shapes checked, nothing copied
            weights = {k: v.to("meta") for k, v in weights.items()}
        try:
            model.load_state_dict(weights)
        except RuntimeError as exc:  # torch lists every missing, unexpected, mis-shaped tensor
            raise CheckpointError(f"the weights from {self.location} do not fit the model "
                                  f"(check the model name): {exc}") from None
        if trained != config.img_size:
            model.set_img_size(config.img_size)  # each position embedding by its own rule
            (log.info if "img_size" in self.requested else log.warning)(
                "vitzoo: the weights from %s are at %s px, the model at %s px: position "
                "embeddings resampled", self.location, trained, config.img_size)
        return model


def decided_options(decided: dict[str, Any], requested: dict[str, Any]) -> dict[str, Any]:
    """What the weights decide, unless asked otherwise: the numerics may be changed, another head
    replaces theirs (zero-initialised, linear unless named), any other difference is refused."""
    changes = {}
    for option, value in decided.items():
        asked = requested.get(option, value)
        differ = ([k for k in value if asked.get(k, value[k]) != value[k]]
                  if isinstance(value, dict) and isinstance(asked, dict) else asked != value)
        if option in HEAD_OPTIONS or not differ:
            changes[option] = value
        elif option not in NUMERICS:
            raise ConfigError(f"the checkpoint has {option}={value!r} but {option}={asked!r} was "
                              f"requested; drop the {option} option to load these weights")
    if any(requested.get(o, decided.get(o)) != decided.get(o) for o in ("num_classes", "head")):
        changes.update(num_classes=requested.get("num_classes", decided.get("num_classes")),
                       head=requested.get("head", "linear"),
                       head_options=requested.get("head_options", {}))
    return changes


def _resolve(name: str | None, weights, options: dict[str, Any]) -> Resolved:
    """The config, once: the named model's (its tag's, a timm name's), then the options; with
    `weights` (True: the tag's), a saved model's own, or without a name the one they describe,
    with their preprocessing and what they decide."""
    base, tag, hub, changes = None, None, weights is True, [options]
    if name is not None:
        base, tag, revision, implied = lookup(name, hub)
        changes = [implied, options]
        weights = tag.source(revision) if hub else weights
    resolved = Resolved(base, tag=tag if weights is not None else None, requested=options)
    if weights is not None:
        try:
            src = open_source(weights, weight_formats())
        except HubError as exc:
            if tag is None:
                raise
            offline = (f"\nTo work offline: HF_HUB_OFFLINE=1 with a cache that holds {tag.hub_id}"
                       f" (`vitzoo pull {tag.hub_id}` once online), or pretrained=PATH on a "
                       "local copy of its files") if exc.not_cached else ""
            raise HubError(f"{tag.name}: {exc}{offline}", exc.not_cached) from exc
        checkpoint, saved = src.checkpoint, src.saved_config
        others = {k: v for k, v in options.items() if k not in HEAD_OPTIONS}
        if saved is not None:  # a saved model is itself, whatever name was requested
            asked = {k: getattr(base, k) for k in SHAPE_OPTIONS} if base else {}
            asked.update((k, v) for layer in changes for k, v in layer.items() if k in asked)
            if differ := [f"{k}={getattr(saved, k)!r} (not {v!r})" for k, v in asked.items()
                          if getattr(saved, k) != v]:
                warnings.warn(f"{src.location} holds another model than the one requested: "
                              f"{', '.join(differ)}; loading the saved model", stacklevel=4)
            base, changes, resolved.load_size = saved, [others], saved.img_size
            checkpoint.config = {k: getattr(saved, k) for k in HEAD_OPTIONS}
        elif base is None:  # the model the weights describe
            base = ViTConfig()
            changes = [infer(checkpoint, {**src.hints, **others}, src.location)]
        else:  # the named model, with the preprocessing the source states unless asked
            changes.append({k: v for k, v in src.hints.items() if k not in options})
        changes.append(decided_options(checkpoint.config, options))
        resolved.checkpoint, resolved.labels = checkpoint, src.labels
        resolved.location = src.location
    try:
        resolved.config = resolve_config(base, *changes)
    except ConfigError as exc:
        raise ConfigError(f"{resolved.location}: {exc}" if resolved.location else exc) from exc
    return resolved


def resolve(name: str, pretrained: bool | str | os.PathLike | None = None,
            **options) -> Resolved:
    """What `create` builds, worked out once without building it (see `create`)."""
    options = from_timm_names(options)
    if not isinstance(name, str):
        raise TypeError(f"a model's name is a str (vitzoo list), not {type(name).__name__}")
    source, repo = (None if pretrained is False else pretrained), name.startswith(HUB_PREFIX)
    if repo:  # as timm: a Hub repo's model, with its weights if pretrained
        if pretrained not in (None, False, True):
            raise ConfigError(f"{name!r} names a Hub repo's model: pass pretrained=True for its "
                              "weights, or give a model name with other weights")
        source, name = name, None
    resolved = _resolve(name, source, options)
    return Resolved(resolved.config, requested=options) if repo and not pretrained else resolved


def create(name: str, pretrained: bool | str | os.PathLike | None = None, *,
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
    with torch.device(device) if device else contextlib.nullcontext():  # resolved there too
        resolved = resolve(name, pretrained, **options)
        model = resolved.build()
    if features_only:
        return FeatureExtractor(model, DEFAULT_OUT_INDICES if out_indices is None else out_indices)
    return model


def from_pretrained(source, *, device: str | torch.device | None = None,
                    **options) -> VisionTransformer:
    """The model saved with `save_pretrained`, pushed to the Hub (hf-hub:ORG/NAME[@REV]), or that
    weights of any format describe (a file, a state dict, a timm or transformers module);
    options change it (`num_classes`: a new head, `img_size`: resampled, `num_heads`)."""
    with torch.device(device) if device else contextlib.nullcontext():
        resolved = _resolve(None, source, from_timm_names(options))
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
