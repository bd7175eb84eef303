"""Hugging Face transformers' ViT (`ViTModel`, `ViTForImageClassification`), read and written:
the Hub's classic names and those of transformers >= 5, with or without `vit.`; a ViTModel's
`pooler.dense` is the pre-logits layer. Its config.json gives numerics, heads, size and class
names; without one, transformers' defaults (exact GELU, eps 1e-12)."""

from __future__ import annotations

import re
from typing import Any

import torch

from vitzoo.errors import CheckpointError
from vitzoo.weights import ConvertedWeights, WeightFormat
from vitzoo.weights.layout import CONFIG_NAME, PREPROCESSOR_NAME, square_grid, take_head

FORMAT = "transformers"
HIDDEN_ACT = {"gelu": "gelu", "gelu_python": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
              "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"}  # -> vitzoo's act
PIL_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # a preprocessor's -> interpolation
LAYER = re.compile(r"^(?:encoder\.layer|layers)\.(\d+)\.(.+)\.(weight|bias)$")
LAYER_NAMES = {
    "attention.attention.query": "q", "attention.attention.key": "k",
    "attention.attention.value": "v", "attention.output.dense": "attn.proj",
    "intermediate.dense": "mlp.fc1", "output.dense": "mlp.fc2",  # the classic names
    "attention.q_proj": "q", "attention.k_proj": "k", "attention.v_proj": "v",
    "attention.o_proj": "attn.proj", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2",  # >= 5
    "layernorm_before": "norm1", "layernorm_after": "norm2",
}


def _config(metadata) -> dict | None:
    """The config.json beside the weights when it is transformers' (timm's and vitzoo's are not)."""
    document = metadata.get(CONFIG_NAME)
    if document is None:
        return None
    vit = document.get("model_type") == "vit" or any(
        str(a).startswith("ViT") for a in document.get("architectures") or [])
    return document if vit else None


class TransformersFormat(WeightFormat):
    name = FORMAT
    marks = ("embeddings.patch_embeddings.projection.weight", "embeddings.position_embeddings")

    def recognises(self, keys, metadata) -> bool:
        return super().recognises({k.removeprefix("vit.") for k in keys}, metadata)

    def convert(self, state_dict, metadata) -> ConvertedWeights:
        document = _config(metadata) or {}
        act = document.get("hidden_act", "gelu")
        if act not in HIDDEN_ACT:
            raise CheckpointError(f"transformers' hidden_act={act!r} is not one of "
                                  f"{sorted(HIDDEN_ACT)}")
        config: dict[str, Any] = {"act": HIDDEN_ACT[act], "pool": "token",
                                  "norm_eps": float(document.get("layer_norm_eps", 1e-12))}
        if document:  # transformers' own default where its config.json leaves it out
            config["num_heads"] = int(document.get("num_attention_heads", 12))
        params = {k.removeprefix("vit."): v for k, v in state_dict.items()}
        params.pop("embeddings.mask_token", None)  # masked-image-modelling input, unused
        out = {"stem.proj.weight": params.pop("embeddings.patch_embeddings.projection.weight"),
               "stem.proj.bias": params.pop("embeddings.patch_embeddings.projection.bias"),
               "cls_token": params.pop("embeddings.cls_token"),
               "encoder.pos_embed.weight": params.pop("embeddings.position_embeddings"),
               "encoder.norm.weight": params.pop("layernorm.weight"),
               "encoder.norm.bias": params.pop("layernorm.bias")}
        qkv: dict[tuple[str, str], dict] = {}
        for key in list(params):
            match = LAYER.match(key)
            if match and match.group(2) in LAYER_NAMES:
                i, name, kind = match.groups()
                target = LAYER_NAMES[name]
                if target in ("q", "k", "v"):
                    qkv.setdefault((i, kind), {})[target] = params.pop(key)
                else:
                    out[f"encoder.blocks.{i}.{target}.{kind}"] = params.pop(key)
        for (i, kind), parts in qkv.items():
            out[f"encoder.blocks.{i}.attn.qkv.{kind}"] = torch.cat([parts[c] for c in "qkv"])
            if kind == "weight" and (i, "bias") not in qkv:  # qkv_bias=False: zeros, the same
                out[f"encoder.blocks.{i}.attn.qkv.bias"] = parts["q"].new_zeros(
                    3 * parts["q"].shape[0])
        take_head(params, out, config, pre_logits="pooler.dense", classifier="classifier")
        grid = square_grid(out["encoder.pos_embed.weight"].shape[1] - 1, FORMAT)
        return ConvertedWeights(FORMAT, {**out, **params}, config, grid)

    def hints(self, metadata) -> dict[str, Any]:
        """Image size and channels from config.json, normalisation from the preprocessor's."""
        document, processor = _config(metadata), metadata.get(PREPROCESSOR_NAME)
        if document is None:
            return {}
        found: dict[str, Any] = {}
        if "image_size" in document:
            found["img_size"] = document["image_size"]
        if "num_channels" in document:
            found["in_chans"] = int(document["num_channels"])
        if processor:  # ViTImageProcessor resizes to the input size: no crop
            found.update(crop_pct=1.0,
                         interpolation=PIL_RESAMPLE.get(processor.get("resample", 2), "bilinear"))
            if processor.get("image_mean") and processor.get("image_std"):
                found.update(mean=tuple(processor["image_mean"]),
                             std=tuple(processor["image_std"]))
        return found

    def labels(self, metadata) -> list[str] | None:
        """id2label's names, unless they are transformers' placeholders (LABEL_0, ...)."""
        id2label = (_config(metadata) or {}).get("id2label") or {}
        try:
            names = [str(id2label[key]) for key in sorted(id2label, key=int)]
        except (TypeError, ValueError):
            return None
        placeholders = all(name == f"LABEL_{i}" for i, name in enumerate(names))
        return names if names and not placeholders else None


