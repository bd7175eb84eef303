"""The layouts a saved or pushed model is written in, so that the library its user has loads it:

    timm          timm's config.json keys and names: `timm.create_model("hf-hub:ORG/NAME", ...)`
    transformers  ViTConfig keys, preprocessor_config.json and transformers' names:
                  `ViTForImageClassification.from_pretrained("ORG/NAME")`
    vitzoo        vitzoo's own config.json and names, for the models neither library builds

Every config.json also holds vitzoo's keys (format, model, labels, `weight_names`), so vitzoo reads
each layout back exactly: tensors are only renamed, never changed. `choose` picks the layout:
"auto" takes timm's where timm builds the model, else transformers', else vitzoo's; `obstacles`
says in words what keeps a library from building one. Dropout and drop_path stay in vitzoo's keys.
"""

from __future__ import annotations

from typing import Any

import torch

from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError
from vitzoo.weights.timm import to_timm
from vitzoo.weights.transformers import to_transformers
from vitzoo.zoo import SIZES

LAYOUTS = ("timm", "transformers", "vitzoo")
CHOICES = ("auto", *LAYOUTS)
NATIVE = "vitzoo"

# the keys of timm's and transformers' config.json that this module writes: dropped when a model is
# written in another layout, so that a document never states two libraries' configs
TIMM_KEYS = ("architecture", "num_classes", "num_features", "global_pool", "pretrained_cfg",
             "model_args", "label_names")
TRANSFORMERS_KEYS = ("architectures", "model_type", "hidden_size", "num_hidden_layers",
                     "num_attention_heads", "intermediate_size", "hidden_act",
                     "hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps",
                     "image_size", "patch_size", "num_channels", "qkv_bias", "encoder_stride",
                     "id2label", "label2id", "initializer_range", "torch_dtype", "dtype",
                     "transformers_version")

TIMM_EPS = 1e-6  # timm's VisionTransformer LayerNorm eps; its config.json cannot change it
TIMM_ACTS = {"gelu": "gelu", "gelu_tanh": "gelu_tanh"}  # vitzoo's act -> timm's act_layer name
TRANSFORMERS_ACTS = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}  # -> hidden_act
PIL_RESAMPLE = {"nearest": 0, "bilinear": 2, "bicubic": 3}  # interpolation -> PIL's filter number
# the hybrids' ResNet stages -> timm's architecture for that ResNetV2 (shapes from model_args)
TIMM_HYBRIDS = {(3, 4, 9): "vit_base_r50_s16", (3, 4, 6, 3): "vit_large_r50_s32",
                (2, 2, 2, 2): "vit_base_r26_s32"}
TIMM_HYBRID_ARCHITECTURES = frozenset({"vit_base_r50_s16_224", "vit_base_r50_s16_384",
                                       "vit_large_r50_s32_224", "vit_large_r50_s32_384",
                                       "vit_base_r26_s32_224"})
TIMM_SIZE_NAMES = {"ti": "tiny", "s": "small", "b": "base", "l": "large", "h": "huge"}
# timm's registered patch ViTs (timm 0.9 onwards): a model of one of these shapes is named by it,
# any other by vit_base_patch16_224 with its shape in model_args (they override the architecture's)
TIMM_PATCH_ARCHITECTURES = frozenset({
    "vit_tiny_patch16_224", "vit_tiny_patch16_384", "vit_small_patch8_224", "vit_small_patch16_224",
    "vit_small_patch16_384", "vit_small_patch32_224", "vit_small_patch32_384",
    "vit_base_patch8_224", "vit_base_patch16_224", "vit_base_patch16_384", "vit_base_patch32_224",
    "vit_base_patch32_384", "vit_large_patch14_224", "vit_large_patch16_224",
    "vit_large_patch16_384", "vit_large_patch32_224", "vit_large_patch32_384",
    "vit_huge_patch14_224",
})


# --------------------------------------------------------------------------------- what each builds
def _common_obstacles(config: ViTConfig, library: str) -> list[str]:
    """What neither timm's nor transformers' ViT builds: the position embedding, a plugin's part."""
    found = []
    if config.pos_embed != "learned_1d" or config.pos_embed_options:
        found.append(f"its position embedding (pos_embed={config.pos_embed!r}), where {library}'s "
                     "ViT learns one 1-D embedding")
    if config.pos_embed_mode != "input":
        found.append(f"position embeddings added {config.pos_embed_mode.replace('_', ' ')} "
                     f"(pos_embed_mode={config.pos_embed_mode!r}), where {library} adds them once, "
                     "to the input")
    if config.pool_options:
        found.append(f"pooling options {config.pool_options}, which {library}'s ViT does not take")
    if config.head != "linear" or config.head_options:
        found.append(f"a pre-logits layer (head={config.head!r}), which {library}'s ViT does not "
                     "have")
    if config.act not in TIMM_ACTS:
        found.append(f"the activation act={config.act!r}")
    if config.img_size[0] != config.img_size[1]:
        found.append(f"a {config.img_size[0]} x {config.img_size[1]} image: vitzoo reads "
                     f"{library}'s position embeddings back for square token grids only")
    return found


