"""The registry, as timm's: a name becomes a component, a model's config, a tag or a format.

Plugins are pluggy's: the built-ins first, then the entry-point group ``vitzoo`` (none with
VITZOO_DISABLE_PLUGIN_AUTOLOAD=1); one that fails to import is warned about and skipped; a hook
vitzoo does not have and a name two plugins give are PluginErrors. A hook is called one plugin at
a time, so that every name's plugin is known."""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import importlib.metadata
import os
import re
import warnings
from typing import Any

import pluggy
import torch

from vitzoo import builtins, hookspecs
from vitzoo.config import PART_OPTIONS, ViTConfig
from vitzoo.envvars import env_flag
from vitzoo.errors import ConfigError, PluginError
from vitzoo.options import Options, closest
from vitzoo.weights import WeightFormat
from vitzoo.zoo import TIMM_ARCHITECTURES, PretrainedTag

ENTRY_POINT_GROUP = "vitzoo"
DISABLE_AUTOLOAD_ENV = "VITZOO_DISABLE_PLUGIN_AUTOLOAD"
KINDS = {"stem": "vitzoo_stems", "pos_embed": "vitzoo_pos_embeds", "pool": "vitzoo_pools",
         "head": "vitzoo_heads", "model": "vitzoo_models", "weight_format": "vitzoo_weight_formats",
         "pretrained_tag": "vitzoo_pretrained_tags"}  # kind of name -> the hook that provides it
COMPONENT_KINDS = ("stem", "pos_embed", "pool", "head")  # the parts a model is built from


class Registry:
    def __init__(self, autoload: bool | None = None) -> None:
        self.pm = pluggy.PluginManager("vitzoo")
        self.pm.add_hookspecs(hookspecs)
        self.failed_plugins: dict[str, str] = {}  # entry-point name -> its error
        self._tables: dict[str, dict[str, Any]] | None = None
        self.pm.register(builtins, name="vitzoo.builtins")
        if autoload if autoload is not None else not env_flag(DISABLE_AUTOLOAD_ENV):
            self._load_entry_points()
        self._check_hook_names()

    def _load_entry_points(self) -> None:
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:  # one at a time: a broken plugin hides no other
                self.pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=ep.name)
            except Exception as exc:  # noqa: BLE001 - any failure of foreign code
                self.failed_plugins[ep.name] = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"vitzoo plugin {ep.name!r} ({ep.value}) failed to load and is "
                              f"skipped: {self.failed_plugins[ep.name]}", RuntimeWarning,
                              stacklevel=3)

    def register(self, plugin: object, name: str | None = None) -> str:
        """A module or object with hookimpls registered (or refused whole); returns its name."""
        registered = self.pm.register(plugin, name=name)
        try:
            self._check_hook_names()
        except PluginError:
            self.pm.unregister(name=registered)
            raise
        self._tables = None
        return registered

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self._tables = None

    def _check_hook_names(self) -> None:
        """A hookimpl named like no hook is never called by pluggy: a PluginError naming it."""
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            unknown = sorted(caller.name for caller in self.pm.get_hookcallers(exc.plugin) or []
                             if not caller.has_spec() and any(
                                 i.plugin is exc.plugin and not i.optionalhook
                                 for i in caller.get_hookimpls()))
            said = " ".join(f"{hook!r} is not a vitzoo hook." + closest(hook, KINDS.values())
                            for hook in unknown)
            raise PluginError(f"plugin {self.pm.get_name(exc.plugin)!r}: {said} Rename the "
                              f"function to one of {', '.join(sorted(KINDS.values()))}") from exc

    def _collect(self, kind: str) -> dict[str, Any]:
        """Each plugin's names of `kind`, one plugin at a time (wrappers provide none)."""
        hook, table, owner = KINDS[kind], {}, {}
        providers = {impl.plugin: impl.plugin_name for impl in
                     getattr(self.pm.hook, hook).get_hookimpls()
                     if not (impl.wrapper or impl.hookwrapper)}
        for plugin, plugin_name in providers.items():
            others = [other for other in providers if other is not plugin]
            for provided in self.pm.subset_hook_caller(hook, remove_plugins=others)():
                if not isinstance(provided, dict):
                    raise PluginError(f"plugin {plugin_name!r}: {hook}() must return a dict, got "
                                      f"{type(provided).__name__}")
                for name, value in provided.items():
                    if name in owner:
                        raise PluginError(f"{kind} {name!r} is registered twice: by plugin "
                                          f"{owner[name]!r} and by plugin {plugin_name!r}")
                    owner[name], table[name] = plugin_name, value
        return table

    def tables(self) -> dict[str, dict[str, Any]]:
        if self._tables is None:
            self._tables = {kind: self._collect(kind) for kind in KINDS}
        return self._tables

    def names(self, kind: str) -> list[str]:
        return sorted(self.tables()[kind])

    def get(self, kind: str, name: str) -> Any:
        table = self.tables()[kind]
        if name not in table:
            raise ConfigError(f"unknown {kind.replace('_', ' ')} {name!r}." + closest(name, table)
                              + f" Available: {', '.join(sorted(table))}")
        return table[name]

    def parts(self, config: ViTConfig) -> dict[str, type]:
        """The components `config` names, each checking it, once a model of it is known to fit
        this machine's memory (a meta build allocates nothing): cheap, the same every time."""
        if torch.get_default_device().type != "meta":
            check_size(config)
        parts = {kind: self.get(kind, getattr(config, kind)) for kind in COMPONENT_KINDS}
        modes, mode = tuple(getattr(parts["pos_embed"], "modes", ())), config.pos_embed_mode
        if mode not in modes:
            raise ConfigError(f"pos_embed={config.pos_embed!r} with pos_embed_mode={mode!r} is "
                              f"undefined (the paper's Table 8 marks it n/a); it supports "
                              f"{modes}." + closest(str(mode), modes))
        for part in parts.values():
            if hasattr(part, "check"):
                part.check(config)
        return parts