# ---------------------------------------------------------------- writing: what transformers loads
_TO_TRANSFORMERS = {"stem.proj": "vit.embeddings.patch_embeddings.projection",
                    "encoder.norm": "vit.layernorm", "head.fc": "classifier"}
_BLOCK_NAMES = {"norm1": "layernorm_before", "norm2": "layernorm_after",
                "attn.proj": "attention.output.dense", "mlp.fc1": "intermediate.dense",
                "mlp.fc2": "output.dense"}
_BLOCK = re.compile(r"^encoder\.blocks\.(\d+)\.(.+)\.(weight|bias)$")


def to_transformers(state_dict: dict) -> dict:
    """vitzoo's names as `ViTForImageClassification`'s classic ones, q, k and v split."""
    out = {}
    for key, tensor in state_dict.items():
        prefix, _, kind = key.rpartition(".")
        match = _BLOCK.match(key)
        layer = f"vit.encoder.layer.{match.group(1)}." if match else ""
        if key == "cls_token":
            out["vit.embeddings.cls_token"] = tensor
        elif key == "encoder.pos_embed.weight":
            out["vit.embeddings.position_embeddings"] = tensor
        elif prefix in _TO_TRANSFORMERS:
            out[f"{_TO_TRANSFORMERS[prefix]}.{kind}"] = tensor
        elif match and match.group(2) == "attn.qkv":
            for part, chunk in zip(("query", "key", "value"), tensor.chunk(3)):
                out[f"{layer}attention.attention.{part}.{kind}"] = chunk
        else:  # `card.obstacles` leaves no other tensor
            out[f"{layer}{_BLOCK_NAMES[match.group(2)]}.{kind}"] = tensor
    return out


def document(config, labels: list[str] | None) -> dict:
    """transformers' ViTConfig keys for `config`'s model."""
    names = [f"LABEL_{i}" for i in range(config.num_classes)] if labels is None else list(labels)
    h, w = config.img_size
    return {"architectures": ["ViTForImageClassification"], "model_type": "vit",
            "hidden_size": config.embed_dim, "num_hidden_layers": config.depth,
            "num_attention_heads": config.num_heads, "intermediate_size": config.mlp_dim,
            "hidden_act": {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}[config.act],
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
            "layer_norm_eps": config.norm_eps, "image_size": h if h == w else [h, w],
            "patch_size": config.patch_size, "num_channels": config.in_chans, "qkv_bias": True,
            "encoder_stride": config.patch_size,
            "id2label": {str(i): name for i, name in enumerate(names)},
            "label2id": {name: i for i, name in enumerate(names)}}


def preprocessor(config) -> dict:
    """preprocessor_config.json: ViTImageProcessor resizing to the input size (it has no crop)."""
    h, w = config.img_size
    resample = {name: number for number, name in PIL_RESAMPLE.items()}[config.interpolation]
    return {"image_processor_type": "ViTImageProcessor", "do_resize": True,
            "size": {"height": h, "width": w}, "resample": resample, "do_rescale": True,
            "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": list(config.mean),
            "image_std": list(config.std)}
