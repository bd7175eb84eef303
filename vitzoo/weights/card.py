"""Which library loads a saved model, and the model card (README.md) that says so: front matter
from huggingface_hub's `ModelCardData` (as the Hub reads it), the results, each library's loading
line. `choose`: "auto" is timm's layout where timm builds the model, else transformers', else
vitzoo's."""

from __future__ import annotations

import math

from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError
from vitzoo.weights.layout import HUB_PREFIX
from vitzoo.weights.timm import HYBRIDS

LAYOUTS = ("timm", "transformers", "vitzoo")
CHOICES = ("auto", *LAYOUTS)
OPTIONS = ("repo_id", "license", "tags", "dataset", "metrics", "description", "model_name")
USAGE = "## How to use"


def obstacles(config: ViTConfig, library: str) -> list[str]:
    """Why timm's or transformers' ViT cannot build `config`'s model to the same logits."""
    found, resnet = [], config.stem_options
    if config.pos_embed != "learned_1d" or config.pos_embed_options:
        found.append(f"its position embedding pos_embed={config.pos_embed!r}")
    if config.pos_embed_mode != "input":
        found.append(f"position embeddings at pos_embed_mode={config.pos_embed_mode!r}")
    if config.head != "linear" or config.head_options or config.pool_options:
        found.append(f"a pre-logits layer or pooling options (head={config.head!r})")
    if config.img_size[0] != config.img_size[1]:
        found.append("a non-square image")
    if config.stem not in ("patch", "resnet") or (config.stem == "patch" and resnet):
        found.append(f"its stem stem={config.stem!r}")
    if library == "transformers":
        if config.stem == "resnet":
            found.append("the hybrid's ResNet stem (format='timm' builds it)")
        if config.pool != "token" or config.fc_norm:
            found.append(f"pool={config.pool!r}, where transformers classifies the class token "
                         "alone (format='timm' pools otherwise)")
        if config.num_classes == 0:
            found.append("no classifier (num_classes=0)")
        return found
    if config.stem == "resnet" and (tuple(resnet.get("layers", ())) not in HYBRIDS
                                    or resnet.get("width", 1) != 1):
        found.append(f"a ResNet of stages {resnet.get('layers')}, width {resnet.get('width')}")
    if config.stem == "resnet" and resnet.get("numerics") != "timm":
        found.append("the official ResNet numerics: build it with stem_options={'numerics': "
                     "'timm'} to train it for timm")
    if config.norm_eps != 1e-6:
        found.append(f"LayerNorm eps {config.norm_eps:g}, where timm's is 1e-06")
    if config.pool not in ("token", "gap") or (config.pool == "token" and config.fc_norm):
        found.append(f"the pooling pool={config.pool!r} with fc_norm={config.fc_norm}")
    if int(config.embed_dim * (config.mlp_dim / config.embed_dim)) != config.mlp_dim:
        found.append(f"an MLP width {config.mlp_dim} that timm's mlp_ratio cannot give")
    return found


def choose(config: ViTConfig, requested: str = "auto") -> str:
    """The layout `requested` gives `config`'s model, or a ConfigError saying why not."""
    if requested not in CHOICES:
        raise ConfigError(f"format={requested!r} is not one of {', '.join(CHOICES)}")
    if requested in ("auto", "vitzoo"):
        return next((name for name in ("timm", "transformers")
                     if requested == "auto" and not obstacles(config, name)), "vitzoo")
    if found := obstacles(config, requested):
        raise ConfigError(f"{requested} cannot load this model: it has {'; '.join(found)}. "
                          "format='vitzoo' (or 'auto') writes vitzoo's own layout")
    return requested


def well_typed(option: str, value) -> bool:
    """Whether a card option's value is what the Hub's card data takes."""
    if option == "tags":
        return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    if option == "metrics":
        return isinstance(value, dict) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in value.values())
    return isinstance(value, str)


