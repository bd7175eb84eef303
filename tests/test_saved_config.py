"""A saved config.json is read as strictly as options given in code: a value of the wrong type, an
unknown part, a model larger than the machine or than its weights is refused naming the file before
anything is built; options it leaves out, and a model name it does not match, are said."""

from __future__ import annotations

import json
import time

import pytest
from hub_testing import tiny  # tests/hub_testing.py

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import CheckpointError, ConfigError


@pytest.mark.parametrize("option, value, fragment", [
    ("act", None, "act must be a str, got None"),
    ("stem", 5, "stem must be a str, got 5"),
    ("stem", "bogus_stem", "saved/config.json: unknown stem 'bogus_stem'"),
    ("pool", [], "pool must be a str"),
    ("fc_norm", "yes", "fc_norm must be True or False, got 'yes'"),
    ("dynamic_img_size", 1, "dynamic_img_size must be True or False, got 1"),
    ("in_chans", None, "in_chans must be an int, got None"),
    ("depth", "2", "depth must be an int"),
    ("num_classes", True, "num_classes must be an int"),
    ("pos_embed_mode", None, "pos_embed_mode must be a str"),
])
def test_a_saved_model_option_of_the_wrong_type_names_the_file_and_the_option(
        tmp_path, option, value, fragment):
    """A config.json whose model options hold a value of the wrong type (null for a name, a text for
    a bool, an unknown part) is a ConfigError naming the file, the option and the value."""
    tiny().save_pretrained(tmp_path / "saved")
    path = tmp_path / "saved" / "config.json"
    document = json.loads(path.read_text())
    document["model"][option] = value
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match="config.json") as err:
        vitzoo.from_pretrained(tmp_path / "saved")
    assert fragment in str(err.value)


VITZOO = '{"format": "vitzoo", "format_version": '


@pytest.mark.parametrize("document, error, fragment", [
    (VITZOO + '1, "model": {"resnet_layers": 5}}', ConfigError, "saved model config is not valid"),
    (VITZOO + '1, "model": []}', CheckpointError, "is not a vitzoo config.json"),
    (VITZOO + '"1", "model": {}}', CheckpointError, "format_version must be an int"),
    ('["format", "vitzoo"]', CheckpointError, "is not a JSON object"),
])
def test_a_config_json_of_another_layout_names_the_file_and_the_problem(
        tmp_path, document, error, fragment):
    tiny().save_pretrained(tmp_path / "saved")
    (tmp_path / "saved" / "config.json").write_text(document)
    with pytest.raises(error, match=fragment) as err:
        vitzoo.from_pretrained(tmp_path / "saved")
    assert "config.json" in str(err.value)


def test_a_config_json_that_is_not_utf8_says_so(tmp_path):
    """A config.json with bytes that are not UTF-8 is a CheckpointError naming the file."""
    from vitzoo.errors import CheckpointError

    tiny().save_pretrained(tmp_path / "saved")
    (tmp_path / "saved" / "config.json").write_bytes(b'{"format": "vitzoo", "model": {"act": '
                                                     b'"\xff"}}')
    with pytest.raises(CheckpointError, match="config.json is not UTF-8 text"):
        vitzoo.from_pretrained(tmp_path / "saved")


def test_saved_class_names_must_be_names(tmp_path):
    model = vitzoo.create("vit_ti16", num_classes=2, img_size=32, patch_size=8, embed_dim=32,
                          depth=1, num_heads=2, mlp_dim=64)
    model.labels = ["left", "right"]
    model.save_pretrained(tmp_path / "saved")
    assert vitzoo.from_pretrained(tmp_path / "saved").labels == ["left", "right"]
    document = json.loads((tmp_path / "saved" / "config.json").read_text())
    document["labels"] = [1, 2]
    (tmp_path / "saved" / "config.json").write_text(json.dumps(document))
    with pytest.raises(vitzoo.CheckpointError, match="list of class names"):
        vitzoo.from_pretrained(tmp_path / "saved")