def check_size(config: ViTConfig) -> None:
    """Refuse a model that cannot fit this machine's memory in float32, counted from its options
    (the blocks' matrices, a learned position table, the head) before anything is allocated."""
    d, (h, w), p = config.embed_dim, config.img_size, config.patch_size
    floor = config.depth * (4 * d * d + 2 * d * config.mlp_dim) + d * config.num_classes
    floor += (h // p) * (w // p) * d if config.pos_embed.startswith("learned") else 0
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # a system that does not say
        return
    if 4 * floor > memory:
        raise ConfigError(f"a model of at least {floor:.3g} parameters (embed_dim={d}, depth="
                          f"{config.depth}, mlp_dim={config.mlp_dim}, img_size={config.img_size}) "
                          f"is more than this machine's {memory / 2**30:.3g} GiB of memory: check "
                          "its options, and the config.json beside its weights")


_REGISTRY: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, built on first use."""
    return _REGISTRY or reset_registry()


def reset_registry(autoload: bool | None = None) -> Registry:
    """The registry built anew (after installing a plugin, or in tests)."""
    global _REGISTRY
    _REGISTRY = Registry(autoload=autoload)
    return _REGISTRY


# ---------------------------------------------------------------- a config, resolved
def options_class(component: Any, kind: str, name: str) -> type[Options] | None:
    """The dataclass of a component's own options (its `Options`), or None."""
    declared = getattr(component, "Options", None)
    if declared is not None and not (isinstance(declared, type) and issubclass(declared, Options)):
        raise PluginError(f"{kind} {name!r}: its Options must derive vitzoo.options.Options")
    return declared


def resolve_config(base: ViTConfig, *changes: dict[str, Any]) -> ViTConfig:
    """`base` with each dict of `changes` applied in turn (a part's options merged), every part
    known and its options checked and written out with their defaults: two configs of one model
    compare equal however they were written."""
    registry, declared = get_registry(), {}
    for kind in PART_OPTIONS:  # a name that is no text is the config's to refuse
        name = next((c[kind] for c in reversed(changes) if kind in c), getattr(base, kind))
        part = registry.get(kind, name) if isinstance(name, str) else None
        declared[kind] = options_class(part, kind, name)
    config = base
    for layer in changes:
        config = config.replace(**layer)
    written = {}
    for kind, key in PART_OPTIONS.items():
        if declared[kind] is None and getattr(config, key):
            raise ConfigError(f"{kind}={getattr(config, kind)!r} has no options of its own, got "
                              f"{key}={getattr(config, key)!r}; drop them")
        written[key] = (declared[kind].from_dict(getattr(config, key)).to_dict()
                        if declared[kind] is not None else {})
    resolved = dataclasses.replace(config, **written)  # whole: replace() would merge them
    registry.parts(resolved)
    return resolved


SHAPE_OPTIONS = ("stem", "embed_dim", "depth", "num_heads", "mlp_dim")  # make another model


def shape_differences(saved: ViTConfig, requested: ViTConfig, *changes: dict) -> list[str]:
    """How a saved model differs in shape from the one requested (with `changes`): its options
    and its parts' SHAPE options, as 'option=saved (not requested)'; [] for one architecture."""
    asked = {k: getattr(requested, k) for k in (*SHAPE_OPTIONS, *PART_OPTIONS,
                                                *PART_OPTIONS.values())}
    for layer in changes:
        for k in asked.keys() & layer.keys():
            asked[k] = {**asked[k], **layer[k]} if isinstance(asked[k], dict) else layer[k]
    differ = [f"{k}={getattr(saved, k)!r} (not {asked[k]!r})" for k in SHAPE_OPTIONS
              if getattr(saved, k) != asked[k]]
    for kind, key in PART_OPTIONS.items():
        declared = options_class(get_registry().get(kind, asked[kind]), kind, asked[kind])
        if declared is not None and not differ and asked[kind] == getattr(saved, kind):
            a, b = declared.from_dict(getattr(saved, key)), declared.from_dict(asked[key])
            differ += [f"{key}[{f!r}]={getattr(a, f)!r} (not {getattr(b, f)!r})"
                       for f in declared.SHAPE or declared.field_names()
                       if getattr(a, f) != getattr(b, f)]
    return differ


# ---------------------------------------------------------------- weights by name
def weight_formats() -> dict[str, WeightFormat]:
    formats = get_registry().tables()["weight_format"]
    wrong = [name for name, fmt in formats.items()
             if not isinstance(fmt, WeightFormat) or fmt.name != name]
    if wrong:
        raise PluginError(f"weight format {wrong[0]!r} must be a vitzoo.weights.WeightFormat "
                          f"whose name is {wrong[0]!r}")
    return formats


def pretrained_tags() -> dict[str, PretrainedTag]:
    """The registered tags, checked: each under its own name, of a registered model and format,
    and at most one default per model."""
    tables, defaults = get_registry().tables(), {}
    for name, tag in tables["pretrained_tag"].items():
        if not isinstance(tag, PretrainedTag) or tag.name != name:
            raise PluginError(f"pretrained tag {name!r} must be a vitzoo.zoo.PretrainedTag named "
                              f"{name!r}, got {tag!r}")
        for kind, value in (("model", tag.model), ("weight_format", tag.format)):
            if value not in tables[kind]:
                raise PluginError(f"pretrained tag {name!r}: no {kind.replace('_', ' ')} {value!r} "
                                  "is registered; install the plugin that provides it")
        if tag.default and defaults.setdefault(tag.model, name) != name:
            raise PluginError(f"model {tag.model!r} has two default tags: {defaults[tag.model]!r} "
                              f"and {name!r}")
    return tables["pretrained_tag"]


def list_pretrained(pattern: str = "*") -> list[str]:
    """Names (MODEL.TAG) of the registered tags, filtered with an fnmatch pattern."""
    return sorted(name for name in pretrained_tags() if fnmatch.fnmatchcase(name, pattern))


def lookup(name: str, pretrained: bool = False) -> tuple[ViTConfig, PretrainedTag | None,
                                                         str | None, dict[str, Any]]:
    """MODEL[.TAG][@REVISION], or timm's name of a paper model (vit_base_patch16_384): the model's
    config, the tag (with `pretrained`, else none named: the model's default), the revision, and
    the options the name implies (a tag's, a timm name's resolution)."""
    models, tags = get_registry().tables()["model"], pretrained_tags()
    text, at, revision = name.partition("@")
    model, _, tag_name = text.partition(".")
    timm, size = re.fullmatch(r"(.+?)(?:_(\d+))?", model or "_").groups()
    implied: dict[str, Any] = {}
    if model not in models and timm in TIMM_ARCHITECTURES:
        model = TIMM_ARCHITECTURES[timm]
        if size and not tag_name and not at and (int(size),) * 2 != models[model].img_size:
            implied["img_size"] = int(size)
    if model not in models:
        near = difflib.get_close_matches(model, [f"{t}_224" for t in TIMM_ARCHITECTURES], 1, 0.75)
        hint = (f" Did you mean {TIMM_ARCHITECTURES[near[0][:-4]]} (timm: {near[0]})?" if near
                else closest(model, models))
        raise ConfigError(f"unknown model name {model!r}.{hint} Available: "
                          f"{', '.join(sorted(models))}")
    if at and not (revision and pretrained):
        raise ConfigError(f"{name!r}: MODEL.TAG@REVISION loads weights at a branch, tag or commit: "
                          "give one, and pass pretrained=True")
    own = sorted(n for n, t in tags.items() if t.model == model)
    named = f"{model}.{tag_name}" if tag_name else next(
        (n for n in own if tags[n].default), own[0] if len(own) == 1 else None)
    if (tag_name or pretrained) and named not in tags:
        with_weights = ", ".join(sorted({t.model for t in tags.values()}))
        raise ConfigError(
            f"unknown pretrained tag {named!r}.{closest(named, own)} Tags of {model}: "
            f"{', '.join(own)}" if tag_name else f"model {model!r} has no default tag: name one "
            f"of {', '.join(own)}" if own else f"model {model!r} has no pretrained weights. "
            f"Models with weights: {with_weights}; or pass pretrained=PATH")
    tag = tags[named] if tag_name or pretrained else None
    return models[model], tag, revision or None, {**(tag.config_options() if tag else {}),
                                                   **implied}
