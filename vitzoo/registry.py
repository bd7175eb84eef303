"""The registry, as timm's: a name becomes a component, a model's config, a tag or a format.

Plugins are pluggy's: the built-ins first, then the entry-point group ``vitzoo`` (none with
VITZOO_DISABLE_PLUGIN_AUTOLOAD=1); one that fails to import is warned about and skipped; a hook
vitzoo does not have and a name two plugins give are PluginErrors."""

from __future__ import annotations

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
from vitzoo.options import closest
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
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                try:  # one at a time: a broken plugin hides no other
                    self.pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=ep.name)
                except Exception as exc:  # noqa: BLE001 - any failure of foreign code
                    self.failed_plugins[ep.name] = f"{type(exc).__name__}: {exc}"
                    warnings.warn(f"vitzoo plugin {ep.name!r} ({ep.value}) failed to load and is "
                                  f"skipped: {self.failed_plugins[ep.name]}", RuntimeWarning,
                                  stacklevel=2)
        self._check_hook_names()

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
        """A hookimpl named like no hook would never be called: a PluginError naming it."""
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            hooks = [c.name for c in self.pm.get_hookcallers(exc.plugin) or [] if not c.has_spec()]
            said = " ".join(f"{h!r} is not a vitzoo hook." + closest(h, KINDS.values())
                            for h in hooks)
            raise PluginError(f"plugin {self.pm.get_name(exc.plugin)!r}: {said} Rename the "
                              f"function to one of {', '.join(sorted(KINDS.values()))}") from exc

    def _collect(self, kind: str) -> dict[str, Any]:
        """Each plugin's names of `kind`, a name two plugins give refused naming both."""
        table, owner = {}, {}
        for impl in getattr(self.pm.hook, KINDS[kind]).get_hookimpls():
            if impl.wrapper or impl.hookwrapper:  # a wrapper provides no names
                continue
            for name, value in impl.function().items():
                if name in owner:
                    raise PluginError(f"{kind} {name!r} is registered twice: by plugin "
                                      f"{owner[name]!r} and by plugin {impl.plugin_name!r}")
                owner[name], table[name] = impl.plugin_name, value
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
        this machine's memory (a meta build allocates nothing)."""
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
                          f"is more than this machine's {memory / 2**30:.3g} GiB of memory")


_REGISTRY: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, built on first use."""
    return _REGISTRY or reset_registry()


def reset_registry(autoload: bool | None = None) -> Registry:
    """The registry built anew (after installing a plugin, or in tests)."""
    global _REGISTRY
    _REGISTRY = Registry(autoload=autoload)
    return _REGISTRY


def resolve_config(base: ViTConfig, *changes: dict[str, Any]) -> ViTConfig:
    """`base` with each dict of `changes` applied in turn (a part's options merged), every part
    known and its options checked and written out with their defaults: two configs of one model
    compare equal however they were written."""
    config, registry, written = base, get_registry(), {}
    for layer in changes:
        config = config.replace(**layer)
    for kind, key in PART_OPTIONS.items():
        declared = getattr(registry.get(kind, getattr(config, kind)), "Options", None)
        if declared is None and getattr(config, key):
            raise ConfigError(f"{kind}={getattr(config, kind)!r} has no options of its own, got "
                              f"{key}={getattr(config, key)!r}; drop them")
        written[key] = declared.from_dict(getattr(config, key)).to_dict() if declared else {}
    resolved = config.replace(**written)
    registry.parts(resolved)
    return resolved


def weight_formats() -> dict[str, WeightFormat]:
    return get_registry().tables()["weight_format"]


def pretrained_tags() -> dict[str, PretrainedTag]:
    return get_registry().tables()["pretrained_tag"]


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
        raise ConfigError(f"unknown model name {model!r}.{closest(model, models)} Available: "
                          f"{', '.join(sorted(models))}")
    if at and not (revision and pretrained):
        raise ConfigError(f"{name!r}: MODEL.TAG@REVISION loads weights at a branch, tag or commit: "
                          "give one, and pass pretrained=True")
    own = sorted(n for n, t in tags.items() if t.model == model)
    named = f"{model}.{tag_name}" if tag_name else next(
        (n for n in own if tags[n].default), own[0] if len(own) == 1 else None)
    if (tag_name or pretrained) and named not in tags:
        raise ConfigError(f"unknown pretrained tag {named!r}.{closest(named, own)} Tags of "
                          f"{model}: {', '.join(own)}" if tag_name else
                          f"model {model!r} has no default pretrained tag: name one of "
                          f"{', '.join(own) or 'its tags (it has none)'}, or pass pretrained=PATH")
    tag = tags[named] if tag_name or pretrained else None
    return models[model], tag, revision or None, {**(tag.config_options() if tag else {}),
                                                   **implied}
