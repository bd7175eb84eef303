"""The model card (README.md) that `save_pretrained` writes beside the weights.

YAML front matter as the Hub reads it (`library_name: vitzoo`, tags, license, and the dataset and
metrics when the caller knows them, as a `model-index`), a short architecture table, and how to load
the model. The front matter is produced by huggingface_hub's `ModelCardData`, so the Hub accepts it.

`card` options: `repo_id` (used in the loading snippet), `license` (default apache-2.0), `tags`,
`dataset` (name or id), `metrics` ({name: value}, e.g. {"accuracy": 0.981}), `description`,
`model_name`.
"""

from __future__ import annotations

import math
from typing import Any

from vitzoo.checkpoints import layouts
from vitzoo.checkpoints.layouts import NATIVE
from vitzoo.errors import ConfigError
from vitzoo.weights.layout import CONFIG_NAME, HUB_PREFIX, WEIGHTS_NAME

OPTIONS = ("repo_id", "license", "tags", "dataset", "metrics", "description", "model_name")
USAGE_HEADING = "## How to use"
LAYOUT_WORDS = {"timm": "timm's layout (its config.json keys and tensor names)",
                "transformers": "transformers' layout (its ViTConfig keys and tensor names)",
                "vitzoo": "vitzoo's own layout (its config and tensor names)"}
DEFAULT_TAGS = ["vitzoo", "vision-transformer", "image-classification", "pytorch", "safetensors"]


def _metric(name: Any, value: Any) -> float:
    """A metric's value as a finite float; anything else (None, a bool, text, NaN) is refused."""
    number = None
    if not isinstance(value, (bool, str, bytes)):
        try:
            number = float(value)
        except (TypeError, ValueError):
            pass
    if not isinstance(name, str) or not name or number is None or not math.isfinite(number):
        raise ConfigError(f"card metrics: {name!r}: {value!r} is not a metric name with a finite "
                          "number; "
                          'give e.g. {"accuracy": 0.981}')
    return number


def check(card: dict[str, Any] | None) -> dict[str, Any]:
    """The card options, checked (a ConfigError names the first bad one); metrics as floats."""
    card = dict(card or {})
    unknown = sorted(map(str, set(card) - set(OPTIONS)))
    if unknown:
        raise ConfigError(f"unknown model card option(s) {', '.join(unknown)}; the options are "
                          f"{', '.join(OPTIONS)}")
    for key in ("repo_id", "license", "dataset", "description", "model_name"):
        if card.get(key) is not None and not isinstance(card[key], str):
            raise ConfigError(f"card {key} must be text, got {card[key]!r}")
    tags = card.get("tags") or []
    if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
        raise ConfigError(f"card tags must be a list of text, got {tags!r}")
    metrics = card.get("metrics") or {}
    if not isinstance(metrics, dict):
        raise ConfigError(f"card metrics must be a dict of name to number, got {metrics!r}")
    card["metrics"] = {name: _metric(name, value) for name, value in metrics.items()}
    return card


