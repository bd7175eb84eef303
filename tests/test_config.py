"""ViTConfig, the single source of truth of a model, and the one validator every options dataclass
shares: types from the annotations, ranges and choices from the fields' metadata."""

import json
from dataclasses import dataclass

import pytest

import vitzoo
from vitzoo import config
from vitzoo.config import ViTConfig
from vitzoo.errors import ConfigError
from vitzoo.options import Options, option
from vitzoo.train import TrainConfig


def test_both_configs_round_trip_through_json():
    model = vitzoo.get_config("vit_b16_hybrid", img_size=(384, 256), pool="gap")
    train = TrainConfig(model="vit_ti16", model_options={"img_size": 32}, betas=(0.9, 0.95),
                        fewshot=(1, 5), steps=3)
    for cfg in (model, train):
        text = cfg.to_json()
        assert text.endswith("}\n") and json.loads(text) == cfg.to_dict()
        assert type(cfg).from_json(text) == type(cfg).from_dict(json.loads(text)) == cfg
    assert model.img_size == (384, 256) and model.stem_options["layers"] == [3, 4, 9]
    built = vitzoo.create("vit_ti16", img_size=32, patch_size=4, num_classes=10)
    assert isinstance(built.config, ViTConfig) and built.config.img_size == (32, 32)


@pytest.mark.parametrize("call, message", [
    (lambda: vitzoo.create("vit_ti16", pos_embd="learned_2d"),
     "unknown model option 'pos_embd'. Did you mean 'pos_embed'?.*num_heads"),
    (lambda: TrainConfig.from_dict({"lrr": 1}), "unknown training option 'lrr'. Did you mean 'lr'"),
    (lambda: vitzoo.create("vit_ti16", pos_embed="learned2d"), "Did you mean 'learned_2d'"),
    (lambda: vitzoo.create("vit_b61"), "Did you mean 'vit_b16'"),
    (lambda: vitzoo.create("vit_ti16", img_size=(225, 224)),
     r"img_size=\(225, 224\) is not divisible by the stem's stride \(16, 16\)"),
    (lambda: vitzoo.create("vit_b16_hybrid", img_size=200, device="meta"), r"stride \(16, 16\)"),
    (lambda: ViTConfig(act="relu"), "act='relu' is not one of gelu, gelu_tanh"),
    (lambda: vitzoo.get_config("vit_b16_hybrid", stem_options={"numerics": "tim"}),
     "numerics='tim' is not one of official, timm. Did you mean 'timm'"),
])
def test_a_wrong_name_or_value_is_a_config_error_naming_the_closest(call, message):
    with pytest.raises(ConfigError, match=message):
        call()


def test_a_uniform_normalisation_applies_to_any_number_of_channels():
    assert vitzoo.get_config("vit_ti16", in_chans=1).mean == (0.5,)
    assert vitzoo.get_config("vit_ti16", in_chans=4, std=0.25).std == (0.25,) * 4


def test_the_activations_and_resnet_numerics_other_formats_name_are_the_configs():
    from vitzoo.layers.resnet import NUMERICS
    from vitzoo.weights.transformers import HIDDEN_ACT

    assert set(HIDDEN_ACT.values()) <= set(config.ACTIVATIONS)
    assert config.HYBRID_NUMERICS["stem_options"]["numerics"] in NUMERICS
    for numerics in NUMERICS:
        options = {"numerics": numerics}
        assert vitzoo.get_config("vit_b16_hybrid", stem_options=options).stem_options == {
            "layers": [3, 4, 9], "width": 1, "numerics": numerics}


@dataclass
class PartOptions(Options):
    KIND = "stem 'demo'"

    depth: int = option(1, range=">= 0")
    share: float = option(0.5, range="in (0, 1]")
    sizes: tuple[int, ...] = option((1, 2), range="> 0")
    mode: str | None = option(None, choices=("a", "b"))


@pytest.mark.parametrize("given, message", [
    ({"depth": -1}, "depth must be >= 0, got -1"),
    ({"depth": True}, "depth must be an int, got True"),
    ({"share": 0.0}, r"share must be in \(0, 1\], got 0.0"),
    ({"share": float("nan")}, "share must be a finite number"),
    ({"sizes": (1, 0)}, "sizes must be > 0, got 0"),
    ({"sizes": 3}, "sizes must be a tuple of ints, got 3"),
    ({"mode": "c"}, "mode='c' is not one of a, b"),
    ({"mode": 1}, "mode must be a str or None, got 1"),
])
def test_the_one_validator_checks_any_options_by_their_fields_metadata(given, message):
    assert PartOptions(mode="a").replace(depth=0).to_dict() == {
        "depth": 0, "share": 0.5, "sizes": [1, 2], "mode": "a"}
    with pytest.raises(ConfigError, match=message):
        PartOptions(**given)
    with pytest.raises(ConfigError, match="unknown stem 'demo' option 'dpth'. Did you mean"):
        PartOptions.from_dict({"dpth": 1})
