"""timm's VisionTransformer (`vit_*_patch*`, the hybrids `vit_*_r50_*`), read and written: the
same tensors under timm's names (the hybrid's ResNetV2 under `patch_embed.backbone`, standardised
as `HYBRID_NUMERICS` says); GELU exact, eps 1e-6. A timm repo's config.json gives the heads
(`model_args`, or its architecture's size) and the preprocessing (`pretrained_cfg`)."""

from __future__ import annotations

import re

from vitzoo.config import HYBRID_NUMERICS, INTERPOLATIONS
from vitzoo.errors import CheckpointError
from vitzoo.weights import ConvertedWeights, WeightFormat
from vitzoo.weights.layout import CONFIG_NAME, square_grid, take_head
from vitzoo.zoo import SIZES, TABLE_1

FORMAT = "timm"
ARCHITECTURE = re.compile(r"^vit_(tiny|small|base|large|huge)_(?:patch|r\d)")  # its size
BLOCK = re.compile(r"^blocks\.(\d+)\.(norm1|attn\.qkv|attn\.proj|norm2|mlp\.fc1|mlp\.fc2)\.(\w+)$")
RESNET = re.compile(r"^patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\."
                    r"(conv[123]|norm[123]|downsample\.conv|downsample\.norm)\.(weight|bias)$")
RESNET_NAMES = {"norm1": "gn1", "norm2": "gn2", "norm3": "gn3", "downsample.conv": "conv_proj",
                "downsample.norm": "gn_proj"}  # the convolutions keep theirs
# the hybrids' stages -> timm's architecture of that ResNetV2 (model_args cannot change it)
HYBRIDS = {(3, 4, 9): "vit_base_r50_s16_224", (3, 4, 6, 3): "vit_large_r50_s32_224",
           (2, 2, 2, 2): "vit_base_r26_s32_224"}


def stated_heads(document: dict, embed_dim: int) -> dict[str, int]:
    """The heads a timm config.json states: its model_args, else its architecture's size."""
    if heads := (document.get("model_args") or {}).get("num_heads"):
        return {"num_heads": int(heads)}
    match = ARCHITECTURE.match(str(document.get("architecture", "")))
    size = SIZES["ti" if match.group(1) == "tiny" else match.group(1)[0]] if match else None
    return {"num_heads": size["num_heads"]} if size and size["embed_dim"] == embed_dim else {}


class TimmFormat(WeightFormat):
    name = FORMAT

    def recognises(self, keys, metadata) -> bool:
        keys = set(keys)
        return "patch_embed.proj.weight" in keys and bool({"pos_embed",
                                                           "blocks.0.attn.qkv.weight"} & keys)

    def convert(self, state_dict, metadata) -> ConvertedWeights:
        params, out = dict(state_dict), {}
        config: dict = {"act": "gelu", "norm_eps": 1e-6}
        stem = "patch_embed.backbone.stem"
        if f"{stem}.conv.weight" in params:
            out["stem.backbone.conv_root.weight"] = params.pop(f"{stem}.conv.weight")
            for kind in ("weight", "bias"):
                out[f"stem.backbone.gn_root.{kind}"] = params.pop(f"{stem}.norm.{kind}")
            for key in sorted(k for k in params if RESNET.match(k)):
                stage, unit, layer, kind = RESNET.match(key).groups()
                name = f"{stage}.{unit}.{RESNET_NAMES.get(layer, layer)}.{kind}"
                out[f"stem.backbone.stages.{name}"] = params.pop(key)
            config.update(HYBRID_NUMERICS)
        out["stem.proj.weight"] = params.pop("patch_embed.proj.weight")
        config.update(stated_heads(metadata.get(CONFIG_NAME) or {},
                                   int(out["stem.proj.weight"].shape[0])))
        if "patch_embed.proj.bias" in params:
            out["stem.proj.bias"] = params.pop("patch_embed.proj.bias")
        token = "cls_token" in params
        if token:
            out["cls_token"] = params.pop("cls_token")
        config["pool"] = "token" if token else "gap"
        grid = None
        if "pos_embed" in params:
            out["encoder.pos_embed.weight"] = pos = params.pop("pos_embed")
            grid = square_grid(pos.shape[1] - token, FORMAT)
        for key in [k for k in params if BLOCK.match(k)]:
            out["encoder." + key] = params.pop(key)
        for kind in ("weight", "bias"):
            if f"norm.{kind}" in params:
                out[f"encoder.norm.{kind}"] = params.pop(f"norm.{kind}")
        if "fc_norm.weight" in params:  # the LayerNorm after the pooling (same name in vitzoo)
            if token:  # timm's global_pool="avg" beside a class token: it would load, and differ
                raise CheckpointError("these timm weights average the patches beside a class "
                                      "token (fc_norm), a pooling vitzoo does not have")
            config["fc_norm"] = True
        take_head(params, out, config, pre_logits="pre_logits.fc", classifier="head")
        return ConvertedWeights(FORMAT, {**out, **params}, config, grid)

    def hints(self, metadata) -> dict:
        """Image size, normalisation and crop from a timm repo's config.json (`pretrained_cfg`)."""
        document = metadata.get(CONFIG_NAME) or {}
        cfg = document.get("pretrained_cfg") or {} if "architecture" in document else {}
        found: dict = {}
        if isinstance(cfg.get("input_size"), list) and len(cfg["input_size"]) == 3:
            found["img_size"] = tuple(cfg["input_size"][1:])
        if cfg.get("mean") and cfg.get("std"):
            found.update(mean=tuple(cfg["mean"]), std=tuple(cfg["std"]))
        if isinstance(cfg.get("crop_pct"), (int, float)):
            found["crop_pct"] = float(cfg["crop_pct"])
        if cfg.get("interpolation") in INTERPOLATIONS:
            found["interpolation"] = cfg["interpolation"]
        return found


