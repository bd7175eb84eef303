"""Pretrained tags: released weights by name, as `MODEL.TAG` (`vit_b16.orig_in21k_ft_in1k`).

    vitzoo.create("vit_b16", pretrained=True)                     # the model's default tag
    vitzoo.create("vit_b16.orig_in21k", pretrained=True)          # a named tag
    vitzoo.create("vit_b16.orig_in21k@REVISION", pretrained=True) # the repo at a branch, tag or commit
    vitzoo.create("vit_b16.orig_in21k")                           # its architecture, no weights
    vitzoo.list_pretrained("vit_b16*")
    vitzoo list --pretrained --markdown                           # the README's table

A tag is data (`PretrainedTag`): the Hub repo that holds the weights, their format, and what the
weights expect (resolution, classes, normalisation, crop, interpolation). The paper's are in
`vitzoo.zoo.PRETRAINED`; they are registered through the `vitzoo_pretrained_tags` hook like any
plugin's. Without `pretrained=True` a tag name builds the tag's architecture (resolution, classes,
preprocessing) with fresh weights, as timm does. Downloading and loading a tag's weights is
`vitzoo.pretrained.load_tag`, through huggingface_hub (`vitzoo.hub`): this module imports no model.
"""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vitzoo.errors import ConfigError
from vitzoo.options import closest

KIND = "pretrained_tag"  # the registry's kind (vitzoo.registry.KINDS)
SEPARATOR = "."  # MODEL.TAG
REVISION_SEPARATOR = "@"  # MODEL.TAG@REVISION


@dataclass(frozen=True)
class PretrainedTag:
    """Released weights of a named model: where they are and what they expect."""

    model: str  # the registered model name, e.g. "vit_b16"
    tag: str  # e.g. "orig_in21k_ft_in1k"
    hub_id: str  # the Hub repo that holds them, ORG/NAME
    format: str  # the registered weight format of the repo's files ("timm", "transformers", ...)
    img_size: int  # the resolution they were trained (fine-tuned) at
    num_classes: int  # of their classifier; 0 = no classifier (features only)
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    crop_pct: float = 1.0
    interpolation: str = "bicubic"
    license: str = "apache-2.0"
    # the class names when the weights carry none: a key of vitzoo.labels.LABEL_SETS ("imagenet-1k")
    labels: str | None = None
    accuracy: float | None = None  # ImageNet top-1 (%) that `accuracy_source` reports for these weights
    accuracy_source: str = ""  # e.g. "paper, Table 5"
    default: bool = False  # the weights `create(model, pretrained=True)` loads
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)  # further ViTConfig options they need
    description: str = ""

    @property
    def name(self) -> str:
        return f"{self.model}{SEPARATOR}{self.tag}"

    def source(self, revision: str | None = None) -> str:
        """The `hf-hub:` reference of the weights (at `revision`)."""
        return f"hf-hub:{self.hub_id}" + (f"{REVISION_SEPARATOR}{revision}" if revision else "")

    def config_options(self) -> dict[str, Any]:
        """The ViTConfig options of the model the weights fit, and of their preprocessing."""
        return dict(img_size=self.img_size, num_classes=self.num_classes, mean=self.mean, std=self.std,
                    crop_pct=self.crop_pct, interpolation=self.interpolation, **self.options)


# ------------------------------------------------------------------------------------------- lookup
def registered() -> dict[str, PretrainedTag]:
    """The registered tags by name, checked: each is a PretrainedTag under its own name, of a
    registered model and weight format, and a model has at most one default."""
    from vitzoo.errors import PluginError
    from vitzoo.registry import get_registry

    tables = get_registry().tables()
    defaults: dict[str, str] = {}
    for name, tag in tables[KIND].items():
        if not isinstance(tag, PretrainedTag) or tag.name != name:
            raise PluginError(f"pretrained tag {name!r} must be a vitzoo.tags.PretrainedTag whose name "
                              f"(MODEL.TAG) is {name!r}, got {tag!r}")
        for kind, value in (("model", tag.model), ("weight_format", tag.format)):
            if value not in tables[kind]:
                raise PluginError(f"pretrained tag {name!r} names the {kind.replace('_', ' ')} {value!r}, which is "
                                  "not registered; install the plugin that provides it")
        if tag.default:
            if tag.model in defaults:
                raise PluginError(f"model {tag.model!r} has two default pretrained tags: {defaults[tag.model]!r} "
                                  f"and {name!r}; only one may set default=True")
            defaults[tag.model] = name
    return tables[KIND]


