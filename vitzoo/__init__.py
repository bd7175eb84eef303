"""vitzoo: the Vision Transformer of "An Image is Worth 16x16 Words", exactly, in pluggable parts.

    import vitzoo
    model = vitzoo.create("vit_b16_hybrid")
    model = vitzoo.create("vit_b16", pretrained="ViT-B_16.npz")
    model = vitzoo.create("vit_b16.orig_in21k_ft_in1k", pretrained=True)  # weights, by tag
    vitzoo.transforms_for(model)                                         # their preprocessing
    vitzoo.list_models("vit_*"), vitzoo.list_pretrained("vit_b16*"), vitzoo.list_components()
    fast = vitzoo.inference.for_inference(model)                 # the device's fastest precision
    vitzoo.create("vit_b16", features_only=True, out_indices=(3, 7, 11))  # feature maps, as timm
    vitzoo.export_onnx(model, "vit.onnx")                          # ONNX, checked with onnxruntime
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from collections.abc import Mapping, Sequence

import torch

from vitzoo import catalog, inference  # noqa: F401  (`vitzoo.inference` after `import vitzoo`)
from vitzoo.catalog import list_pretrained
from vitzoo.options import described as in_words  # a value in an error, never its tensors
from vitzoo.config import ViTConfig, from_timm_names
from vitzoo.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    ExportError,
    HubError,
    InputError,
    PluginError,
    TrainingDiverged,
)
from vitzoo.export import export_onnx
from vitzoo.features import DEFAULT_OUT_INDICES, FeatureExtractor, FeatureInfo
from vitzoo.hookspecs import hookimpl
from vitzoo.model import VisionTransformer
from vitzoo.pretrained import Resolved, resolve_pretrained, resolve_tag, resolve_tag_copy
from vitzoo.registry import COMPONENT_KINDS, get_registry, resolve_config
from vitzoo.tags import PretrainedTag
from vitzoo.transforms import transforms_for
from vitzoo.version import __version__ as __version__  # a leaf that any module may read
from vitzoo.weights.layout import HUB_PREFIX




def list_models(pattern: str = "*", pretrained: bool = False) -> list[str]:
    """Names of the registered models, filtered with an fnmatch pattern; with `pretrained`, the
    names that have weights, as timm lists them: every tag, MODEL.TAG (`vitzoo.list_pretrained`)."""
    if pretrained:
        whole = "." in pattern or pattern.endswith("*")
        return catalog.list_pretrained(pattern if whole else pattern + ".*")
    return [name for name in get_registry().names("model") if fnmatch.fnmatchcase(name, pattern)]


def list_components() -> dict[str, list[str]]:
    """Registered component names by kind: stem, pos_embed, pool, head."""
    registry = get_registry()
    return {kind: registry.names(kind) for kind in COMPONENT_KINDS}


def list_weight_formats() -> list[str]:
    """Registered weight formats, the checkpoint layouts `pretrained=` and `from_pretrained` read
    (vitzoo's own, timm, torchvision, transformers, official .npz; plugins add more)."""
    return get_registry().names("weight_format")


def get_config(name: str, **options) -> ViTConfig:
    """The config of a named model with options changed (timm's names of the same options taken too:
    drop_rate, global_pool, class_token, ...); unknown option names fail at once."""
    name, implied = catalog.from_timm_name(name)  # vit_tiny_patch16_224: vit_ti16 at 224 px
    return _model_config(name, {**implied, **from_timm_names(options)})


def _model_config(name: str, options: dict) -> ViTConfig:
    """The registered model's config with `options` (in vitzoo's names) changed, resolved."""
    return resolve_config(get_registry().get("model", name).replace(**options))


def create(
    name: str,
    pretrained: bool | str | os.PathLike | None = None,
    *,
    strict: bool = True,
    device: str | torch.device | None = None,
    features_only: bool = False,
    out_indices: int | Sequence[int] | None = None,
    **options,
) -> VisionTransformer | FeatureExtractor:
    """Build a named model, with any config option changed (`img_size=384`, `pool="gap"`, ...).

    `name` is a model or a pretrained tag, MODEL.TAG (`vit_b16.orig_in21k`;
    `vitzoo.list_pretrained()`). `pretrained=True` loads the tag's weights (the model's default tag
    when `name` has none) from the Hub through huggingface_hub, `MODEL.TAG@REVISION` at a revision;
    a tag without `pretrained=True` builds its architecture and preprocessing (resolution, classes,
    mean/std, crop) without weights. `pretrained` may also be weights to load: a saved directory, an
    official .npz, a timm / torchvision / transformers checkpoint, or hf-hub:ORG/NAME[@REVISION]
    (see vitzoo.weights). Options the weights decide (GELU variant, pooling, head) follow the
    weights unless given here; a part's options are a dict (`stem="resnet", stem_options={"layers":
    (3, 4, 6)}`). `device="meta"` builds without allocating memory. `features_only=True` returns, as
    timm's, a `vitzoo.features.FeatureExtractor`: the model cut after the blocks `out_indices`
    (timm's meaning: n the last n, default 3; a list those), whose forward gives their tokens as (B,
    D, h, w) feature maps, described by its `feature_info`.
    """
    if out_indices is not None and not features_only:
        raise ConfigError(f"out_indices={out_indices!r} chooses the feature maps of "
                          "features_only=True; pass features_only=True too, or use "
                          "model.forward_intermediates(x, indices=...)")
    if not isinstance(features_only, bool):
        raise ConfigError(f"features_only must be True or False, got {in_words(features_only)}")
    resolved = resolve(name, pretrained, strict=strict, **options)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = resolved.build()
    if features_only:
        return FeatureExtractor(model, DEFAULT_OUT_INDICES if out_indices is None else out_indices)
    return model


def resolve(name: str, pretrained: bool | str | os.PathLike | None = None, *, strict: bool = True,
            **options) -> Resolved:
    """What `create` would build, worked out once without building it: the resolved config
    (`.config`) and the weights it would hold; `.build(config)` builds it, or a changed copy."""
    _check_arguments(name=name, pretrained=pretrained, strict=strict)
    name, implied = catalog.from_timm_name(name)  # timm's names: vit_tiny_patch16_224
    options = {**implied, **from_timm_names(options)}
    if name.startswith(HUB_PREFIX):  # as timm: a Hub repo as the name, weights with pretrained=True
        if pretrained is True:
            return resolve_source(name, strict=strict, **options)
        if pretrained:
            raise ConfigError(f"{name!r} names a Hub repo's model: pass pretrained=True for its "
                              f"weights, or give a model name with pretrained={pretrained!r}")
        described = resolve_source(name, strict=strict, **options)
        return Resolved(described.config, requested=described.requested)  # its architecture alone
    model_name, tag, revision = catalog.lookup(name, pretrained is True)
    config = _model_config(model_name, {**(tag.config_options() if tag else {}), **options})
    if pretrained is None or pretrained is False:
        return Resolved(config, requested=options)
    if pretrained is True:
        return resolve_tag(tag, config, options, revision, strict=strict)
    if tag is not None:  # a local copy of the tag's files
        return resolve_tag_copy(tag, config, pretrained, options, strict=strict)
    return resolve_pretrained(config, pretrained, options, strict=strict)


def from_pretrained(
    source: str | os.PathLike | Mapping[str, torch.Tensor] | torch.nn.Module, *,
    strict: bool = True, device: str | torch.device | None = None, **options
) -> VisionTransformer:
    """Load a model saved with `model.save_pretrained(dir)`, pushed to the Hub
    ("hf-hub:ORG/NAME[@REV]") or in any format `create(..., pretrained=...)` reads, the model
    inferred from the weights; a state dict or a module (a timm or transformers ViT, a vitzoo model)
    is converted in memory; options change its config (a new `num_classes` replaces the head, a new
    `img_size` resamples the position embeddings, `num_heads` when the weights cannot say)."""
    resolved = resolve_source(source, strict=strict, **options)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        return resolved.build()


def resolve_source(source: str | os.PathLike | Mapping[str, torch.Tensor] | torch.nn.Module, *,
                   strict: bool = True, **options) -> Resolved:
    """What `from_pretrained` would build, worked out once without building it (see `resolve`)."""
    _check_arguments(source=source, strict=strict)
    options = from_timm_names(options)
    ViTConfig.check_option_names(options)
    return resolve_pretrained(None, source, options, strict=strict)


def _check_arguments(**given) -> None:
    """The arguments of `create` and `from_pretrained` that are no model options, checked as options
    are: a ConfigError naming the argument, what it must be and what it got."""
    wanted = {"name": ((str,), "a model or tag name (a str; vitzoo list)"),
              "pretrained": ((type(None), bool, str, os.PathLike, Mapping, torch.nn.Module),
                             "True (the tag's weights), False or None (none), or weights to load: "
                             "a path, 'hf-hub:ORG/NAME', a state dict or a model holding one"),
              "source": ((str, os.PathLike, Mapping, torch.nn.Module),
                         "a path, 'hf-hub:ORG/NAME', a state dict or a model holding one"),
              "strict": ((bool,), "True or False")}
    for argument, value in given.items():
        types, words = wanted[argument]
        if not isinstance(value, types):
            raise ConfigError(f"{argument} must be {words}, got {in_words(value)} "
                              f"({type(value).__name__})")


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_flops(model: ViTConfig | VisionTransformer | str, backward: bool = False,
                computed: bool = False) -> int:
    """FLOPs of one image through `model` (a ViTConfig, a VisionTransformer, or a model or tag name;
    forward, or forward and backward), counted by torch.utils.flop_counter on the meta device:
    nothing is allocated, and attention runs there as matrix products the counter sees (a CPU's
    fused attention kernel is invisible to it). Every token goes through every layer, as the paper
    counts compute, although `forward` skips the last block's patch-token outputs when only the
    class token is pooled (`computed=True` counts what it computes)."""
    from torch.utils.flop_counter import FlopCounterMode

    config = catalog.config_of(model) if isinstance(model, str) else getattr(model, "config", model)
    if not isinstance(config, ViTConfig):
        raise TypeError("count_flops takes a ViTConfig, a VisionTransformer or a model name, not "
                        f"{type(model).__name__}")
    with torch.device("meta"):
        model = VisionTransformer(config).train(backward)
    x = torch.empty(1, config.in_chans, *config.img_size, device="meta")
    with FlopCounterMode(display=False) as counter, torch.set_grad_enabled(backward):
        out = model(x) if computed else model.forward_head(model.forward_features(x))
        if backward:
            out.sum().backward()
    return counter.get_total_flops()


__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "ExportError",
    "FeatureExtractor",
    "FeatureInfo",
    "HubError",
    "InputError",
    "PluginError",
    "PretrainedTag",
    "TrainingDiverged",
    "VisionTransformer",
    "ViTConfig",
    "Resolved",
    "count_flops",
    "count_params",
    "create",
    "export_onnx",
    "from_pretrained",
    "get_config",
    "hookimpl",
    "list_components",
    "list_models",
    "list_pretrained",
    "list_weight_formats",
    "resolve",
    "resolve_source",
    "transforms_for",
]
