"""Which library loads a saved model, and the model card (README.md) that says so.

`choose` picks the layout a model is written in: "auto" takes timm's where timm builds the model,
else transformers', else vitzoo's. The card's front matter comes from huggingface_hub's
`ModelCardData` (so the Hub reads it); its body is the architecture and each library's loading
line. `card` options: repo_id, license, tags, dataset, metrics ({name: value}), description,
model_name.
"""

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
        found.append(f"a ResNet of stages {tuple(resnet.get('layers', ()))}, width "
                     f"{resnet.get('width', 1)}")
    if config.stem == "resnet" and resnet.get("numerics", "official") != "timm":
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
    found = obstacles(config, requested)
    if found:
        raise ConfigError(f"{requested} cannot load this model: it has {'; '.join(found)}. "
                          "format='vitzoo' (or 'auto') writes vitzoo's own layout")
    return requested


def check(card: dict | None) -> dict:
    """The card options, checked; metrics as finite floats."""
    card = dict(card or {})
    if set(card) - set(OPTIONS):
        raise ConfigError(f"unknown model card options {sorted(map(str, set(card) - set(OPTIONS)))}"
                          f"; the options are {', '.join(OPTIONS)}")
    for key in ("repo_id", "license", "dataset", "description", "model_name"):
        if card.get(key) is not None and not isinstance(card[key], str):
            raise ConfigError(f"card {key} must be text, got {card[key]!r}")
    tags, metrics = card.get("tags") or [], card.get("metrics") or {}
    if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
        raise ConfigError(f"card tags must be a list of text, got {tags!r}")
    if not isinstance(metrics, dict):
        raise ConfigError(f"card metrics must be a dict of name to number, got {metrics!r}")
    for name, value in metrics.items():
        number = (float(value) if isinstance(value, (int, float)) and not isinstance(value, bool)
                  else math.nan)
        if not isinstance(name, str) or not math.isfinite(number):
            raise ConfigError(f"card metrics: {name!r}: {value!r} is not a name with a finite "
                              'number; give e.g. {"accuracy": 0.981}')
        metrics[name] = number
    return {**card, "metrics": metrics}


def render(model, card: dict | None, layout: str) -> str:
    """The model card of `model` written in `layout`."""
    from huggingface_hub import EvalResult, ModelCardData

    card, config = check(card), model.config
    name = card.get("model_name") or card.get("repo_id", "").split("/")[-1] or "vitzoo-model"
    dataset, metrics = card.get("dataset"), card["metrics"]
    results = [EvalResult(task_type="image-classification", dataset_type=dataset,
                          dataset_name=dataset, metric_type=metric, metric_value=value)
               for metric, value in metrics.items()] if dataset and metrics else None
    tags = ["vitzoo", "vision-transformer", "image-classification", "pytorch", "safetensors",
            *([layout] if layout != "vitzoo" else []), *(card.get("tags") or [])]
    data = ModelCardData(library_name=layout, license=card.get("license", "apache-2.0"),
                         tags=list(dict.fromkeys(tags)), datasets=[dataset] if dataset else None,
                         metrics=list(metrics) or None, pipeline_tag="image-classification",
                         model_name=name if results else None, eval_results=results)
    rows = {"image size": f"{config.img_size[0]} x {config.img_size[1]}, {config.in_chans} "
                          "channels",
            "stem": f"{config.stem} {config.stem_options or ''}, {config.patch_size}x"
                    f"{config.patch_size} patches",
            "layers (L)": config.depth, "width (D)": config.embed_dim, "MLP size": config.mlp_dim,
            "heads": config.num_heads,
            "position embedding": f"{config.pos_embed} ({config.pos_embed_mode})",
            "pooling": config.pool, "head": f"{config.head} {config.head_options or ''}",
            "classes": config.num_classes,
            "GELU / LayerNorm eps": f"{config.act} / {config.norm_eps:g}",
            "input normalisation": f"mean {list(config.mean)}, std {list(config.std)}",
            "parameters": f"{sum(p.numel() for p in model.parameters()):,}"}
    lines = ["---", data.to_yaml(), "---", "", f"# {name}", "",
             card.get("description") or 'A Vision Transformer (Dosovitskiy et al., "An Image is '
                                        'Worth 16x16 Words", ICLR 2021) saved with vitzoo.', ""]
    if metrics:
        lines += ["## Results", "", "| dataset | metric | value |", "|---|---|---|",
                  *(f"| {dataset or 'unknown'} | {m} | {v:g} |" for m, v in metrics.items()), ""]
    lines += ["## Architecture", "", "| option | value |", "|---|---|",
              *(f"| {key} | {value} |" for key, value in rows.items()), ""]
    return "\n".join(lines + usage(config, card.get("repo_id"), layout))


def usage(config: ViTConfig, repo_id: str | None, layout: str) -> list[str]:
    """The card's last section: each library's line that loads the repo, or why it cannot."""
    where = f"{HUB_PREFIX}{repo_id}" if repo_id else "path/to/this/directory"
    loaders = {"timm": f'import timm\nmodel = timm.create_model("'
                       f'{where if repo_id else "local-dir:" + where}", pretrained=True).eval()',
               "transformers": "from transformers import ViTForImageClassification\nmodel = "
                               f'ViTForImageClassification.from_pretrained("{repo_id or where}")'}
    h, w = config.img_size
    lines = [USAGE, "", f"The files are in {layout}'s layout, and vitzoo loads them exactly:", "",
             "```python", "import torch, vitzoo", f'model = vitzoo.from_pretrained("{where}").eval()',
             f"logits = model(torch.randn(1, {config.in_chans}, {h}, {w}))  # normalised images",
             "```", ""]
    if layout in loaders:
        lines += [f"With {layout}:", "", "```python", loaders[layout], "```", ""]
    for library in ("timm", "transformers"):
        found = obstacles(config, library) if library != layout else None
        if found:
            lines += [f"{library} cannot load this model: it has {'; '.join(found)}.", ""]
        elif found is not None:
            lines += [f"{library} builds this model too: push it with `vitzoo push DIR REPO "
                      f"--format {library}`.", ""]
    return lines


def with_usage(text: str, config: ViTConfig, repo_id: str | None, layout: str) -> str:
    """A card whose usage section is this repo's and layout's (appended when it has none)."""
    head, found, _ = text.partition(USAGE)
    return (head if found else text.rstrip("\n") + "\n\n") + "\n".join(usage(config, repo_id,
                                                                             layout))