def timm_obstacles(config: ViTConfig) -> list[str]:
    """Why timm's VisionTransformer (with its config.json's model_args) cannot build `config`'s
    model; [] when it can, to the same logits."""
    found = _common_obstacles(config, "timm")
    if config.stem == "resnet":
        resnet = config.stem_options
        if tuple(resnet.get("layers", ())) not in TIMM_HYBRIDS or resnet.get("width", 1) != 1:
            found.append(f"a ResNet of stages {tuple(resnet.get('layers', ()))} and width "
                         f"{resnet.get('width', 1)}, where timm's hybrids have width 1 and stages "
                         f"{' or '.join(map(str, TIMM_HYBRIDS))}")
        if resnet.get("numerics", "official") != "timm":
            found.append("the official ResNet numerics (weight standardisation (w - mean) / (std + "
                         "1e-5), GroupNorm eps 1e-6), where timm's ResNetV2 computes (w - mean) / "
                         "sqrt(var + 1e-8) and eps 1e-5: create the model with "
                         "stem_options={'numerics': 'timm'} before training it for timm")
    elif config.stem != "patch" or config.stem_options:
        found.append(f"its stem (stem={config.stem!r}, options {config.stem_options}), where "
                     "timm's ViT cuts patches or runs a ResNetV2")
    if config.norm_eps != TIMM_EPS:
        found.append(f"LayerNorm eps {config.norm_eps:g}, where timm's ViT has {TIMM_EPS:g}")
    if config.pool == "token" and config.fc_norm:
        found.append("the final LayerNorm after the class token's pooling (fc_norm with "
                     "pool='token'), which timm's config.json states as average pooling")
    elif config.pool not in ("token", "gap"):
        found.append(f"the pooling pool={config.pool!r}, where timm pools the class token or the "
                     "average")
    if int(config.embed_dim * (config.mlp_dim / config.embed_dim)) != config.mlp_dim:
        found.append(f"an MLP of width {config.mlp_dim}, which timm's mlp_ratio cannot give for "
                     f"width {config.embed_dim}")
    return found


def transformers_obstacles(config: ViTConfig) -> list[str]:
    """Why transformers' ViTForImageClassification cannot build `config`'s model; [] when it can."""
    found = _common_obstacles(config, "transformers")
    if config.stem == "resnet":
        found.append("the hybrid's ResNet stem: transformers' ViT cuts patches only (timm builds "
                     "the R50 hybrids: use format='timm', the default)")
    elif config.stem != "patch" or config.stem_options:
        found.append(f"its stem (stem={config.stem!r}), where transformers' ViT cuts patches")
    if config.pool != "token":
        found.append(f"pool={config.pool!r}: transformers' ViTForImageClassification classifies "
                     "the class token only (timm pools the average: use format='timm', "
                     "the default)")
    elif config.fc_norm:
        found.append("the final LayerNorm after the pooling (fc_norm), where transformers norms "
                     "every token")
    if config.num_classes == 0:
        found.append("no classifier (num_classes=0), where ViTForImageClassification has one")
    return found


OBSTACLES = {"timm": timm_obstacles, "transformers": transformers_obstacles}


def choose(config: ViTConfig, requested: str = "auto") -> str:
    """The layout to write `config`'s model in: `requested` when its library builds the model
    ("auto": timm's, else transformers', else vitzoo's); a ConfigError says why a library asked for
    cannot, and what to use."""
    if requested not in CHOICES:
        raise ConfigError(f"format={requested!r} is not one of {', '.join(CHOICES)} (auto: timm's "
                          "layout where timm builds the model, else transformers', else vitzoo's)")
    if requested == NATIVE:
        return NATIVE
    if requested != "auto":
        found = OBSTACLES[requested](config)
        if found:
            others = [name for name in ("timm", "transformers")
                      if name != requested and not OBSTACLES[name](config)]
            instead = (f"format='{others[0]}' writes one {others[0]} loads, " if others else "") + \
                "format='vitzoo' (or 'auto') writes vitzoo's own layout"
            raise ConfigError(f"{requested} cannot load this model: it has {'; '.join(found)}. "
                              f"{instead}")
        return requested
    return next((name for name in ("timm", "transformers") if not OBSTACLES[name](config)), NATIVE)


