"""The component registry: a pluggy PluginManager and name -> component lookup.

The built-ins (`vitzoo/builtins.py`) are one plugin like any other, registered first; they know
only the hookspecs, as a third-party plugin does. Third-party plugins come from the entry-point
group ``vitzoo`` (``VITZOO_DISABLE_PLUGIN_AUTOLOAD=1`` loads none). A plugin that fails to import
is reported in a warning and skipped; one that implements a hook vitzoo does not have (a
misspelling such as ``vitzoo_stem``) is a `PluginError` when loaded, as pluggy would never call it.

Hooks are called one plugin at a time, so that every component name is known to come from one
plugin: duplicates and broken return values are reported naming it.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import warnings
from typing import Any

import pluggy

from vitzoo import builtins, hookspecs
from vitzoo.config import PART_OPTIONS, ViTConfig
from vitzoo.envvars import env_flag
from vitzoo.errors import ConfigError, PluginError
from vitzoo.options import Options, closest

PROJECT = "vitzoo"
ENTRY_POINT_GROUP = "vitzoo"
DISABLE_AUTOLOAD_ENV = "VITZOO_DISABLE_PLUGIN_AUTOLOAD"

# kind of component -> the hook that provides it
KINDS = {
    "stem": "vitzoo_stems",
    "pos_embed": "vitzoo_pos_embeds",
    "pool": "vitzoo_pools",
    "head": "vitzoo_heads",
    "model": "vitzoo_models",
    "weight_format": "vitzoo_weight_formats",
    "pretrained_tag": "vitzoo_pretrained_tags",
}
# the parts a model is built from (models, weight formats and pretrained tags are not parts)
COMPONENT_KINDS = tuple(k for k in KINDS if k not in ("model", "weight_format", "pretrained_tag"))


class Registry:
    def __init__(self, autoload: bool | None = None) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.failed_plugins: dict[str, str] = {}  # entry-point name -> error message
        self._tables: dict[str, dict[str, Any]] | None = None
        self.pm.register(builtins, name="vitzoo.builtins")
        if autoload is None:
            autoload = not env_flag(DISABLE_AUTOLOAD_ENV)  # "0" had disabled them too
        if autoload:
            self._load_entry_points()
        self._check_hook_names()

    def _load_entry_points(self) -> None:
        # One entry point at a time, so that one broken plugin cannot hide the others.
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                self.pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=ep.name)
            except Exception as exc:  # noqa: BLE001 - any import-time failure of foreign code
                message = f"{type(exc).__name__}: {exc}"
                self.failed_plugins[ep.name] = message
                warnings.warn(
                    f"vitzoo plugin {ep.name!r} ({ep.value}) failed to load and is skipped: "
                    f"{message}",
                    RuntimeWarning,
                    stacklevel=2,
                )

    # ---------------------------------------------------------------- plugins
    def register(self, plugin: object, name: str | None = None) -> str:
        """Register a plugin object (module or instance with hookimpls); returns its name."""
        registered = self.pm.register(plugin, name=name)
        try:
            self._check_hook_names()
        except PluginError:
            self.pm.unregister(name=registered)  # leave the registry as it was
            raise
        self._tables = None
        return registered

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self._tables = None

    def _check_hook_names(self) -> None:
        """pluggy's `check_pending`, as a `PluginError` naming the plugin and the hook it meant.

        pluggy registers an implementation whose name matches no hookspec without complaint and
        never calls it, so a misspelled hook would make a plugin silently do nothing."""
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            plugin_name = self.pm.get_name(exc.plugin)
            unknown = sorted(
                caller.name
                for caller in self.pm.get_hookcallers(exc.plugin) or []
                if not caller.has_spec()
                and any(impl.plugin is exc.plugin and not impl.optionalhook
                        for impl in caller.get_hookimpls())
            )
            problems = "; ".join(f"{hook!r} is not a vitzoo hook." + closest(hook, KINDS.values())
                                 for hook in unknown)
            raise PluginError(
                f"plugin {plugin_name!r} implements a hook that vitzoo does not have, so it would "
                f"never be called: {problems} Rename the function to one of "
                f"{', '.join(sorted(KINDS.values()))} (vitzoo/hookspecs.py), or uninstall the "
                "plugin"
            ) from exc

    # ---------------------------------------------------------------- lookup
    def _collect(self, kind: str) -> dict[str, Any]:
        hook_name = KINDS[kind]
        # The plugins implementing the hook, in pluggy's order; wrappers (hookwrapper /
        # wrapper=True) provide nothing themselves, they wrap the call of each plugin below.
        providers: dict[object, str] = {}
        for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
            if not (impl.wrapper or impl.hookwrapper):
                providers.setdefault(impl.plugin, impl.plugin_name)
        table: dict[str, Any] = {}
        owner: dict[str, str] = {}
        for plugin, plugin_name in providers.items():
            # pm.hook.<hook_name> restricted to this plugin: its results are known to be its own
            others = [other for other in providers if other is not plugin]
            for provided in self.pm.subset_hook_caller(hook_name, remove_plugins=others)():
                if not isinstance(provided, dict):
                    raise PluginError(f"plugin {plugin_name!r}: {hook_name}() must return a dict, "
                                      f"got {type(provided).__name__}")
                for name, component in provided.items():
                    if name in owner:
                        raise PluginError(
                            f"{kind} {name!r} is registered twice: by plugin {owner[name]!r} and "
                            f"by plugin {plugin_name!r}; uninstall or rename one of them"
                        )
                    owner[name] = plugin_name
                    table[name] = component
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
            option = "model name" if kind == "model" else f"{kind}"
            raise ConfigError(
                f"unknown {option} {name!r}." + closest(name, table)
                + f" Available: {', '.join(sorted(table))}"
            )
        return table[name]


_REGISTRY: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, built on first use."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = Registry()
    return _REGISTRY


def reset_registry(autoload: bool | None = None) -> Registry:
    """Rebuild the registry (after installing a plugin, or in tests)."""
    global _REGISTRY
    _REGISTRY = Registry(autoload=autoload)
    return _REGISTRY


# ------------------------------------------------------------------------- a config, resolved
def options_class(component: Any, kind: str, name: str) -> type[Options] | None:
    """The dataclass of a component's own options (its ``Options`` attribute), or None."""
    declared = getattr(component, "Options", None)
    if declared is not None and not (isinstance(declared, type) and issubclass(declared, Options)):
        raise PluginError(f"{kind} {name!r}: its Options must be a dataclass deriving "
                          f"vitzoo.options.Options, got {declared!r}")
    return declared