def test_a_saved_config_missing_options_says_which_defaults_it_takes(tmp_path):
    """A config.json that leaves model options out (save_pretrained writes them all) loads with
    their defaults, and a warning names each and the default taken."""
    tiny(act="gelu").save_pretrained(tmp_path / "saved")
    path = tmp_path / "saved" / "config.json"
    document = json.loads(path.read_text())
    del document["model"]["norm_eps"], document["model"]["pool"]
    path.write_text(json.dumps(document))
    with pytest.warns(UserWarning,
                      match=r"does not give the model options pool, norm_eps; their defaults are used: "
                                         r"pool='token', norm_eps=1e-06"):
        vitzoo.from_pretrained(tmp_path / "saved")


def test_a_saved_model_loaded_under_another_model_name_warns(tmp_path):
    """`create(NAME, pretrained=DIR)` with DIR holding a saved model of another shape loads the
    saved model, as training does, and warns naming the options that differ."""
    tiny().save_pretrained(tmp_path / "saved")
    with pytest.warns(UserWarning,
                      match=r"holds another model than the one requested: embed_dim=32 \(not 768\)"):
        model = vitzoo.create("vit_b16", pretrained=tmp_path / "saved")
    assert model.config.embed_dim == 32


@pytest.fixture
def saved(tmp_path):
    model = vitzoo.create("vit_ti16", embed_dim=32, depth=2, num_heads=2, mlp_dim=64,
                          img_size=32, patch_size=8,
                          num_classes=3)
    model.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def edit_config(directory, **changes):
    path = directory / "config.json"
    document = json.loads(path.read_text())
    document["model"].update(changes)
    path.write_text(json.dumps(document))


@pytest.mark.parametrize("changes",
                         [dict(depth=1_000_000), dict(embed_dim=10**9), dict(mlp_dim=10**12),
                                     dict(depth=100_000)])
def test_a_saved_config_is_compared_with_its_weights_before_a_model_is_built(
        saved, changes, capsys):
    """A config.json of a million blocks or widths of 1e9 is no model its weights make:
    Refused in well under a second, naming config.json, by from_pretrained, eval and push alike."""
    edit_config(saved, **changes)
    option = next(iter(changes))
    start = time.perf_counter()
    with pytest.raises(CheckpointError,
                       match=rf"config\.json (describes a model of at least .* more than this "
                                              rf"machine's|does not describe the weights "
                                              rf".*{option}=)"):
        vitzoo.from_pretrained(saved)
    assert time.perf_counter() - start < 5
    assert main(["eval", str(saved), "--data", "synthetic"]) == 2
    assert main(["push", str(saved), "alice/tiny"]) == 2
    errors = capsys.readouterr().err
    assert errors.count("config.json") >= 2 and "Traceback" not in errors


def test_a_width_beyond_memory_is_refused_from_the_config_alone(saved):
    """The bound is counted from the options (no allocation): a model far beyond memory is refused
    before its weights are read at all."""
    from vitzoo.checkpoints.native import check_size, parameter_floor, read_config

    config = read_config(saved / "config.json")
    assert parameter_floor(config) <= vitzoo.count_params(vitzoo.from_pretrained(saved))
    with pytest.raises(CheckpointError,
                       match=r"config\.json describes a model of at least 8e\+18 parameters"):
        check_size(config.replace(embed_dim=10**9), f"{saved / 'config.json'} describes", "fix it")


def test_a_foreign_config_json_s_absurd_image_size_is_refused_before_allocating(tmp_path):
    """transformers' config.json gives the image size: 1e6 px (2 TB of
    position embeddings) instead of naming what is wrong."""
    import transformers

    hf = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=64,
                                image_size=32, patch_size=8, num_labels=3)
    transformers.ViTForImageClassification(hf).save_pretrained(tmp_path)
    document = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**document, "image_size": 10**6}))
    with pytest.raises(CheckpointError,
                       match=r"img_size=\(1000000, 1000000\)\), more than this machine's .* "
                                              r"check the options given and the files' metadata "
                                              r"\(config\.json\)"):
        vitzoo.from_pretrained(tmp_path)
