"""Hugging Face transformers ViT checkpoints (`ViTModel`, `ViTForImageClassification`).

Both the Hub's classic names (`encoder.layer.{i}.attention.attention.{query,key,value}`,
`attention.output.dense`, `intermediate.dense`, `output.dense`) and those of transformers >= 5
(`layers.{i}.attention.{q,k,v,o}_proj`, `mlp.fc1`, `mlp.fc2`), with or without the classifier's
`vit.` prefix: `embeddings.*`, `layernorm_before`/`layernorm_after`, `layernorm`, `classifier`,
and a bare `ViTModel`'s `pooler.dense` (vitzoo's pre-logits layer). q, k and v are fused.

The options the weights decide come from the checkpoint's `config.json` when there is one
(`hidden_act`, `layer_norm_eps`, `num_attention_heads`, `image_size`, ...); a bare state dict gets
transformers' defaults: exact GELU and LayerNorm eps 1e-12.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from vitzoo.errors import CheckpointError
from vitzoo.weights.converted import ConvertedWeights, take_head
from vitzoo.weights.formats import Metadata, WeightFormat
from vitzoo.weights.layout import CONFIG_NAME, PREPROCESSOR_NAME, square_grid

FORMAT = "transformers"
DEFAULT_EPS = 1e-12
TRANSFORMERS_HEADS = 12  # transformers.ViTConfig's num_attention_heads
# transformers' hidden_act names -> vitzoo.config.ACTIVATIONS
HIDDEN_ACT = {"gelu": "gelu", "gelu_python": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
              "gelu_new": "gelu_tanh",
               "gelu_fast": "gelu_tanh"}

# PIL resampling filters in a preprocessor_config.json -> vitzoo's interpolation names
PIL_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}

_LAYER = re.compile(r"^(?:encoder\.layer|layers)\.(\d+)\.(.+)$")
_LAYER_NAMES = {
    # classic layout
    "attention.attention.query": "q", "attention.attention.key": "k",
    "attention.attention.value": "v", "attention.output.dense": "attn.proj",
    "intermediate.dense": "mlp.fc1", "output.dense": "mlp.fc2",
    # transformers >= 5
    "attention.q_proj": "q", "attention.k_proj": "k", "attention.v_proj": "v",
    "attention.o_proj": "attn.proj", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2",
    # both
    "layernorm_before": "norm1", "layernorm_after": "norm2",
}


def _strip(keys) -> set[str]:
    return {k[4:] if k.startswith("vit.") else k for k in keys}


def is_transformers_config(document: dict) -> bool:
    architectures = document.get("architectures") or []
    return document.get("model_type") == "vit" or any(a.startswith("ViT") for a in architectures)


def config_options(document: dict) -> dict[str, Any]:
    """vitzoo options from a transformers `config.json` (those it states)."""
    options: dict[str, Any] = {}
    act = document.get("hidden_act", "gelu")
    if act not in HIDDEN_ACT:
        raise CheckpointError(f"the transformers config has hidden_act={act!r}; vitzoo supports "
                              f"{sorted(HIDDEN_ACT)}")
    options["act"] = HIDDEN_ACT[act]
    options["norm_eps"] = float(document.get("layer_norm_eps", DEFAULT_EPS))
    # transformers' own default where its config.json leaves it out (as transformers would build it)
    options["num_heads"] = int(document.get("num_attention_heads", TRANSFORMERS_HEADS))
    return options


def describe(document: dict, processor: dict | None = None) -> dict[str, Any]:
    """Options a config.json (and preprocessor_config.json) state that the weights do not decide but
    an inferred config needs: image size, channels, normalisation."""
    extra: dict[str, Any] = {}
    if "image_size" in document:
        extra["img_size"] = document["image_size"]
    if "num_channels" in document:
        extra["in_chans"] = int(document["num_channels"])
    if processor and processor.get("image_mean") and processor.get("image_std"):
        extra.update(mean=tuple(processor["image_mean"]), std=tuple(processor["image_std"]))
    if processor:  # ViTImageProcessor resizes to the input size, no crop, bilinear unless it says
        extra.update(crop_pct=1.0,
                     interpolation=PIL_RESAMPLE.get(processor.get("resample", 2), "bilinear"))
    return extra


def labels(document: dict | None) -> list[str] | None:
    """The class names of a transformers config.json (`id2label`), or None when it has none or only
    the placeholders transformers writes by default (LABEL_0, LABEL_1, ...)."""
    id2label = (document or {}).get("id2label") or {}
    try:
        names = [id2label[key] for key in sorted(id2label, key=int)]
    except (TypeError, ValueError):
        return None
    if not names or all(name == f"LABEL_{i}" for i, name in enumerate(names)):
        return None
    return [str(name) for name in names]


def _config(metadata: Metadata) -> dict | None:
    """The config.json beside the weights when it is transformers' (timm's and vitzoo's are not)."""
    document = metadata.get(CONFIG_NAME)
    return document if document is not None and is_transformers_config(document) else None


