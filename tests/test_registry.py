"""The registry: the built-ins are a plugin like any other; a plugin's component is used by name;
names are unique across plugins; a hook vitzoo does not have is an error, and a refused plugin
leaves the registry as it was."""

import pytest
import torch
from torch import nn

import vitzoo
from vitzoo.errors import ConfigError, PluginError
from vitzoo.registry import Registry, get_registry


class DoubledPatches(nn.Module):
    """A third-party stem: the patch projection at twice the patch size."""

    def __init__(self, config):
        super().__init__()
        size = 2 * config.patch_size
        self.proj = nn.Conv2d(config.in_chans, config.embed_dim, size, stride=size)
        self.stride = (size, size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


def plugin(hook: str, provided):
    return type("Plugin", (), {hook: vitzoo.hookimpl(lambda self: provided)})()


@pytest.fixture
def registered():
    names = []
    yield lambda obj, name: names.append(get_registry().register(obj, name=name))
    for name in names:
        get_registry().unregister(name)


def test_components_by_kind_and_models_by_pattern():
    components = vitzoo.list_components()
    assert set(components) == {"stem", "pos_embed", "pool", "head"}
    assert {"patch", "resnet"} <= set(components["stem"]) and {"token", "gap"} <= set(
        components["pool"])
    assert {"none", "learned_1d", "learned_2d", "relative"} <= set(components["pos_embed"])
    assert vitzoo.list_models("nothing*") == []
    assert get_registry().pm.get_plugin("vitzoo.builtins") is not None


def test_a_plugin_component_is_used_by_name_until_unregistered(tiny):
    get_registry().register(plugin("vitzoo_stems", {"doubled": DoubledPatches}), name="stems")
    try:
        model = vitzoo.create("vit_ti16", **tiny, stem="doubled")
        assert model.grid == (2, 2) and model(torch.randn(1, 3, 32, 32)).shape == (1, 5)
    finally:
        get_registry().unregister("stems")
    with pytest.raises(ConfigError, match="unknown stem 'doubled'"):
        vitzoo.create("vit_ti16", stem="doubled")


def test_two_plugins_with_one_name_is_an_error_naming_both(registered):
    registered(plugin("vitzoo_pools", {"gap": DoubledPatches}), "clashing-plugin")
    with pytest.raises(PluginError, match="pool 'gap' is registered twice: by plugin "
                                          "'vitzoo.builtins' and by plugin 'clashing-plugin'"):
        vitzoo.list_components()


def test_a_misspelled_hook_is_refused_naming_the_hook_it_meant():
    registry, before = get_registry(), vitzoo.list_components()
    with pytest.raises(PluginError) as err:
        registry.register(plugin("vitzoo_stem", {"doubled": DoubledPatches}), name="misspelled")
    assert ("plugin 'misspelled': 'vitzoo_stem' is not a vitzoo hook. Did you mean "
            "'vitzoo_stems'? Rename the function to one of vitzoo_heads, vitzoo_models, "
            "vitzoo_pools, vitzoo_pos_embeds, vitzoo_pretrained_tags, vitzoo_stems, "
            "vitzoo_weight_formats") in str(err.value)
    assert registry.pm.get_plugin("misspelled") is None and vitzoo.list_components() == before


def test_an_optional_hook_vitzoo_does_not_have_is_allowed():
    """pluggy's way to implement a hook of another vitzoo version: optionalhook=True."""
    class Optional:
        @vitzoo.hookimpl(optionalhook=True)
        def vitzoo_future_hook(self):
            return {}

    fresh = Registry(autoload=False)
    fresh.register(Optional(), name="optional-plugin")
    assert "patch" in fresh.names("stem")
