"""The registry: built-ins are a plugin like any other; names are unique across plugins; hooks are
called through pluggy, one plugin at a time; a hook name vitzoo does not have is an error."""

import pytest
import torch
from torch import nn

import vitzoo
from vitzoo.errors import ConfigError, PluginError
from vitzoo.registry import Registry, get_registry


class DoubledPatches(nn.Module):
    """A third-party stem for the tests: patch projection of the image at twice the patch size."""

    def __init__(self, config):
        super().__init__()
        size = 2 * config.patch_size
        self.proj = nn.Conv2d(config.in_chans, config.embed_dim, size, stride=size)
        self.stride = (size, size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class StemPlugin:
    @vitzoo.hookimpl
    def vitzoo_stems(self):
        return {"doubled": DoubledPatches}


class ClashingPlugin:
    @vitzoo.hookimpl
    def vitzoo_pools(self):
        return {"gap": DoubledPatches}


class MisspelledPlugin:
    @vitzoo.hookimpl
    def vitzoo_stem(self):  # the hook is vitzoo_stems
        return {"doubled": DoubledPatches}


class ListPlugin:
    @vitzoo.hookimpl
    def vitzoo_heads(self):
        return ["not", "a", "dict"]


@pytest.fixture
def registered():
    names = []

    def register(plugin, name):
        names.append(get_registry().register(plugin, name=name))

    yield register
    for name in names:
        get_registry().unregister(name)


def test_list_components_by_kind():
    components = vitzoo.list_components()
    assert set(components) == {"stem", "pos_embed", "pool", "head"}
    assert {"patch", "resnet"} <= set(components["stem"])
    assert {"none", "learned_1d", "learned_2d", "relative"} <= set(components["pos_embed"])
    assert {"token", "gap"} <= set(components["pool"]) and {"linear",
                                                            "mlp"} <= set(components["head"])
def test_list_models_filters_with_fnmatch():
    assert vitzoo.list_models("vit_l*") == ["vit_l16", "vit_l16_hybrid",
                                            "vit_l32", "vit_l32_hybrid"]
    assert vitzoo.list_models("nothing*") == []


def test_builtins_are_registered_as_a_plugin():
    assert get_registry().pm.get_plugin("vitzoo.builtins") is not None


def test_a_registered_plugin_component_is_used_by_name(registered, tiny):
    registered(StemPlugin(), "test-stem-plugin")
    assert "doubled" in vitzoo.list_components()["stem"]
    model = vitzoo.create("vit_ti16", **tiny, stem="doubled")
    assert model.grid == (2, 2)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 5)


def test_two_plugins_with_one_name_is_an_error_naming_both(registered):
    registered(ClashingPlugin(), "clashing-plugin")
    with pytest.raises(PluginError) as err:
        vitzoo.list_components()
    assert "'gap'" in str(err.value) and "vitzoo.builtins" in str(err.value) and "clashing-plugin" in str(err.value)


def test_unregistering_restores_the_registry(registered):
    registry = get_registry()
    registry.register(StemPlugin(), name="temporary")
    registry.unregister("temporary")
    with pytest.raises(ConfigError, match="unknown stem 'doubled'"):
        vitzoo.create("vit_ti16", stem="doubled")


def test_hooks_are_called_through_pluggy_one_plugin_at_a_time():
    """Through pm.hook, so that pluggy's call monitoring (tracing) sees every call; one plugin per
    call, so that each name's plugin is known."""
    fresh = Registry(autoload=False)
    calls = []
    fresh.pm.add_hookcall_monitoring(
        lambda hook, impls, kwargs: calls.append((hook, [impl.plugin_name for impl in impls])),
        lambda outcome, hook, impls, kwargs: None,
    )
    fresh.register(StemPlugin(), name="test-stem-plugin")
    assert fresh.names("stem") == ["doubled", "patch", "resnet"]
    stem_calls = [plugins for hook, plugins in calls if hook == "vitzoo_stems"]
    assert stem_calls == [["vitzoo.builtins"], ["test-stem-plugin"]]
    assert {hook for hook, _ in calls} == set(vitzoo.registry.KINDS.values())


def test_a_hook_that_returns_no_dict_is_an_error_naming_the_plugin():
    fresh = Registry(autoload=False)
    fresh.register(ListPlugin(), name="list-plugin")
    with pytest.raises(PluginError,
                       match=r"plugin 'list-plugin': vitzoo_heads\(\) must return a dict, got list"):
        fresh.names("head")


def test_a_misspelled_hook_is_an_error_naming_the_plugin_and_the_hook_it_meant():
    registry = get_registry()
    before = vitzoo.list_components()
    with pytest.raises(PluginError) as err:
        registry.register(MisspelledPlugin(), name="misspelled-plugin")
    message = str(err.value)
    assert "plugin 'misspelled-plugin'" in message
    assert "'vitzoo_stem' is not a vitzoo hook. Did you mean 'vitzoo_stems'?" in message
    assert ("Rename the function to one of vitzoo_heads, vitzoo_models, vitzoo_pools, "
            "vitzoo_pos_embeds, "
            "vitzoo_pretrained_tags, vitzoo_stems, vitzoo_weight_formats") in message
    # refused, not half-registered: the registry is as it was, and a correct plugin still registers
    assert registry.pm.get_plugin("misspelled-plugin") is None
    assert vitzoo.list_components() == before
    registry.register(StemPlugin(), name="test-stem-plugin")
    try:
        assert "doubled" in vitzoo.list_components()["stem"]
    finally:
        registry.unregister("test-stem-plugin")


def test_an_optional_hook_vitzoo_does_not_have_is_allowed():
    """pluggy's way to implement a hook of another vitzoo version: optionalhook=True."""

    class Optional:
        @vitzoo.hookimpl(optionalhook=True)
        def vitzoo_future_hook(self):
            return {}

    fresh = Registry(autoload=False)
    fresh.register(Optional(), name="optional-plugin")
    assert fresh.pm.get_plugin("optional-plugin") is not None and "patch" in fresh.names("stem")
