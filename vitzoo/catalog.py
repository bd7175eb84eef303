"""The pretrained tags in the registry: checked, listed, looked up by name, tabulated.

    vitzoo.create("vit_b16", pretrained=True)                  # the model's default tag
    vitzoo.create("vit_b16.orig_in21k", pretrained=True)       # a named tag
    vitzoo.create("vit_b16.orig_in21k@REV", pretrained=True)   # its repo at a branch, tag or commit
    vitzoo.create("vit_b16.orig_in21k")                        # its architecture, no weights
    vitzoo.list_pretrained("vit_b16*")
    vitzoo list --pretrained --markdown                        # the table of docs/pretrained.md

Without `pretrained=True` a tag name builds the tag's architecture (resolution, classes,
preprocessing) with fresh weights, as timm does. Loading a tag's weights is
`vitzoo.pretrained.resolve_tag`: this module imports no model.
"""

from __future__ import annotations

import difflib
import fnmatch
import re

from vitzoo.errors import ConfigError, PluginError
from vitzoo.weights.hub import check_revision
from vitzoo.options import closest
from vitzoo.registry import get_registry
from vitzoo.tags import REVISION_SEPARATOR, SEPARATOR, PretrainedTag
from vitzoo.zoo import TIMM_ARCHITECTURES

KIND = "pretrained_tag"  # the registry's kind (vitzoo.registry.KINDS)


def registered() -> dict[str, PretrainedTag]:
    """The registered tags by name, checked: each is a PretrainedTag under its own name, of a
    registered model and weight format, and a model has at most one default."""
    tables = get_registry().tables()
    defaults: dict[str, str] = {}
    for name, tag in tables[KIND].items():
        if not isinstance(tag, PretrainedTag) or tag.name != name:
            raise PluginError(f"pretrained tag {name!r} must be a vitzoo.tags.PretrainedTag whose "
                              f"name (MODEL.TAG) is {name!r}, got {tag!r}")
        for kind, value in (("model", tag.model), ("weight_format", tag.format)):
            if value not in tables[kind]:
                raise PluginError(f"pretrained tag {name!r} names the {kind.replace('_', ' ')} "
                                  f"{value!r}, which is not registered; install the plugin that "
                                  "provides it")
        if tag.default:
            if tag.model in defaults:
                raise PluginError(f"model {tag.model!r} has two default pretrained tags: "
                                  f"{defaults[tag.model]!r} and {name!r}; only one may set "
                                  "default=True")
            defaults[tag.model] = name
    return tables[KIND]


def list_pretrained(pattern: str = "*") -> list[str]:
    """Names (MODEL.TAG) of the registered tags, filtered with an fnmatch pattern."""
    return sorted(name for name in registered() if fnmatch.fnmatchcase(name, pattern))


def tags_of(model: str) -> list[PretrainedTag]:
    return [tag for name, tag in sorted(registered().items()) if tag.model == model]


def _models_with_tags() -> str:
    return ", ".join(sorted({tag.model for tag in registered().values()}))


def default_tag(model: str) -> PretrainedTag:
    """The tag `create(model, pretrained=True)` loads: the one marked default, else the only one."""
    tags = tags_of(model)
    marked = [tag for tag in tags if tag.default]
    if marked or len(tags) == 1:
        return (marked or tags)[0]
    if not tags:
        raise ConfigError(f"model {model!r} has no pretrained weights registered, so "
                          "pretrained=True has nothing to load. Models with weights: "
                          f"{_models_with_tags()}; or pass pretrained=PATH or "
                          "pretrained='hf-hub:ORG/NAME'")
    raise ConfigError(f"model {model!r} has several pretrained tags and none is the default; name "
                      "one: " + ", ".join(tag.name for tag in tags))


def get_tag(model: str, tag: str) -> PretrainedTag:
    name = f"{model}{SEPARATOR}{tag}"
    found = registered().get(name)
    if found is None:
        available = [t.name for t in tags_of(model)]
        listing = (f"Tags of {model}: {', '.join(available)}" if available else
                   f"{model} has no pretrained tags; models with some: {_models_with_tags()}")
        raise ConfigError(f"unknown pretrained tag {name!r}." + closest(name, available)
                          + f" {listing}")
    return found


