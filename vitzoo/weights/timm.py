"""timm's VisionTransformer state dicts (`vit_*_patch*`, the hybrid `vit_*_r50_*`), from
`timm.create_model(...).state_dict()` or a timm Hub repo's weights file.

Names: `patch_embed.proj.*`, `cls_token`, `pos_embed` (1, T, D), `blocks.{i}.{norm1, attn.qkv,
attn.proj, norm2, mlp.fc1, mlp.fc2}`, `norm`, `fc_norm` (timm's LayerNorm after the pooling with
`global_pool="avg"`: vitzoo's `fc_norm=True`), `head`, and in some checkpoints `pre_logits.fc`
(Dense + tanh). The hybrid's ResNetV2 sits under `patch_embed.backbone`. Only names change.

timm's GELU is the exact (erf) one and its LayerNorm eps 1e-6. Its hybrid ResNet standardises
weights as (w - mean) / sqrt(var + 1e-8) with GroupNorm eps 1e-5, where the official model uses
(w - mean) / (std + 1e-5) and eps 1e-6; see `vitzoo.config.HYBRID_NUMERICS`.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from vitzoo.config import HYBRID_NUMERICS, INTERPOLATIONS
from vitzoo.errors import CheckpointError
from vitzoo.weights.converted import ConvertedWeights, take_head
from vitzoo.weights.formats import Metadata, WeightFormat
from vitzoo.weights.layout import CONFIG_NAME, square_grid, square_side
from vitzoo.zoo import SIZES

FORMAT = "timm"
# timm's ViT sizes in its architecture names (vit_base_patch16_224, ...) -> the zoo's
TIMM_SIZES = {"tiny": "ti", "small": "s", "base": "b", "large": "l", "huge": "h"}
_ARCHITECTURE = re.compile(r"^vit_(tiny|small|base|large|huge)_(?:patch|r\d)")

_BLOCK = re.compile(r"^blocks\.(\d+)\."
                    r"(norm1|attn\.qkv|attn\.proj|norm2|mlp\.fc1|mlp\.fc2)\.(weight|bias)$")
_RESNET = re.compile(
    r"^patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\."
    r"(conv[123]|norm[123]|downsample\.conv|downsample\.norm)\.(weight|bias)$"
)
_RESNET_NAMES = {"conv1": "conv1", "conv2": "conv2", "conv3": "conv3", "norm1": "gn1",
                 "norm2": "gn2", "norm3": "gn3", "downsample.conv": "conv_proj",
                 "downsample.norm": "gn_proj"}


def stated_heads(metadata: Metadata, embed_dim: int) -> dict[str, int]:
    """The number of heads a timm Hub repo's config.json states: its `model_args`, else the ViT size
    its architecture names (when that size's width is the weights'); {} when it states none."""
    document = metadata.get(CONFIG_NAME) or {}
    model_args = document.get("model_args")
    heads = model_args.get("num_heads") if isinstance(model_args, dict) else None
    if isinstance(heads, int) and not isinstance(heads, bool):
        return {"num_heads": heads}
    match = _ARCHITECTURE.match(str(document.get("architecture", "")))
    size = SIZES[TIMM_SIZES[match.group(1)]] if match else None
    fits = size is not None and size["embed_dim"] == embed_dim
    return {"num_heads": size["num_heads"]} if fits else {}


def _check_paper_form(params: dict[str, torch.Tensor], has_class_token: bool) -> None:
    """timm's ViT class also builds models that are not the paper's: tokens besides the class token
    (DeiT's distillation token, register tokens), or position embeddings for the patches only
    (`no_embed_class`). Said as such, before their position embeddings look like a damaged grid."""
    found = [what for key, what in (("dist_token", "a distillation token (DeiT's dist_token)"),
                                    ("reg_token", "register tokens (reg_token)")) if key in params]
    pos = params.get("pos_embed")
    if (pos is not None and pos.ndim == 3 and has_class_token
            and square_side(pos.shape[1]) is not None and square_side(pos.shape[1] - 1) is None):
        found.append("position embeddings for the patches only, none for the class token "
                     "(no_embed_class)")
    if found:
        raise CheckpointError("these timm weights are not a ViT of the paper's form: they have "
                              f"{' and '.join(found)}; vitzoo builds the paper's ViT (one class "
                              "token, or none, with position embeddings for every token) and loads "
                              "timm's weights of that form")


class TimmFormat(WeightFormat):
    name = FORMAT

    def recognises(self, keys, metadata: Metadata) -> bool:
        keys = set(keys)
        return ("patch_embed.proj.weight" in keys
                and ("pos_embed" in keys or "blocks.0.attn.qkv.weight" in keys))

    def convert(self, state_dict: dict[str, torch.Tensor], metadata: Metadata) -> ConvertedWeights:
        """timm names -> a vitzoo `ConvertedWeights`. Unknown keys are kept under their own names,
        so the strict loader reports them."""
        params = dict(state_dict)
        out: dict[str, torch.Tensor] = {}
        config: dict = {"act": "gelu", "norm_eps": 1e-6}

        stem = "patch_embed.backbone.stem"
        hybrid = f"{stem}.conv.weight" in params
        if hybrid:
            out["stem.backbone.conv_root.weight"] = params.pop(f"{stem}.conv.weight")
            for kind in ("weight", "bias"):
                out[f"stem.backbone.gn_root.{kind}"] = params.pop(f"{stem}.norm.{kind}")
            for key in sorted(k for k in params if _RESNET.match(k)):
                stage, unit, layer, kind = _RESNET.match(key).groups()
                name = f"{stage}.{unit}.{_RESNET_NAMES[layer]}.{kind}"
                out[f"stem.backbone.stages.{name}"] = params.pop(key)
            config.update(HYBRID_NUMERICS)
        out["stem.proj.weight"] = params.pop("patch_embed.proj.weight")
        config.update(stated_heads(metadata, int(out["stem.proj.weight"].shape[0])))
        if "patch_embed.proj.bias" in params:
            out["stem.proj.bias"] = params.pop("patch_embed.proj.bias")

        has_class_token = "cls_token" in params
        _check_paper_form(params, has_class_token)
        if has_class_token:
            out["cls_token"] = params.pop("cls_token")
        config["pool"] = "token" if has_class_token else "gap"
        grid = None
        if "pos_embed" in params:
            pos = params.pop("pos_embed")
            out["encoder.pos_embed.weight"] = pos
            grid = square_grid(pos.shape[1] - int(has_class_token), FORMAT)

        for key in list(params):
            match = _BLOCK.match(key)
            if match:
                i, name, kind = match.groups()
                out[f"encoder.blocks.{i}.{name}.{kind}"] = params.pop(key)

        for kind in ("weight", "bias"):
            if f"norm.{kind}" in params:
                out[f"encoder.norm.{kind}"] = params.pop(f"norm.{kind}")
        if "fc_norm.weight" in params:  # LayerNorm after the pooling, not on the tokens (same name)
            if has_class_token:
                # timm then averages the patch tokens beside an unused class token: no vitzoo
                # pooling does that
                raise CheckpointError(
                    "these timm weights have a class token and fc_norm (timm's global_pool='avg' "
                    "with class_token=True), a pooling vitzoo does not have; vitzoo loads timm's "
                    "avg pooling without class token (class_token=False) and its class-token "
                    "pooling"
                )
            config["fc_norm"] = True

        take_head(params, out, config, pre_logits="pre_logits.fc", classifier="head")
        out.update(params)  # anything left over is reported by the strict loader
        return ConvertedWeights(format=FORMAT, state_dict=out, config=config, grid=grid)

    def hints(self, metadata: Metadata) -> dict[str, Any]:
        """Image size, normalisation and crop from a timm repo's config.json (`pretrained_cfg`)."""
        document = metadata.get(CONFIG_NAME) or {}
        if "architecture" not in document:  # not timm's config.json
            return {}
        cfg = document.get("pretrained_cfg") or {}
        found: dict[str, Any] = {}
        if isinstance(cfg.get("input_size"), list) and len(cfg["input_size"]) == 3:
            found["img_size"] = tuple(cfg["input_size"][1:])
        if cfg.get("mean") and cfg.get("std"):
            found.update(mean=tuple(cfg["mean"]), std=tuple(cfg["std"]))
        if isinstance(cfg.get("crop_pct"), (int, float)):
            found["crop_pct"] = float(cfg["crop_pct"])
        if cfg.get("interpolation") in INTERPOLATIONS:
            found["interpolation"] = cfg["interpolation"]
        return found


# vitzoo's names -> timm's, for a model timm builds (the inverse of `TimmFormat.convert`)
_TO_TIMM = (
    (re.compile(r"^stem\.backbone\.conv_root\.weight$"), "patch_embed.backbone.stem.conv.weight"),
    (re.compile(r"^stem\.backbone\.gn_root\.(weight|bias)$"), r"patch_embed.backbone.stem.norm.\1"),
    (re.compile(r"^stem\.proj\.(weight|bias)$"), r"patch_embed.proj.\1"),
    (re.compile(r"^cls_token$"), "cls_token"),
    (re.compile(r"^encoder\.pos_embed\.weight$"), "pos_embed"),
    (re.compile(r"^encoder\.blocks\.(\d+\..+)$"), r"blocks.\1"),
    (re.compile(r"^encoder\.norm\.(weight|bias)$"), r"norm.\1"),
    (re.compile(r"^fc_norm\.(weight|bias)$"), r"fc_norm.\1"),
    (re.compile(r"^head\.fc\.(weight|bias)$"), r"head.\1"),
)
_RESNET_OF_VITZOO = re.compile(r"^stem\.backbone\.stages\.(\d+)\.(\d+)\.(\w+)\.(weight|bias)$")
_TIMM_RESNET_NAMES = {vitzoo: timm for timm, vitzoo in _RESNET_NAMES.items()}


def to_timm(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A vitzoo state dict in timm's names (the tensors themselves, unchanged): what
    `TimmFormat.convert` reads back. Only a model timm can build is written so
    (`vitzoo.checkpoints.layouts` decides); a tensor with no timm name is a CheckpointError."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        match = _RESNET_OF_VITZOO.match(key)
        if match and match.group(3) in _TIMM_RESNET_NAMES:
            stage, unit, layer, kind = match.groups()
            name = f"{stage}.blocks.{unit}.{_TIMM_RESNET_NAMES[layer]}.{kind}"
            out[f"patch_embed.backbone.stages.{name}"] = tensor
            continue
        name = next((pattern.sub(target, key) for pattern, target in _TO_TIMM
                     if pattern.match(key)), None)
        if name is None:
            raise CheckpointError(f"the tensor {key!r} has no name in timm's VisionTransformer; "
                                  "this model is not one timm builds: save it in vitzoo's layout")
        out[name] = tensor
    return out
