"""Every value of a model or training config, from code, a flag or a file, is checked by name when
the config is made: its type and range, in one ConfigError that names the option and the value.
A truthy text where a bool belongs is refused, not acted on; a tensor is named, never printed."""

from __future__ import annotations

import json

import pytest
import torch

import vitzoo
from vitzoo.errors import ConfigError
from vitzoo.train import TrainConfig


MODEL_VALUES = [
    ({"embed_dim": 100, "num_heads": 3}, "not divisible by num_heads"),
    ({"img_size": 0}, "img_size must be > 0"),
    ({"img_size": (32, 32, 3)}, "img_size must be an int or a (height, width) pair"),
    ({"act": "relu"}, "act='relu' is not one of"),
    ({"act": None}, "act must be a str"),
    ({"head": None}, "head must be a str"),
    ({"fc_norm": "no"}, "fc_norm must be True or False"),
    ({"in_chans": None}, "in_chans must be an int"),
    ({"dropout": 1.5}, "dropout must be in [0, 1)"),
    ({"dropout": "0.1"}, "dropout must be a number, got '0.1'"),
    ({"dropout": float("inf")}, "dropout must be a finite number"),
    ({"num_classes": -1}, "num_classes must be >= 0"),
    ({"num_classes": True}, "num_classes must be an int, got True"),
    ({"pos_embed_mode": "every_layers"}, "Did you mean 'every_layer'"),
    ({"depth": -1}, "depth must be >= 0"),
    ({"num_heads": 0}, "num_heads must be > 0"),
    ({"embed_dim": 64.0}, "embed_dim must be an int"),
    ({"norm_eps": float("nan")}, "norm_eps must be a finite number"),
    ({"mean": (0.4, 0.5)}, "one value per input channel"),
    ({"in_chans": 1, "mean": (0.485, 0.456, 0.406)}, "one value per input channel"),
    ({"mean": float("nan")}, "mean must be a finite number"),
    ({"std": "wide"}, "std must be a number or a sequence of numbers"),
    ({"std": 0}, "std must be > 0"),
    ({"std": (0.5, -0.5, 0.5)}, "std must be > 0"),
    ({"head": "mlp", "head_options": {"representation_size": "64"}},
     "representation_size must be an int, got '64'"),
    ({"head": "mlp", "head_options": {"representation_size": 0}},
     "representation_size must be > 0"),
    ({"stem": "resnet", "stem_options": {"layers": (True,)}},
     "layers must be an int, got True"),
]


@pytest.mark.parametrize("options, fragment", MODEL_VALUES)
def test_a_model_option_of_the_wrong_type_or_range_is_one_config_error(options, fragment):
    """A bool or text where a number belongs, None for a name, NaN, infinite, zero or negative where
    it cannot be: a ConfigError naming the option, raised when the config is made."""
    with pytest.raises(ConfigError) as err:
        vitzoo.get_config("vit_ti16", **options)
    assert fragment in str(err.value)


def test_a_model_option_given_a_tensor_is_refused_without_printing_it():
    with pytest.raises(ConfigError,
                       match=r"embed_dim must be an int, got a Tensor of shape \(100,\)") as err:
        vitzoo.create("vit_ti16", embed_dim=torch.full((100,), 0.123456))
    assert "0.1235" not in str(err.value)


@pytest.mark.parametrize("changes, fragment", [
    ({"hflip": "no"}, "hflip must be True or False, got 'no'"),
    ({"compile": 1}, "compile must be True or False, got 1"),
    ({"model": None}, "model must be a str"),
    ({"model_options": [("depth", 2)]}, "model_options must be a dict"),
    ({"out": 5}, "out must be a str or None, got 5"),
    ({"log_every": 0}, "log_every must be > 0"),
    ({"eval_every": -1}, "eval_every must be >= 0"),
    ({"warmup": float("nan")}, "warmup must be a finite number"),
    ({"lr": "0.1"}, "lr must be a number, got '0.1'"),
    ({"steps": True}, "steps must be an int, got True"),
    ({"batch_size": 16.0}, "batch_size must be an int"),
    ({"label_smoothing": 1.0}, r"label_smoothing must be in \[0, 1\)"),
    ({"fewshot": (5, 0)}, "fewshot must be > 0, got 0"),
    ({"betas": (0.9, float("nan"))}, "betas must be a finite number"),
    ({"classes": (1, 1)}, "name each class once"),
    ({"recipe": "paper"}, "recipe='paper' is not one of paper-pretrain, paper-finetune, small"),
    ({"optimizer": "adam"}, "optimizer='adam' is not one of adamw, sgd"),
    ({"steps": 3, "epochs": 1.0}, "give one of epochs, steps, time_budget_min, not epochs, steps"),
    ({"resume": True}, "resume needs the run directory"),
    *[({option: value}, rf"{option}=.* is (empty|blank): name a path")
      for option in ("out", "data", "data_dir", "pretrained") for value in ("", " \t")],
])
def test_a_training_option_of_the_wrong_type_range_or_choice_is_one_config_error(changes, fragment):
    """Checked when the TrainConfig is made, from code or from a saved file, before any data
    loads: a truthy text or number where a bool belongs is refused, not acted on; a path option
    is a path or None, never ""."""
    with pytest.raises(ConfigError, match=fragment):
        TrainConfig(**changes)
    with pytest.raises(ConfigError, match=fragment):
        TrainConfig.from_json(json.dumps(TrainConfig().to_dict() | changes))


def test_a_train_config_json_edited_wrong_is_refused_on_resume(tmp_path, capsys):
    from vitzoo.cli import main

    run = tmp_path / "run"
    run.mkdir()
    document = TrainConfig(model="vit_ti16", data="synthetic", out=str(run)).to_dict()
    (run / "train_config.json").write_text(json.dumps({**document, "quiet": "false"}))
    assert main(["train", "--resume", str(run)]) == 2
    assert "quiet must be True or False, got 'false'" in capsys.readouterr().err
    (run / "train_config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must be a JSON object"):
        TrainConfig.from_json((run / "train_config.json").read_text())
    assert issubclass(ConfigError, ValueError) and vitzoo.ConfigError is ConfigError