def from_timm_name(name: str) -> tuple[str, dict]:
    """timm's name of one of the paper's models as vitzoo's, with the resolution it names:
    `vit_tiny_patch16_224` -> ("vit_ti16", {}), `vit_base_patch16_384` -> ("vit_b16",
    {"img_size": 384}), `vit_base_patch16_384.TAG@REV` -> ("vit_b16.TAG@REV", {}) (a tag decides
    its own resolution). Any other name is returned unchanged."""
    model, rest = re.match(r"([^.@]*)(.*)", name).groups()
    architecture, size = re.fullmatch(r"(.+?)(?:_(\d+))?", model).groups()
    if architecture not in TIMM_ARCHITECTURES or model in get_registry().tables()["model"]:
        return name, {}
    vitzoo_name = TIMM_ARCHITECTURES[architecture]
    # another resolution than the model's is an option (a default tag's weights are resampled)
    native = tuple(get_registry().get("model", vitzoo_name).img_size)
    other_size = size and not rest and (int(size),) * 2 != native
    return vitzoo_name + rest, ({"img_size": int(size)} if other_size else {})


def _unknown_model(model: str) -> ConfigError | None:
    """The refusal of a model name nothing registers, pointing from a near timm name to vitzoo's."""
    timm_names = {f"{arch}_224": name for arch, name in TIMM_ARCHITECTURES.items()}
    near = difflib.get_close_matches(model, list(timm_names), n=1, cutoff=0.75)
    if not near:
        return None
    models = sorted(get_registry().tables()["model"])
    return ConfigError(f"unknown model name {model!r}. Did you mean {timm_names[near[0]]} (timm: "
                       f"{near[0]})? Available: {', '.join(models)}; timm's names of them are "
                       "taken too (vit_tiny_patch16_224)")


def lookup(name: str, pretrained: bool) -> tuple[str, PretrainedTag | None, str | None]:
    """`MODEL[.TAG][@REVISION]` -> (model name, the tag or None, revision or None). With
    `pretrained` and no tag, the model's default tag."""
    text, at, revision = name.partition(REVISION_SEPARATOR)
    if at and not revision:
        raise ConfigError(f"{name!r}: write MODEL.TAG@REVISION (a branch, tag or commit of the "
                          "tag's Hub repo)")
    model, _, tag_name = text.partition(SEPARATOR)
    if model not in get_registry().tables()["model"]:
        refusal = _unknown_model(model)
        if refusal is not None:
            raise refusal
    get_registry().get("model", model)  # unknown model names fail here, with suggestions
    if revision:
        if not pretrained:
            raise ConfigError(f"{name!r} names a revision of downloaded weights: pass "
                              "pretrained=True to load them")
        check_revision(revision)
    if tag_name:
        return model, get_tag(model, tag_name), revision or None
    if revision:
        return model, default_tag(model), revision
    return model, default_tag(model) if pretrained else None, None


def config_of(name: str):
    """The config a model name or a tag (`MODEL.TAG`) stands for: the architecture, and for a tag
    the preprocessing and classes of its weights, as `create(name)` builds it."""
    model, tag, _ = lookup(name, pretrained=False)
    return get_registry().get("model", model).replace(**(tag.config_options() if tag else {}))


def markdown_table(pattern: str = "*") -> str:
    """The registered tags as a Markdown table (docs/pretrained.md)."""
    lines = ["| model | tag | Hub repo | format | resolution | classes | ImageNet top-1 (source) |",
             "|---|---|---|---|---|---|---|"]
    tags = registered()  # checked once, not once per tag
    for name in list_pretrained(pattern):
        tag = tags[name]
        accuracy = (f"{tag.accuracy:.2f} ({tag.accuracy_source})" if tag.accuracy is not None
                    else "-")
        repo = f"[{tag.hub_id}](https://huggingface.co/{tag.hub_id})"
        lines.append(f"| {tag.model} | `{tag.tag}`{' (default)' if tag.default else ''} | {repo} | "
                     f"{tag.format} | {tag.img_size} | {tag.num_classes or 'none (features)'} | "
                     f"{accuracy} |")
    return "\n".join(lines) + "\n"
