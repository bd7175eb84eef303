"""vitzoo: the Vision Transformer of "An Image is Worth 16x16 Words", exactly, in pluggable parts.

    model = vitzoo.create("vit_b16.orig_in21k_ft_in1k", pretrained=True)  # weights, by tag
    model = vitzoo.create("vit_b16", pretrained="ViT-B_16.npz")            # any format's
    vitzoo.transforms_for(model), vitzoo.list_models("vit_*"), vitzoo.list_pretrained("vit_b16*")
    vitzoo.create("vit_b16", features_only=True, out_indices=(3, 7, 11))  # feature maps, as timm
"""

from __future__ import annotations

import fnmatch

import torch

from vitzoo import inference  # noqa: F401  (`vitzoo.inference` after `import vitzoo`)
from vitzoo.config import ViTConfig
from vitzoo.errors import (CheckpointError, ConfigError, DataError, HubError, PluginError,
                           TrainingDiverged)
from vitzoo.export import export_onnx
from vitzoo.factory import Resolved, create, from_pretrained, get_config, resolve, transforms_for
from vitzoo.features import FeatureExtractor, FeatureInfo
from vitzoo.hookspecs import hookimpl
from vitzoo.model import VisionTransformer
from vitzoo.registry import COMPONENT_KINDS, get_registry, list_pretrained
from vitzoo.version import __version__ as __version__
from vitzoo.zoo import PretrainedTag


def list_models(pattern: str = "*", pretrained: bool = False) -> list[str]:
    """The models matching an fnmatch pattern; with `pretrained`, as timm, their tags."""
    if pretrained:
        return list_pretrained(pattern if "." in pattern or pattern.endswith("*")
                               else pattern + ".*")
    return [name for name in get_registry().names("model") if fnmatch.fnmatchcase(name, pattern)]


def list_components() -> dict[str, list[str]]:
    """The component names by kind: stem, pos_embed, pool, head."""
    return {kind: get_registry().names(kind) for kind in COMPONENT_KINDS}


def list_weight_formats() -> list[str]:
    return get_registry().names("weight_format")


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_flops(model: ViTConfig | VisionTransformer | str, backward: bool = False,
                computed: bool = False) -> int:
    """FLOPs of one image (`backward`: and back) through a config, a model or a named one, counted
    on the meta device; every token through every layer, as the paper counts (`computed`: what
    `forward` computes, the last block's class token alone when only it is pooled)."""
    from torch.utils.flop_counter import FlopCounterMode

    config = get_config(model) if isinstance(model, str) else getattr(model, "config", model)
    with torch.device("meta"):
        model = VisionTransformer(config).train(backward)
    x = torch.empty(1, config.in_chans, *config.img_size, device="meta")
    with FlopCounterMode(display=False) as counter, torch.set_grad_enabled(backward):
        out = model(x) if computed else model.forward_head(model.forward_features(x))
        if backward:
            out.sum().backward()
    return counter.get_total_flops()


__all__ = ["CheckpointError", "ConfigError", "DataError", "FeatureExtractor", "FeatureInfo",
           "HubError", "PluginError", "PretrainedTag",
           "TrainingDiverged", "VisionTransformer", "ViTConfig", "Resolved", "count_flops",
           "count_params", "create", "export_onnx", "from_pretrained", "get_config", "hookimpl",
           "list_components", "list_models", "list_pretrained", "list_weight_formats", "resolve",
           "transforms_for"]