def render(model, card: dict[str, Any] | None = None, layout: str = NATIVE) -> str:
    """The model card of `model` written in `layout` (`vitzoo.checkpoints.layouts`): the Hub's front
    matter names that layout's library, the usage section each library's line that loads it."""
    from huggingface_hub import EvalResult, ModelCardData

    card = check(card)
    config = model.config
    params = sum(p.numel() for p in model.parameters())
    name = card.get("model_name") or card.get("repo_id", "").split("/")[-1] or "vitzoo-model"
    own = [layout] if layout != NATIVE else []
    tags = list(dict.fromkeys(DEFAULT_TAGS + own + list(card.get("tags") or [])))
    dataset = card.get("dataset")
    metrics = card["metrics"]
    eval_results = None
    if dataset and metrics:
        eval_results = [
            EvalResult(task_type="image-classification", dataset_type=dataset, dataset_name=dataset,
                       metric_type=metric, metric_value=value)
            for metric, value in metrics.items()
        ]
    data = ModelCardData(
        library_name=layout,  # the library whose loading snippet the Hub shows
        license=card.get("license", "apache-2.0"),
        tags=tags,
        datasets=[dataset] if dataset else None,
        metrics=list(metrics) or None,
        pipeline_tag="image-classification",
        model_name=name if eval_results else None,
        eval_results=eval_results,
    )
    h, w = config.img_size
    resnet = config.stem_options
    stem = (f"ResNet {'-'.join(map(str, resnet.get('layers', ()))) or 'root'} (width "
            f"x{resnet.get('width', 1)}) + "
            f"{config.patch_size}x{config.patch_size} patches" if config.stem == "resnet"
            else f"{config.stem}, {config.patch_size}x{config.patch_size} patches"
            + "".join(f", {k} {v}" for k, v in config.stem_options.items()))
    rows = [
        ("image size", f"{h} x {w}, {config.in_chans} channels"),
        ("stem", stem),
        ("layers (L)", config.depth),
        ("width (D)", config.embed_dim),
        ("MLP size", config.mlp_dim),
        ("heads", config.num_heads),
        ("position embedding", f"{config.pos_embed} ({config.pos_embed_mode})"),
        ("pooling", config.pool),
        ("head", config.head + (f", pre-logits {config.head_options['representation_size']}"
                                if config.head_options.get("representation_size") else "")),
        ("classes", config.num_classes),
        ("GELU / LayerNorm eps", f"{config.act} / {config.norm_eps:g}"),
        ("input normalisation", f"mean {list(config.mean)}, std {list(config.std)}"),
        ("parameters", f"{params:,}"),
    ]
    lines = [
        "---",
        data.to_yaml(),
        "---",
        "",
        f"# {name}",
        "",
        card.get("description") or "A Vision Transformer (Dosovitskiy et al., \"An Image is Worth "
                                   "16x16 Words\", ICLR 2021) saved with vitzoo.",
        "",
    ]
    if metrics:
        lines += ["## Results", "", "| dataset | metric | value |", "|---|---|---|"]
        lines += [f"| {dataset or 'unknown'} | {metric} | {value:g} |"
                  for metric, value in metrics.items()]
        lines.append("")
    lines += ["## Architecture", "", "| option | value |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in rows]
    lines += ["", *usage(config, card.get("repo_id"), layout)]
    return "\n".join(lines)


def usage(config, repo_id: str | None, layout: str) -> list[str]:
    """The card's last section, "How to use": the line of each library that loads the model from the
    repo `repo_id` (or its directory) in `layout`, and for each that does not, why."""
    h, w = config.img_size
    where = f"{HUB_PREFIX}{repo_id}" if repo_id else "path/to/this/directory"
    loaders = {
        "timm": ["import timm", "",
                 f'model = timm.create_model("{where if repo_id else "local-dir:" + where}", '
                 "pretrained=True).eval()"],
        "transformers": ["from transformers import ViTForImageClassification", "",
                         'model = '
                         f'ViTForImageClassification.from_pretrained("{repo_id or where}").eval()'],
    }
    lines = [USAGE_HEADING, "", f"The files are in {LAYOUT_WORDS[layout]}, and vitzoo loads them "
                                "exactly:", "",
             "```python", "import torch, vitzoo", "",
             f'model = vitzoo.from_pretrained("{where}").eval()',
             f"x = torch.randn(1, {config.in_chans}, {h}, {w})  # images normalised with the mean "
             "and std above",
             "logits = model(x)", "```", ""]
    if layout in loaders:
        lines += [f"With {layout}:", "", "```python", *loaders[layout], "```", ""]
    for library in ("timm", "transformers"):
        if library == layout:
            continue
        found = layouts.OBSTACLES[library](config)
        if found:
            lines += [f"{library} cannot load this model: it has {'; '.join(found)}.", ""]
        else:
            lines += [f"{library} builds this model too, from its own layout: push it with "
                      f"`vitzoo push DIR REPO --format {library}` "
                      f"(`push_to_hub(..., format=\"{library}\")`).", ""]
    lines += [f"The full model config is in `{CONFIG_NAME}`, the weights in `{WEIGHTS_NAME}`.", ""]
    return lines


def with_usage(text: str, config, repo_id: str | None, layout: str) -> str:
    """A card `text` whose usage section (the last, from its heading on) is `usage`'s for this repo
    and layout; appended when the card has none (it was edited)."""
    head, found, _ = text.partition(USAGE_HEADING)
    head = head if found else text.rstrip("\n") + "\n\n"
    return head + "\n".join(usage(config, repo_id, layout))