def list_pretrained(pattern: str = "*") -> list[str]:
    """Names (MODEL.TAG) of the registered tags, filtered with an fnmatch pattern."""
    return sorted(name for name in registered() if fnmatch.fnmatchcase(name, pattern))


def tags_of(model: str) -> list[PretrainedTag]:
    return [tag for name, tag in sorted(registered().items()) if tag.model == model]


def default_tag(model: str) -> PretrainedTag:
    """The tag `create(model, pretrained=True)` loads: the one marked default, else the only one."""
    tags = tags_of(model)
    marked = [tag for tag in tags if tag.default]
    if marked or len(tags) == 1:
        return (marked or tags)[0]
    if not tags:
        raise ConfigError(f"model {model!r} has no pretrained weights registered, so pretrained=True has "
                          f"nothing to load. Models with weights: {', '.join(_models_with_tags())}; or pass "
                          "pretrained=PATH or pretrained='hf-hub:ORG/NAME'")
    raise ConfigError(f"model {model!r} has several pretrained tags and none is the default; name one: "
                      + ", ".join(tag.name for tag in tags))


def _models_with_tags() -> list[str]:
    return sorted({tag.model for tag in registered().values()})


def get_tag(model: str, tag: str) -> PretrainedTag:
    name = f"{model}{SEPARATOR}{tag}"
    found = registered().get(name)
    if found is None:
        available = [t.name for t in tags_of(model)]
        listing = f"Tags of {model}: {', '.join(available)}" if available else \
            f"{model} has no pretrained tags; models with some: {', '.join(_models_with_tags())}"
        raise ConfigError(f"unknown pretrained tag {name!r}." + closest(name, available) + f" {listing}")
    return found


def lookup(name: str, pretrained: bool) -> tuple[str, PretrainedTag | None, str | None]:
    """`MODEL[.TAG][@REVISION]` -> (model name, the tag or None, revision or None). With `pretrained`
    and no tag, the model's default tag."""
    from vitzoo.hub import check_revision
    from vitzoo.registry import get_registry

    text, _, revision = name.partition(REVISION_SEPARATOR)
    if _ and not revision:
        raise ConfigError(f"{name!r}: write MODEL.TAG@REVISION (a branch, tag or commit of the tag's Hub repo)")
    model, _, tag_name = text.partition(SEPARATOR)
    get_registry().get("model", model)  # unknown model names fail here, with suggestions
    if revision:
        if not pretrained:
            raise ConfigError(f"{name!r} names a revision of downloaded weights: pass pretrained=True to load them")
        check_revision(revision)
    if tag_name:
        return model, get_tag(model, tag_name), revision or None
    if revision:
        return model, default_tag(model), revision
    return model, default_tag(model) if pretrained else None, None


# ------------------------------------------------------------------------------------------- the table
def markdown_table(pattern: str = "*") -> str:
    """The registered tags as a Markdown table (the README's "Pretrained weights" section)."""
    lines = ["| model | tag | Hub repo | format | resolution | classes | ImageNet top-1 (source) |",
             "|---|---|---|---|---|---|---|"]
    tags = registered()  # checked once, not once per tag
    for name in list_pretrained(pattern):
        tag = tags[name]
        accuracy = f"{tag.accuracy:.2f} ({tag.accuracy_source})" if tag.accuracy is not None else "-"
        lines.append(f"| {tag.model} | `{tag.tag}`{' (default)' if tag.default else ''} | "
                     f"[{tag.hub_id}](https://huggingface.co/{tag.hub_id}) | {tag.format} | {tag.img_size} | "
                     f"{tag.num_classes or 'none (features)'} | {accuracy} |")
    return "\n".join(lines) + "\n"
