"""vitzoo's own format: save_pretrained writes config.json, the weights and a model card, all at
once, and reads them back exactly; a config.json is read as strictly as options in code, checked
against its weights and the machine's memory before anything is built."""

from __future__ import annotations

import json
import time

import pytest
import torch
import transformers
from hub_testing import tiny  # tests/hub_testing.py
from safetensors.torch import save_file

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import CheckpointError, ConfigError
from vitzoo.weights import native


def test_save_pretrained_writes_config_weights_and_a_model_card(tmp_path):
    model = tiny()
    model.save_pretrained(tmp_path, card={"dataset": "cifar10", "metrics": {"accuracy": 0.9876},
                                          "repo_id": "alice/tiny", "license": "mit",
                                          "tags": ["cifar"]})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "config.json",
                                                          "model.safetensors"]
    document = json.loads((tmp_path / "config.json").read_text())
    assert (document["format"], document["format_version"]) == ("vitzoo", 1)
    assert document["model"] == model.config.to_dict()
    _, front, body = (tmp_path / "README.md").read_text().split("---\n", 2)
    for needle in ("library_name: vitzoo", "license: mit", "- cifar10", "value: 0.9876"):
        assert needle in front
    assert "2 layers of width 32" in body and "| cifar10 | accuracy | 0.9876 |" in body
    assert 'vitzoo.from_pretrained("hf-hub:alice/tiny")' in body
    loaded = vitzoo.from_pretrained(tmp_path)
    assert loaded.config == model.config
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 loaded.state_dict().values()))
    tiny().save_pretrained(tmp_path / "plain")
    card = (tmp_path / "plain" / "README.md").read_text()
    assert "model-index" not in card and "license: apache-2.0" in card


def test_a_crash_mid_save_leaves_no_half_written_file(tmp_path, monkeypatch):
    model = tiny()
    model.save_pretrained(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def crash(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\0" * 100)  # part of the file, then the process "dies"
        raise KeyboardInterrupt

    monkeypatch.setattr(native, "save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        model.save_pretrained(tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    with pytest.raises(KeyboardInterrupt):
        model.save_pretrained(tmp_path / "fresh")
    assert not (tmp_path / "fresh" / "config.json").exists()


def test_a_bare_vitzoo_file_infers_its_model_and_a_wrong_path_says_so(tmp_path):
    model = tiny()
    save_file(model.state_dict(), str(tmp_path / "w.safetensors"))
    loaded = vitzoo.from_pretrained(tmp_path / "w.safetensors", num_heads=2)
    assert loaded.config.img_size == (32, 32) and loaded.config.num_classes == 5
    torch.testing.assert_close(loaded(torch.ones(1, 3, 32, 32)), model(torch.ones(1, 3, 32, 32)))
    (tmp_path / "w.txt").write_text("hello")
    (tmp_path / "empty").mkdir()
    for path, error, said in (("w.txt", CheckpointError, "unknown file type"),
                              ("none.safetensors", FileNotFoundError, "no checkpoint at"),
                              ("empty", CheckpointError, "no weights file")):
        with pytest.raises(error, match=said):
            vitzoo.from_pretrained(tmp_path / path)


def edited(directory, **model_options) -> None:
    path = directory / "config.json"
    document = json.loads(path.read_text())
    document["model"].update(model_options)
    path.write_text(json.dumps(document))


@pytest.mark.parametrize("option, value, said", [
    ("stem", "bogus_stem", "unknown stem 'bogus_stem'"), ("depth", "2", "depth must be an int")])
def test_a_saved_option_of_the_wrong_type_names_the_file_and_the_option(tmp_path, option, value,
                                                                        said):
    tiny().save_pretrained(tmp_path)
    edited(tmp_path, **{option: value})
    with pytest.raises(ConfigError, match=said) as err:
        vitzoo.from_pretrained(tmp_path)
    assert tmp_path.name in str(err.value)


@pytest.mark.parametrize("text, error, said", [
    ('{"format": "vitzoo", "format_version": 1, "model": []}', ConfigError,
     "saved model config is not valid"),
    ('{"format": "vitzoo", "format_version": 3, "model": {}}', CheckpointError,
     "upgrade vitzoo if it is newer"),
    ('["format", "vitzoo"]', CheckpointError, "is not a JSON object"),
    ('{"format": "vitzoo", "model": {"act": "\xff"', CheckpointError, "not valid JSON"),
])
def test_a_config_json_of_another_layout_names_the_file_and_the_problem(tmp_path, text, error,
                                                                        said):
    tiny().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(error, match=said) as err:
        vitzoo.from_pretrained(tmp_path)
    assert "config.json" in str(err.value)


def test_a_saved_model_under_another_model_name_is_loaded_saying_so(tmp_path):
    tiny().save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match=r"holds another model than the one requested: "
                                         r"patch_size=8 \(not 16\), embed_dim=32 \(not 768\)"):
        assert vitzoo.create("vit_b16", pretrained=tmp_path).config.embed_dim == 32


@pytest.mark.parametrize("changes", [dict(depth=1_000_000), dict(mlp_dim=10**12)])
def test_a_config_that_does_not_describe_its_weights_is_refused_before_building(
        tmp_path, changes, capsys):
    tiny().save_pretrained(tmp_path)
    edited(tmp_path, **changes)
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=rf"config\.json does not describe its weights: "
                                              rf"it says {next(iter(changes))}="):
        vitzoo.from_pretrained(tmp_path)
    assert time.perf_counter() - start < 5
    assert main(["eval", str(tmp_path), "--data", "synthetic"]) == 2
    assert main(["push", str(tmp_path), "alice/tiny"]) == 2
    assert capsys.readouterr().err.count("config.json") >= 2


def test_a_model_beyond_memory_is_refused_from_its_options_alone(tmp_path):
    """transformers' config.json gives the image size: 1e6 px would be 2 TB of position
    embeddings, refused before any is allocated, as any model too large is."""
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=64, image_size=32, patch_size=8)
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path)
    document = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**document, "image_size": 10**6}))
    with pytest.raises(ConfigError, match=r"img_size=\(1000000, 1000000\)\) is more than this "
                                          r"machine's .* GiB of memory"):
        vitzoo.from_pretrained(tmp_path)
    wide = dict(embed_dim=2**20, num_heads=1, depth=2)  # 35 TB in float32
    with pytest.raises(ConfigError, match="at least 8.8e\\+12 parameters"):
        vitzoo.create("vit_ti16", **wide)
    assert vitzoo.create("vit_ti16", **wide, device="meta").config.embed_dim == 2**20