# ---------------------------------------------------------------- writing: what timm loads
_TO_TIMM = ((r"stem\.backbone\.conv_root\.weight", "patch_embed.backbone.stem.conv.weight"),
            (r"stem\.backbone\.gn_root\.(\w+)", r"patch_embed.backbone.stem.norm.\1"),
            (r"stem\.backbone\.stages\.(\d+)\.(\d+)\.(\w+)\.(\w+)", None),
            (r"stem\.proj\.(\w+)", r"patch_embed.proj.\1"), (r"cls_token", "cls_token"),
            (r"encoder\.pos_embed\.weight", "pos_embed"), (r"encoder\.(blocks\..+)", r"\1"),
            (r"encoder\.norm\.(\w+)", r"norm.\1"), (r"fc_norm\.(\w+)", r"fc_norm.\1"),
            (r"head\.fc\.(\w+)", r"head.\1"))
_TIMM_RESNET = {vitzoo: timm for timm, vitzoo in RESNET_NAMES.items()}


def to_timm(state_dict: dict) -> dict:
    """vitzoo's names as timm's, for a model timm builds (what `TimmFormat` reads back)."""
    out = {}
    for key, tensor in state_dict.items():
        for pattern, target in _TO_TIMM:
            if match := re.fullmatch(pattern, key):
                break
        if target is None:  # a ResNet unit's layer
            stage, unit, layer, kind = match.groups()
            layer = _TIMM_RESNET.get(layer, layer)
            out[f"patch_embed.backbone.stages.{stage}.blocks.{unit}.{layer}.{kind}"] = tensor
        else:
            out[match.expand(target)] = tensor
    return out


def architecture(config) -> str:
    """A registered timm model that builds `config`'s model from model_args: the zoo's name of
    its shape (its ResNet's, for a hybrid), else timm's ViT-B/16."""
    if config.stem == "resnet":
        return HYBRIDS[tuple(config.stem_options["layers"])]
    return next((f"{timm}_224" for named, timm in TABLE_1.values() if timm and all(
        getattr(named, k) == getattr(config, k) for k in (*SIZES["b"], "patch_size", "stem"))),
        "vit_base_patch16_224")


def document(config, labels: list[str] | None) -> dict:
    """timm's config.json keys: the architecture, every shape in model_args, pretrained_cfg."""
    h, w = config.img_size
    pool = "token" if config.pool == "token" else "avg"
    model_args = {"img_size": [h, w], "patch_size": config.patch_size, "in_chans": config.in_chans,
                  "embed_dim": config.embed_dim, "depth": config.depth,
                  "num_heads": config.num_heads, "mlp_ratio": config.mlp_dim / config.embed_dim,
                  "class_token": config.pool == "token", "global_pool": pool,
                  "fc_norm": config.fc_norm, "act_layer": config.act,
                  **({"dynamic_img_size": True} if config.dynamic_img_size else {})}
    pretrained_cfg = {
        "input_size": [config.in_chans, h, w], "fixed_input_size": not config.dynamic_img_size,
        "interpolation": config.interpolation, "crop_pct": config.crop_pct, "crop_mode": "center",
        "mean": list(config.mean), "std": list(config.std), "num_classes": config.num_classes,
        "first_conv": ("patch_embed.backbone.stem.conv" if config.stem == "resnet"
                       else "patch_embed.proj"), "classifier": "head"}
    return {"architecture": architecture(config), "num_classes": config.num_classes,
            "num_features": config.embed_dim, "global_pool": pool,
            "pretrained_cfg": pretrained_cfg, "model_args": model_args,
            **({"label_names": list(labels)} if labels is not None else {})}
