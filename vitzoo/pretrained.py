"""Building a model that holds pretrained weights: from a source read by
`vitzoo.checkpoints.sources`, under a given config or the one the source describes.

Building follows the official loader: strict by default, position embeddings resampled to the
requested grid, and a head of another size replaced by a zero-initialised one, saying so. It stands
above the model, the checkpoints and the weights: the one place where weights become a model.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

from vitzoo.config import ViTConfig
from vitzoo.errors import CheckpointError, ConfigError, HubError
from vitzoo.labels import LABEL_SETS
from vitzoo.model import VisionTransformer
from vitzoo.registry import resolve_config, shape_differences
from vitzoo.tags import PretrainedTag
from vitzoo.weights.converted import (HEAD_KEYS, HEAD_OPTIONS, ConvertedWeights, check_state_dict,
                                      decided_options, kind_fits)
from vitzoo.weights.infer import infer_config
from vitzoo.checkpoints.native import check_size
from vitzoo.checkpoints.sources import open_source

log = logging.getLogger("vitzoo")


@dataclass
class Resolved:
    """A model worked out once, before anything is built: its config (resolved: the weights'
    decisions and the user's options applied), the weights it will hold (None: initialised), where
    they are from, and what came with them. `build` makes the model, of this config or of a changed
    copy (training applies the dataset's classes and normalisation by `config.replace`)."""

    config: ViTConfig
    checkpoint: ConvertedWeights | None = None
    location: str = ""
    labels: list[str] | None = None  # the class names the source gives
    load_size: tuple[int, int] | None = None  # img_size the weights are at; else their grid
    tag: PretrainedTag | None = None
    strict: bool = True
    requested: dict[str, Any] = field(default_factory=dict)  # the options the user set

    def build(self, config: ViTConfig | None = None) -> VisionTransformer:
        """The model of `config` (default: the resolved one) holding the weights. A head of another
        size or kind than the weights' is replaced by a zero-initialised one, saying so."""
        config = config if config is not None else self.config
        if self.checkpoint is not None:  # what the files say (image_size, say) may be absurd too
            check_size(config, f"the weights at {self.location} with the options given make",
                       "check the options given and the files' metadata (config.json)")
        if self.checkpoint is None:
            model = VisionTransformer(config)
        else:
            model = model_with_weights(config, self.checkpoint, self.location, self.strict,
                                       self.load_size, resample_asked="img_size" in self.requested)
        n = model.config.num_classes
        model.labels = self.labels if self.labels is not None and len(self.labels) == n else None
        if self.tag is not None:
            model.pretrained_tag = self.tag
            if model.labels is None and self.tag.labels is not None and n == self.tag.num_classes:
                model.labels = LABEL_SETS[self.tag.labels]()
        return model


def model_with_weights(config: ViTConfig, checkpoint: ConvertedWeights, source: str,
                       strict: bool = True, load_size: tuple[int, int] | None = None,
                       resample_asked: bool = False) -> VisionTransformer:
    """A model of `config` holding the checkpoint's weights: built at the size the weights were
    trained at (`load_size`, or their token grid), loaded, then resampled to `config.img_size`: said
    in a warning unless the caller asked for that size (`resample_asked`), since the model then
    computes another function than the weights were trained as (until fine-tuned at that size)."""
    decided = checkpoint.config  # what the weights' head is: num_classes, head, head_options
    drop_head = any(getattr(config, k) != decided.get(k, getattr(config, k)) for k in HEAD_OPTIONS)
    state_dict = dict(checkpoint.state_dict)
    if drop_head:
        dropped = [k for k in state_dict if k.startswith(HEAD_KEYS)]
        for key in dropped:
            del state_dict[key]
        log.warning(
            "vitzoo: checkpoint head has %s classes, model has %s: head replaced by a "
            "zero-initialised %s (%s dropped)",
            decided.get("num_classes"), config.num_classes,
            "linear layer" if config.head == "linear" else f"{config.head} head",
            ", ".join(dropped) or "nothing"
        )
    target_size = config.img_size
    model = VisionTransformer(config if load_size is None else config.replace(img_size=load_size))
    if drop_head:
        state_dict.update({k: v for k, v in model.state_dict().items() if k.startswith(HEAD_KEYS)})
    if load_size is None and checkpoint.grid is not None and checkpoint.grid != model.grid:
        # load at the checkpoint's grid, then resample: the components own the resampling rule
        model.set_img_size((checkpoint.grid[0] * model.stride[0],
                            checkpoint.grid[1] * model.stride[1]))
    on_meta = any(p.is_meta for p in model.parameters())  # device="meta": nothing to copy into
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
            log.warning("vitzoo: strict=False: not loaded %s; left at init %s", skipped,
                        result.missing_keys)
    if model.config.img_size != target_size:
        was, trained = model.grid, model.config.img_size
        model.set_img_size(target_size)
        if resample_asked:
            log.info("vitzoo: position embeddings resampled from grid %s to %s", was, model.grid)
        else:
            log.warning("vitzoo: the weights from %s were trained at %s px and the model is "
                        "configured for %s px: position embeddings resampled from grid %s to %s; "
                        "pass img_size=%s to keep the weights' resolution", source,
                        "x".join(map(str, trained)), "x".join(map(str, target_size)), was,
                        model.grid, trained[0] if trained[0] == trained[1] else trained)
    return model


def _check_options_known(checkpoint: ConvertedWeights, location: str) -> None:
    """A converter may only decide options that ViTConfig has (a guard for new formats)."""
    unknown = [k for k in checkpoint.config if k not in ViTConfig.field_names()]
    if unknown:
        raise CheckpointError(
            f"the {checkpoint.format} weights at {location} need model options this vitzoo does "
            f"not have ({', '.join(f'{k}={checkpoint.config[k]!r}' for k in unknown)}); upgrade "
            "vitzoo"
        )


def resolve_pretrained(
    config: ViTConfig | None,
    source: str | os.PathLike,
    requested: dict[str, Any],
    strict: bool = True,
    expected_format: str | None = None,
) -> Resolved:
    """The model of `config` with the weights at `source`, worked out without building it.

    With `config=None` the model is the one the source describes: a saved directory's config, a
    transformers config.json, or else a config inferred from the weights' shapes (`requested`
    options, e.g. `num_heads`, override it). `expected_format`: the weight format the source must
    hold (a pretrained tag knows it). The labels are the class names the source gives.
    """
    src = open_source(source)
    location = src.location or os.fspath(source)
    if expected_format is not None and src.checkpoint.format != expected_format:
        raise CheckpointError(f"{location} holds {src.checkpoint.format} weights, not the "
                              f"{expected_format} weights expected there; the repo has changed: "
                              "pass a revision (@REVISION) that holds them")
    resolved = _resolve(config, src, location, requested)
    resolved.labels, resolved.strict, resolved.requested = src.labels, strict, dict(requested)
    return resolved


def load_pretrained(config: ViTConfig | None, source: str | os.PathLike, requested: dict[str, Any],
                    strict: bool = True) -> VisionTransformer:
    """`resolve_pretrained(...).build()`: the model holding the weights at `source`."""
    return resolve_pretrained(config, source, requested, strict).build()


def _resolve(config: ViTConfig | None, src, location: str, requested: dict[str, Any]) -> Resolved:
    """The config to build, made once: a base (the saved config, the one given, or the one the
    weights imply) changed by the user's options, the source's hints and the weights' options."""
    checkpoint = src.checkpoint
    others = {k: v for k, v in requested.items() if k not in HEAD_OPTIONS}
    load_size = None
    if src.saved_config is not None:
        # the saved config decides the model (also under a model name); the user's options change it
        try:  # the saved config first: a component no plugin provides is config.json's to name
            base = resolve_config(src.saved_config)
        except ConfigError as exc:
            raise ConfigError(f"{location}/config.json: {exc}") from exc
        differ = shape_differences(base, config) if config is not None else []
        if differ:  # the name is then only a label, which may surprise (training warns alike)
            warnings.warn(f"{location} holds another model than the one requested: "
                          f"{', '.join(differ)}; loading the saved model", stacklevel=5)
        checkpoint.config = {k: getattr(base, k) for k in HEAD_OPTIONS}
        changes, load_size = others, base.img_size
    elif config is not None:  # the preprocessing the source states (crop, mean, std), unless asked
        _check_options_known(checkpoint, location)
        base, changes = config, {k: v for k, v in src.hints.items() if k not in requested}
    else:
        _check_options_known(checkpoint, location)
        try:
            base, changes = infer_config(checkpoint, others, src.hints, location), {}
        except ConfigError as exc:
            raise CheckpointError(f"cannot build a model for the weights at {location}: "
                                  f"{exc}") from exc
    changes = {**changes, **decided_options(checkpoint.config, requested)}
    return Resolved(resolve_config(base.replace(**changes)), checkpoint, location,
                    load_size=load_size)


def resolve_tag(tag: PretrainedTag, config: ViTConfig, requested: dict[str, Any],
                revision: str | None = None, strict: bool = True) -> Resolved:
    """The model of `config` with a pretrained tag's weights, downloaded through huggingface_hub;
    the model remembers the tag, and its class names come from the weights or else the tag."""
    try:
        resolved = resolve_pretrained(config, tag.source(revision), requested, strict=strict,
                                      expected_format=tag.format)
    except HubError as exc:
        if not exc.not_cached:  # a wrong revision, token, ...: the Hub's answer says it all
            raise HubError(f"{tag.name}: {exc}") from exc
        raise HubError(
            f"the weights of {tag.name} are in the Hub repo {tag.hub_id}: {exc}\nTo work offline: "
            f"set HF_HUB_OFFLINE=1 with a Hugging Face cache that holds {tag.hub_id} (fill it once "
            f"online, e.g. `vitzoo pull {tag.hub_id}{'@' + revision if revision else ''}`), or "
            f"load a local copy of its files: vitzoo.create({tag.name!r}, pretrained=PATH)",
            not_cached=True,
        ) from exc
    resolved.tag = tag
    return resolved


def resolve_tag_copy(tag: PretrainedTag, config: ViTConfig, source: str | os.PathLike,
                     requested: dict[str, Any], strict: bool = True) -> Resolved:
    """`create(TAG, pretrained=PATH)`: the tag's model with weights from a local copy of its files
    (the offline route). The model remembers the tag and keeps its class names where the head's size
    is the tag's; a head of another size is the file's, said in a warning."""
    resolved = resolve_pretrained(config, source, requested, strict=strict)
    resolved.tag = tag
    size = resolved.config.img_size
    # a saved model keeps its own size
    if "img_size" not in requested and size != (tag.img_size, tag.img_size):
        log.warning("vitzoo: the model saved at %s is at %s px, not the %d px of %s: kept at its "
                    "own; pass img_size=%d to resample its position embeddings to the tag's",
                    resolved.location, "x".join(map(str, size)), tag.img_size, tag.name,
                    tag.img_size)
    classes = resolved.config.num_classes
    if "num_classes" not in requested and classes != tag.num_classes:
        log.warning("vitzoo: the weights at %s have a head of %d classes, not the %d of %s: the "
                    "model has theirs%s; pass num_classes=%d for a new zero-initialised head of "
                    "the tag's size, or check that the file holds %s's weights", resolved.location,
                    classes, tag.num_classes, tag.name,
                    "" if resolved.labels is not None else f" (without the tag's class names)",
                    tag.num_classes, tag.name)
    return resolved

