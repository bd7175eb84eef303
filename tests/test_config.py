"""ViTConfig: the single source of truth for a model, validated when it is made."""

import json

import pytest

import vitzoo
from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError
from vitzoo.train import TrainConfig


def test_to_dict_round_trips_through_json():
    config = vitzoo.get_config("vit_b16_hybrid", img_size=(384, 256), pool="gap")
    again = ViTConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    assert again.img_size == (384, 256) and again.stem_options["layers"] == [3, 4, 9]


def test_model_config_is_the_dataclass():
    model = vitzoo.create("vit_ti16", img_size=32, patch_size=4, num_classes=10)
    assert isinstance(model.config, ViTConfig)
    assert model.config.num_classes == 10 and model.config.img_size == (32, 32)


def test_misspelled_option_names_the_closest_and_the_valid_ones():
    with pytest.raises(ConfigError) as err:
        vitzoo.create("vit_ti16", pos_embd="learned_2d")
    message = str(err.value)
    assert "pos_embd" in message and "Did you mean 'pos_embed'" in message and "num_heads" in message


def test_unknown_component_name_suggests_the_closest():
    with pytest.raises(ConfigError, match="Did you mean 'learned_2d'"):
        vitzoo.create("vit_ti16", pos_embed="learned2d")


def test_unknown_model_name_suggests_the_closest():
    with pytest.raises(ConfigError, match="Did you mean 'vit_b16'"):
        vitzoo.create("vit_b61")




def test_a_uniform_normalisation_applies_to_any_number_of_channels():
    """The named models normalise every channel alike (0.5, 0.5): `in_chans=1` needs nothing else.
    """
    assert vitzoo.get_config("vit_ti16", in_chans=1).mean == (0.5,)
    assert vitzoo.get_config("vit_ti16", in_chans=4, std=0.25).std == (0.25,) * 4


def test_image_size_not_divisible_by_the_stride_names_both():
    with pytest.raises(ConfigError,
                       match=r"img_size=\(225, 224\) is not divisible by the stem's stride \(16, 16\)"):
        vitzoo.create("vit_ti16", img_size=(225, 224))
    with pytest.raises(ConfigError, match=r"stride \(16, 16\)"):
        vitzoo.create("vit_b16_hybrid", img_size=200, device="meta")  # R50 (3,4,9): total stride 16


def test_the_config_accepts_exactly_the_activations_and_numerics_the_layers_build():
    """One table per concept: the plain-data config holds the names, the layers what each name
    means; the transformers converter maps only onto names of that table."""
    from vitzoo import config
    from vitzoo.layers.activations import ACTIVATIONS
    from vitzoo.layers.resnet import NUMERICS
    from vitzoo.weights.transformers import HIDDEN_ACT

    assert tuple(ACTIVATIONS) == config.ACTIVATIONS
    assert set(HIDDEN_ACT.values()) <= set(ACTIVATIONS)
    for act in ACTIVATIONS:
        assert ViTConfig(act=act).act == act
    with pytest.raises(ConfigError, match="'gelu', 'gelu_tanh'"):
        ViTConfig(act="relu")
    assert config.HYBRID_NUMERICS["stem_options"]["numerics"] in NUMERICS
    for numerics in NUMERICS:
        options = {"numerics": numerics}
        assert vitzoo.get_config("vit_b16_hybrid",
                                 stem_options=options).stem_options["numerics"] == numerics
    with pytest.raises(ConfigError, match="numerics='tim' is not one of .*Did you mean 'timm'"):
        vitzoo.get_config("vit_b16_hybrid", stem_options={"numerics": "tim"})


def test_both_configs_round_trip_through_json_text():
    model = vitzoo.get_config("vit_ti16", img_size=(32, 48))
    train = TrainConfig(model="vit_ti16", model_options={"img_size": 32}, betas=(0.9, 0.95),
                        fewshot=(1, 5), steps=3)
    for config in (model, train):
        text = config.to_json()
        assert text.endswith("}\n") and json.loads(text) == config.to_dict()
        assert type(config).from_json(text) == config


@pytest.mark.parametrize("config, kind, typo, meant",
                         [(ViTConfig, "model", "embed_dims", "embed_dim"),
                                                        (TrainConfig, "training", "lrr", "lr")])
def test_an_unknown_option_of_either_config_is_one_config_error_naming_the_closest(
        config, kind, typo, meant):
    with pytest.raises(ConfigError,
                       match=rf"unknown {kind} option '{typo}'. Did you mean '{meant}'"):
        config.from_dict({typo: 1})