# -------------------------------------------------------------------------------------- config.json
def timm_architecture(config: ViTConfig) -> str:
    """The registered timm model whose function builds `config`'s model, given model_args."""
    resolution = 384 if config.img_size == (384, 384) else 224
    if config.stem == "resnet":
        name = TIMM_HYBRIDS[tuple(config.stem_options["layers"])]
        at = f"{name}_{resolution}"
        return at if at in TIMM_HYBRID_ARCHITECTURES else f"{name}_224"
    size = next((name for name, shape in SIZES.items()
                 if all(getattr(config, k) == v for k, v in shape.items())), None)
    name = f"vit_{TIMM_SIZE_NAMES.get(size, 'base')}_patch{config.patch_size}_{resolution}"
    return name if name in TIMM_PATCH_ARCHITECTURES else "vit_base_patch16_224"


def timm_document(config: ViTConfig, labels: list[str] | None) -> dict[str, Any]:
    """timm's config.json keys for `config`'s model: its architecture, every shape in model_args,
    and the preprocessing in pretrained_cfg."""
    h, w = config.img_size
    model_args: dict[str, Any] = {
        "img_size": [h, w], "patch_size": config.patch_size, "in_chans": config.in_chans,
        "embed_dim": config.embed_dim, "depth": config.depth, "num_heads": config.num_heads,
        "mlp_ratio": config.mlp_dim / config.embed_dim, "class_token": config.pool == "token",
        "global_pool": "token" if config.pool == "token" else "avg", "fc_norm": config.fc_norm,
        "act_layer": TIMM_ACTS[config.act],
    }
    if config.dynamic_img_size:
        model_args["dynamic_img_size"] = True
    pretrained_cfg = {
        "input_size": [config.in_chans, h, w], "fixed_input_size": not config.dynamic_img_size,
        "interpolation": config.interpolation, "crop_pct": config.crop_pct, "crop_mode": "center",
        "mean": list(config.mean), "std": list(config.std), "num_classes": config.num_classes,
        "first_conv": ("patch_embed.backbone.stem.conv" if config.stem == "resnet"
                       else "patch_embed.proj"),
        "classifier": "head",
    }
    document = {"architecture": timm_architecture(config), "num_classes": config.num_classes,
                "num_features": config.embed_dim, "global_pool": model_args["global_pool"],
                "pretrained_cfg": pretrained_cfg, "model_args": model_args}
    if labels is not None:
        document["label_names"] = list(labels)
    return document


def transformers_document(config: ViTConfig, labels: list[str] | None) -> dict[str, Any]:
    """transformers' ViTConfig keys (config.json) for `config`'s model."""
    names = [f"LABEL_{i}" for i in range(config.num_classes)] if labels is None else list(labels)
    h, w = config.img_size
    return {
        "architectures": ["ViTForImageClassification"], "model_type": "vit",
        "hidden_size": config.embed_dim, "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads, "intermediate_size": config.mlp_dim,
        "hidden_act": TRANSFORMERS_ACTS[config.act], "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0, "layer_norm_eps": config.norm_eps,
        "image_size": h if h == w else [h, w], "patch_size": config.patch_size,
        "num_channels": config.in_chans, "qkv_bias": True, "encoder_stride": config.patch_size,
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
    }


def transformers_preprocessor(config: ViTConfig) -> dict[str, Any]:
    """preprocessor_config.json: ViTImageProcessor resizing to the input size and normalising (it
    has no centre crop, so the image is resized to the input size whatever crop_pct says)."""
    h, w = config.img_size
    return {"image_processor_type": "ViTImageProcessor", "do_resize": True,
            "size": {"height": h, "width": w}, "resample": PIL_RESAMPLE[config.interpolation],
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": list(config.mean), "image_std": list(config.std)}


def library_document(config: ViTConfig, labels: list[str] | None, layout: str) -> dict[str, Any]:
    """The keys of `layout`'s library for config.json ({} for vitzoo's own)."""
    if layout == "timm":
        return timm_document(config, labels)
    if layout == "transformers":
        return transformers_document(config, labels)
    return {}


def without_library_keys(document: dict[str, Any]) -> dict[str, Any]:
    """A config.json's keys less those of timm's and transformers' configs."""
    return {k: v for k, v in document.items() if k not in TIMM_KEYS and k not in TRANSFORMERS_KEYS}


def renamed(state_dict: dict[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """`state_dict` (vitzoo's names) in `layout`'s names."""
    if layout == "timm":
        return to_timm(state_dict)
    if layout == "transformers":
        return to_transformers(state_dict)
    return dict(state_dict)
