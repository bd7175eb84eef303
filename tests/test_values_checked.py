"""Every value read from a file, a flag or an API call is checked as config values are: its type and
range, by name, in one ConfigError (issue 23). A wrong type never reaches a traceback, nor is it acted
on (a "no" that is truthy), and options a saved config leaves out are not taken from defaults silently."""

from __future__ import annotations

import json

import pytest
from hub_testing import tiny  # tests/hub_testing.py

import vitzoo
from vitzoo.errors import ConfigError
from vitzoo.train import TrainConfig


@pytest.mark.parametrize("option, value, fragment", [
    ("act", None, "act must be a str, got None"),
    ("stem", 5, "stem must be a str, got 5"),
    ("pool", [], "pool must be a str"),
    ("fc_norm", "yes", "fc_norm must be True or False, got 'yes'"),
    ("dynamic_img_size", 1, "dynamic_img_size must be True or False, got 1"),
    ("in_chans", None, "in_chans must be an int, got None"),
    ("pos_embed_mode", None, "pos_embed_mode must be a str"),
])
def test_a_saved_config_with_a_value_of_the_wrong_type_names_the_file_and_the_option(tmp_path, option, value, fragment):
    """A config.json whose model options hold a value of the wrong type (null for a name, a text for a
    bool, ...) is a ConfigError naming the file, the option and the value, never a TypeError."""
    tiny().save_pretrained(tmp_path / "saved")
    path = tmp_path / "saved" / "config.json"
    document = json.loads(path.read_text())
    document["model"][option] = value
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match="config.json") as err:
        vitzoo.from_pretrained(tmp_path / "saved")
    assert fragment in str(err.value)


@pytest.mark.parametrize("options, fragment", [
    (dict(act=None), "act must be a str"),
    (dict(fc_norm="no"), "fc_norm must be True or False"),
    (dict(head=None), "head must be a str"),
    (dict(in_chans=None), "in_chans must be an int"),
])
def test_a_model_option_of_the_wrong_type_is_one_config_error(options, fragment):
    with pytest.raises(ConfigError, match=fragment):
        vitzoo.create("vit_ti16", **options)


@pytest.mark.parametrize("call, fragment", [
    (lambda: vitzoo.create("vit_ti16", pretrained=1), "pretrained must be True .* got 1 \\(int\\)"),
    (lambda: vitzoo.create("vit_ti16", pretrained=0), "pretrained must be .* got 0 \\(int\\)"),
    (lambda: vitzoo.create("vit_ti16", pretrained=[1]), "pretrained must be .* got \\[1\\] \\(list\\)"),
    (lambda: vitzoo.create("vit_ti16", strict="no"), "strict must be True or False, got 'no'"),
    (lambda: vitzoo.create(None), "name must be a model or tag name"),
    (lambda: vitzoo.from_pretrained(5), "source must be a path, 'hf-hub:ORG/NAME', a state dict or a model holding one, got 5 \\(int\\)"),
])
def test_the_arguments_of_create_and_from_pretrained_are_checked_as_options_are(call, fragment):
    with pytest.raises(ConfigError, match=fragment):
        call()


@pytest.mark.parametrize("changes, fragment", [
    (dict(hflip="no"), "hflip must be True or False, got 'no'"),
    (dict(quiet="false"), "quiet must be True or False"),
    (dict(compile=1), "compile must be True or False, got 1"),
    (dict(model=None), "model must be a str"),
    (dict(model_options=[("depth", 2)]), "model_options must be a dict"),
    (dict(out=5), "out must be a str or None, got 5"),
])
def test_a_training_option_of_the_wrong_type_is_one_config_error(changes, fragment):
    """A truthy text or number where a bool belongs is refused, not acted on."""
    with pytest.raises(ConfigError, match=fragment):
        TrainConfig(**changes)


def test_a_train_config_json_with_a_wrong_type_is_refused_on_resume(tmp_path, capsys):
    """A run's train_config.json edited to hold "quiet": "false" is refused when the run resumes, naming
    the option; one that is not a JSON object says so."""
    from vitzoo.cli import main

    run = tmp_path / "run"
    run.mkdir()
    document = TrainConfig(model="vit_ti16", data="synthetic", out=str(run)).to_dict()
    document["quiet"] = "false"
    (run / "train_config.json").write_text(json.dumps(document))
    assert main(["train", "--resume", str(run)]) == 2
    assert "quiet must be True or False, got 'false'" in capsys.readouterr().err
    (run / "train_config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must be a JSON object"):
        TrainConfig.from_json((run / "train_config.json").read_text())


def test_a_saved_config_missing_options_says_which_defaults_it_takes(tmp_path):
    """A config.json that leaves model options out (save_pretrained writes them all) loads with their
    defaults, and a warning names each and the default taken."""
    tiny(act="gelu").save_pretrained(tmp_path / "saved")
    path = tmp_path / "saved" / "config.json"
    document = json.loads(path.read_text())
    del document["model"]["norm_eps"], document["model"]["pool"]
    path.write_text(json.dumps(document))
    with pytest.warns(UserWarning, match=r"does not give the model options pool, norm_eps; their defaults are used: "
                                         r"pool='token', norm_eps=1e-06"):
        vitzoo.from_pretrained(tmp_path / "saved")