class TransformersFormat(WeightFormat):
    name = FORMAT
    marks = ("embeddings.patch_embeddings.projection.weight", "embeddings.position_embeddings")

    def recognises(self, keys, metadata: Metadata) -> bool:
        return super().recognises(_strip(keys), metadata)  # the classifier's names start with vit.

    def convert(self, state_dict: dict[str, torch.Tensor], metadata: Metadata) -> ConvertedWeights:
        """transformers names -> a vitzoo `ConvertedWeights`; the options from a transformers
        config.json beside the weights, else transformers' defaults."""
        document = _config(metadata)
        params = {k[4:] if k.startswith("vit.") else k: v for k, v in state_dict.items()}
        out: dict[str, torch.Tensor] = {}
        config: dict[str, Any] = {"act": "gelu", "norm_eps": DEFAULT_EPS}
        if document:
            config.update(config_options(document))
        out["stem.proj.weight"] = params.pop("embeddings.patch_embeddings.projection.weight")
        out["stem.proj.bias"] = params.pop("embeddings.patch_embeddings.projection.bias")
        out["cls_token"] = params.pop("embeddings.cls_token")
        params.pop("embeddings.mask_token", None)  # masked-image-modelling input, unused here
        pos = params.pop("embeddings.position_embeddings")
        out["encoder.pos_embed.weight"] = pos
        grid = square_grid(pos.shape[1] - 1, FORMAT)
        qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
        for key in list(params):
            match = _LAYER.match(key)
            if not match:
                continue
            i, rest = match.groups()
            name, _, kind = rest.rpartition(".")
            if name not in _LAYER_NAMES:
                continue
            target = _LAYER_NAMES[name]
            value = params.pop(key)
            if target in ("q", "k", "v"):
                qkv.setdefault((i, kind), {})[target] = value
            else:
                out[f"encoder.blocks.{i}.{target}.{kind}"] = value
        for (i, kind), parts in qkv.items():
            if set(parts) != {"q", "k", "v"}:
                raise CheckpointError(f"transformers layer {i} has {sorted(parts)} of the q, k, v "
                                      f"{kind}s, not all three")
            out[f"encoder.blocks.{i}.attn.qkv.{kind}"] = torch.cat([parts[c] for c in "qkv"])
        for i, kind in [(i, "bias") for (i, k) in qkv if k == "weight" and (i, "bias") not in qkv]:
            # qkv_bias=False: vitzoo's projection always has a bias; zeros are the same function
            weight = out[f"encoder.blocks.{i}.attn.qkv.weight"]
            out[f"encoder.blocks.{i}.attn.qkv.bias"] = weight.new_zeros(weight.shape[0])
        for kind in ("weight", "bias"):
            out[f"encoder.norm.{kind}"] = params.pop(f"layernorm.{kind}")
        config["pool"] = "token"
        take_head(params, out, config, pre_logits="pooler.dense", classifier="classifier")
        out.update(params)
        return ConvertedWeights(format=FORMAT, state_dict=out, config=config, grid=grid)

    def hints(self, metadata: Metadata) -> dict[str, Any]:
        document = _config(metadata)
        return describe(document, metadata.get(PREPROCESSOR_NAME)) if document is not None else {}

    def labels(self, metadata: Metadata) -> list[str] | None:
        return labels(_config(metadata))


# vitzoo's names -> the classic names of the checkpoints on the Hub, which every transformers
# version loads (transformers >= 5 renames them to its own as it loads them)
_TO_TRANSFORMERS = {
    "stem.proj": "vit.embeddings.patch_embeddings.projection", "encoder.norm": "vit.layernorm",
    "head.fc": "classifier",
}
_BLOCK_TO_TRANSFORMERS = {
    "norm1": "layernorm_before", "norm2": "layernorm_after", "attn.proj": "attention.output.dense",
    "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense",
}
_VITZOO_BLOCK = re.compile(r"^encoder\.blocks\.(\d+)\.(.+)\.(weight|bias)$")


def to_transformers(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A vitzoo state dict in the names of transformers' `ViTForImageClassification` (q, k and v
    split from the fused projection; the tensors' values unchanged): what
    `TransformersFormat.convert` reads back. Only a model transformers' ViT builds is written so
    (`vitzoo.checkpoints.layouts` decides); a tensor with no name there is a CheckpointError."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        match = _VITZOO_BLOCK.match(key)
        prefix, _, kind = key.rpartition(".")
        if key == "cls_token":
            out["vit.embeddings.cls_token"] = tensor
        elif key == "encoder.pos_embed.weight":
            out["vit.embeddings.position_embeddings"] = tensor
        elif prefix in _TO_TRANSFORMERS:
            out[f"{_TO_TRANSFORMERS[prefix]}.{kind}"] = tensor
        elif match and match.group(2) == "attn.qkv":
            layer = f"vit.encoder.layer.{match.group(1)}.attention.attention"
            for part, chunk in zip(("query", "key", "value"), tensor.chunk(3)):
                out[f"{layer}.{part}.{kind}"] = chunk
        elif match and match.group(2) in _BLOCK_TO_TRANSFORMERS:
            name = f"{match.group(1)}.{_BLOCK_TO_TRANSFORMERS[match.group(2)]}.{kind}"
            out[f"vit.encoder.layer.{name}"] = tensor
        else:
            raise CheckpointError(f"the tensor {key!r} has no name in transformers' "
                                  "ViTForImageClassification; this model is not one transformers "
                                  "builds: save it in timm's or vitzoo's layout")
    return out