def render(model, card: dict | None, layout: str) -> str:
    """The model card of `model` written in `layout`: the card options (`OPTIONS`) and its use."""
    from huggingface_hub import EvalResult, ModelCardData

    card, c = dict(card or {}), model.config
    if unknown := sorted(set(card) - set(OPTIONS)):
        raise ConfigError(f"unknown model card options {unknown}: give {', '.join(OPTIONS)}")
    if wrong := [k for k, v in card.items() if not well_typed(k, v)]:
        raise ConfigError(f"model card options {wrong} have the wrong type: tags is a list of str, "
                          "metrics a dict of finite numbers, the others str")
    name = card.get("model_name") or card.get("repo_id", "").split("/")[-1] or "vitzoo-model"
    dataset, metrics = card.get("dataset"), card.get("metrics") or {}
    results = [EvalResult(task_type="image-classification", dataset_type=dataset,
                          dataset_name=dataset, metric_type=metric, metric_value=value)
               for metric, value in metrics.items()] if dataset and metrics else None
    tags = ["vitzoo", "vision-transformer", "image-classification", "pytorch", "safetensors",
            *([layout] if layout != "vitzoo" else []), *(card.get("tags") or [])]
    data = ModelCardData(library_name=layout, license=card.get("license", "apache-2.0"),
                         tags=list(dict.fromkeys(tags)), datasets=[dataset] if dataset else None,
                         metrics=list(metrics) or None, pipeline_tag="image-classification",
                         model_name=name if results else None, eval_results=results)
    size = sum(p.numel() for p in model.parameters())
    lines = ["---", data.to_yaml(), "---", "", f"# {name}", "", card.get("description") or
             'A Vision Transformer ("An Image is Worth 16x16 Words") saved with vitzoo.', "",
             f"{c.depth} layers of width {c.embed_dim}, {c.num_heads} heads, MLP size "
             f"{c.mlp_dim}, stem {c.stem} of {c.patch_size}x{c.patch_size} patches, "
             f"{c.img_size[0]}x{c.img_size[1]} px, {c.num_classes} classes: {size:,} parameters.",
             ""]
    if metrics:
        lines += ["## Results", "", "| dataset | metric | value |", "|---|---|---|",
                  *(f"| {dataset or 'unknown'} | {m} | {v:g} |" for m, v in metrics.items()), ""]
    return "\n".join(lines + usage(c, card.get("repo_id"), layout))


def usage(config: ViTConfig, repo_id: str | None, layout: str) -> list[str]:
    """The card's last section: each library's line that loads the repo, or why it cannot."""
    where = f"{HUB_PREFIX}{repo_id}" if repo_id else "path/to/this/directory"
    loaders = {"timm": f'import timm\nmodel = timm.create_model("'
                       f'{where if repo_id else "local-dir:" + where}", pretrained=True).eval()',
               "transformers": "from transformers import ViTForImageClassification\nmodel = "
                               f'ViTForImageClassification.from_pretrained("{repo_id or where}")'}
    lines = [USAGE, "", f"The files are in {layout}'s layout; vitzoo loads them exactly:", "",
             "```python", "import vitzoo", f'model = vitzoo.from_pretrained("{where}").eval()',
             "```", ""]
    if layout in loaders:
        lines += [f"With {layout}:", "", "```python", loaders[layout], "```", ""]
    for library in ("timm", "transformers"):
        found = obstacles(config, library) if library != layout else None
        if found:
            lines += [f"{library} cannot load this model: it has {'; '.join(found)}.", ""]
        elif found is not None:
            lines += [f"{library} builds it too: push it with `vitzoo push DIR REPO --format "
                      f"{library}`.", ""]
    return lines


def with_usage(text: str, config: ViTConfig, repo_id: str | None, layout: str) -> str:
    """A card whose usage section is this repo's and layout's (appended when it has none)."""
    head, found, _ = text.partition(USAGE)
    return (head if found else text.rstrip("\n") + "\n\n") + "\n".join(
        usage(config, repo_id, layout))
