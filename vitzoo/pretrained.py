"""Building a model that holds pretrained weights: from a source read by `vitzoo.checkpoints.sources`,
under a given config or the one the source describes.

Building follows the official loader: strict by default, position embeddings resampled to the
requested grid, and a head of another size replaced by a zero-initialised one, saying so. It stands
above the model, the checkpoints and the weights: the one place where weights become a model.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import torch

from vitzoo.config import ViTConfig, shape_differences
from vitzoo.errors import CheckpointError, ConfigError, HubError
from vitzoo.labels import LABEL_SETS
from vitzoo.model import VisionTransformer
from vitzoo.tags import PretrainedTag
from vitzoo.weights.converted import HEAD_KEYS, HEAD_OPTIONS, ConvertedWeights, check_state_dict, kind_fits, resolve_config
from vitzoo.weights.infer import infer_config
from vitzoo.checkpoints.sources import open_source

log = logging.getLogger("vitzoo")


def model_with_weights(config: ViTConfig, checkpoint: ConvertedWeights, requested: dict[str, Any], source: str,
                       strict: bool = True) -> VisionTransformer:
    """A model of `config` (adjusted to the checkpoint) holding the checkpoint's weights."""
    config, drop_head = resolve_config(config, checkpoint, requested)
    state_dict = dict(checkpoint.state_dict)
    if drop_head:
        dropped = [k for k in state_dict if k.startswith(HEAD_KEYS)]
        for key in dropped:
            del state_dict[key]
        log.warning(
            "vitzoo: checkpoint head has %s classes, model has %s: head replaced by a zero-initialised "
            "linear layer (%s dropped)", checkpoint.config.get("num_classes"), config.num_classes, ", ".join(dropped) or "nothing"
        )
    model = VisionTransformer(config)
    if drop_head:
        state_dict.update({k: v for k, v in model.state_dict().items() if k.startswith(HEAD_KEYS)})
    target_size = config.img_size
    if checkpoint.grid is not None and checkpoint.grid != model.grid:
        # load at the checkpoint's grid, then resample: the components own the resampling rule
        model.set_img_size((checkpoint.grid[0] * model.stride[0], checkpoint.grid[1] * model.stride[1]))
    on_meta = any(p.is_meta for p in model.parameters())  # device="meta": the architecture, nothing to copy into
    if strict:
        check_state_dict(model, state_dict, source)
        if not on_meta:
            model.load_state_dict(state_dict)
    elif not on_meta:
        expected = model.state_dict()
        fitting = {k: v for k, v in state_dict.items()
                   if k in expected and expected[k].shape == v.shape and kind_fits(v, expected[k])}
        result = model.load_state_dict(fitting, strict=False)
        skipped = sorted(set(state_dict) - set(fitting))
        if result.missing_keys or skipped:
            log.warning("vitzoo: strict=False: not loaded %s; left at init %s", skipped, result.missing_keys)
    if model.config.img_size != target_size:
        model.set_img_size(target_size)
        log.info("vitzoo: position embeddings resampled from grid %s to %s", checkpoint.grid, model.grid)
    return model


def _grid(config: ViTConfig) -> tuple[int, int]:
    with torch.device("meta"):  # the stem knows its stride; building on meta allocates nothing
        return VisionTransformer(config).grid


def _check_options_known(checkpoint: ConvertedWeights, location: str) -> None:
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
    expected_format: str | None = None,
    **hub_options: Any,
) -> VisionTransformer:
    """Build the model of `config` holding the weights at `source` (see `model_with_weights`).

    With `config=None` the model is the one the source describes: a saved directory's config, a
    transformers config.json, or else a config inferred from the weights' shapes (`requested`
    options, e.g. `num_heads`, override it). `expected_format`: the weight format the source must
    hold (a pretrained tag knows it). The model's `labels` are the class names the source gives.
    """
    src = open_source(source, **hub_options)
    location = src.location or os.fspath(source)
    if expected_format is not None and src.checkpoint.format != expected_format:
        raise CheckpointError(f"{location} holds {src.checkpoint.format} weights, not the {expected_format} weights "
                              "expected there; the repo has changed: pass a revision (@REVISION) that holds them")
    model = _build(config, src, location, requested, strict)
    model.labels = src.labels if src.labels is not None and len(src.labels) == model.config.num_classes else None
    return model


def _build(config: ViTConfig | None, src, location: str, requested: dict[str, Any], strict: bool) -> VisionTransformer:
    if src.saved_config is not None:
        # the saved config decides the model (also under a model name); the user's options change it
        saved = src.saved_config
        differ = shape_differences(saved, config) if config is not None else []
        if differ:  # the name is then only a label, which may surprise (training warns alike)
            warnings.warn(f"{location} holds another model than the one requested: {', '.join(differ)}; "
                          "loading the saved model", stacklevel=4)
        built = saved.replace(**{k: v for k, v in requested.items() if k not in HEAD_OPTIONS})
        checkpoint = src.checkpoint
        checkpoint.config = {k: getattr(saved, k) for k in HEAD_OPTIONS}
        try:  # the saved config's first build: a component no plugin provides is config.json's to name
            checkpoint.grid = _grid(saved)
        except ConfigError as exc:
            raise ConfigError(f"{location}/config.json: {exc}") from exc
        return model_with_weights(built, checkpoint, requested, location, strict=strict)
    checkpoint = src.checkpoint
    _check_options_known(checkpoint, location)
    if config is not None:  # the preprocessing the source states (a timm repo's crop, mean, std), unless asked otherwise
        config = config.replace(**{k: v for k, v in src.hints.items() if k not in requested})
    if config is None:
        overrides = {k: v for k, v in requested.items() if k not in HEAD_OPTIONS}
        try:
            config = infer_config(checkpoint, overrides, src.hints)
        except ConfigError as exc:
            raise CheckpointError(f"cannot build a model for the weights at {location}: {exc}") from exc
    return model_with_weights(config, checkpoint, requested, location, strict=strict)


def load_tag(tag: PretrainedTag, config: ViTConfig, requested: dict[str, Any], revision: str | None = None,
             strict: bool = True) -> VisionTransformer:
    """The model of `config` holding a pretrained tag's weights, downloaded through huggingface_hub; the
    model remembers the tag, and its class names come from the weights or else the tag's label set."""
    try:
        model = load_pretrained(config, tag.source(revision), requested, strict=strict, expected_format=tag.format)
    except HubError as exc:
        if not exc.not_cached:  # a wrong revision, token, ...: the Hub's answer says it all
            raise HubError(f"{tag.name}: {exc}") from exc
        raise HubError(
            f"the weights of {tag.name} are in the Hub repo {tag.hub_id}: {exc}\nTo work offline: set "
            f"HF_HUB_OFFLINE=1 with a Hugging Face cache that holds {tag.hub_id} (fill it once online, e.g. "
            f"`vitzoo pull {tag.hub_id}{'@' + revision if revision else ''}`), or load a local copy of its files: "
            f"vitzoo.create({tag.name!r}, pretrained=PATH)", not_cached=True,
        ) from exc
    model.pretrained_tag = tag
    if model.labels is None and tag.labels is not None and model.config.num_classes == tag.num_classes:
        model.labels = LABEL_SETS[tag.labels]()
    return model