def part_options(config: ViTConfig, kind: str, registry: Registry | None = None) -> Options | None:
    """A part's options, typed and checked by its component's ``Options`` (defaults filled in); None
    for a component that has none (then the config must give none)."""
    name = getattr(config, kind)
    component = (registry or get_registry()).get(kind, name)
    given = config.part_options(kind)
    declared = options_class(component, kind, name)
    if declared is None:
        if given:
            raise ConfigError(f"{kind}={name!r} has no options of its own, got "
                              f"{PART_OPTIONS[kind]}={given!r}; drop them (or choose a {kind} that "
                              "has them)")
        return None
    return declared.from_dict(given)


def resolve_config(config: ViTConfig) -> ViTConfig:
    """The config with every part known and its options complete: each part's options checked by its
    component and written out with their defaults, then each component's ``check`` of the config.

    A model holds its config resolved, so that two configs of one model compare equal however they
    were written (saved with every option, or given with a few)."""
    registry = get_registry()
    changes = {}
    for kind, key in PART_OPTIONS.items():
        options = part_options(config, kind, registry)
        changes[key] = options.to_dict() if options is not None else {}
    # replaced whole (ViTConfig.replace would merge them into the options given)
    same = all(changes[k] == getattr(config, k) for k in changes)
    resolved = config if same else dataclasses.replace(config, **changes)
    pos_embed = registry.get("pos_embed", resolved.pos_embed)
    modes = tuple(getattr(pos_embed, "modes", ()))
    if resolved.pos_embed_mode not in modes:  # the position embedding's modes (Table 8: n/a)
        raise ConfigError(f"pos_embed={resolved.pos_embed!r} with "
                          f"pos_embed_mode={resolved.pos_embed_mode!r} is undefined (the paper's "
                          f"Table 8 marks it n/a); {resolved.pos_embed!r} supports pos_embed_mode "
                          f"in {modes}." + closest(str(resolved.pos_embed_mode), modes))
    for kind in COMPONENT_KINDS:
        component = registry.get(kind, getattr(resolved, kind))
        if hasattr(component, "check"):
            component.check(resolved)
    return resolved


# the shared options that make a model another architecture; the parts' own options that do are
# their Options' SHAPE
SHAPE_OPTIONS = ("stem", "embed_dim", "depth", "num_heads", "mlp_dim")


def shape_differences(saved: ViTConfig, requested: ViTConfig) -> list[str]:
    """How the model a saved config describes differs in shape from the one requested, as
    'option=saved (not requested)' items; [] when they are the same architecture."""
    differ = [f"{k}={getattr(saved, k)!r} (not {getattr(requested, k)!r})" for k in SHAPE_OPTIONS
              if getattr(saved, k) != getattr(requested, k)]
    if differ:
        return differ
    for kind, key in PART_OPTIONS.items():
        a, b = part_options(saved, kind), part_options(requested, kind)
        if a is None or b is None:
            continue
        fields = a.SHAPE if a.SHAPE is not None else a.field_names()
        differ += [f"{key}[{f!r}]={getattr(a, f)!r} (not {getattr(b, f)!r})" for f in fields
                   if getattr(a, f) != getattr(b, f)]
    return differ
