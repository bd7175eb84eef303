"""vitzoo's pushes load in timm and transformers: written in timm's layout where timm builds the
model, in transformers' with format="transformers", in vitzoo's own for a model neither builds,
the card saying so; vitzoo loads every layout exactly. Each on the test Hub."""

from __future__ import annotations

import json

import pytest
import timm
import torch
import transformers
from huggingface_hub import HfApi, constants, hf_hub_download
from hub_testing import TOKEN

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import CheckpointError, ConfigError
from vitzoo.weights.timm import architecture
from vitzoo.zoo import MODELS

# ViT-B/16's family shrunk: 16 x 16 patches of a 32 x 32 image, 2 narrow layers
VIT_B16 = dict(embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=32, num_classes=5)
X = torch.randn(2, 3, 32, 32)


@pytest.fixture
def hub(hub_server, monkeypatch):
    """timm and transformers read huggingface_hub's endpoint at import: the loopback Hub's too."""
    monkeypatch.setattr(constants, "ENDPOINT", hub_server.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        hub_server.url + "/{repo_id}/resolve/{revision}/{filename}")
    return hub_server


def random_model(name: str = "vit_b16", **options):
    model = vitzoo.create(name, **{**VIT_B16, **options})
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model.eval()


def pushed(repo_id: str, name: str = "config.json"):
    text = open(hf_hub_download(repo_id, name), encoding="utf-8").read()
    return json.loads(text) if name.endswith(".json") else text


def assert_vitzoo_exact(model, repo_id: str) -> None:
    pulled = vitzoo.from_pretrained(f"hf-hub:{repo_id}").eval()
    assert pulled.config == model.config
    assert all(torch.equal(a, b) for a, b in zip(pulled.state_dict().values(),
                                                 model.state_dict().values()))
    with torch.no_grad():
        assert torch.equal(pulled(X), model(X))


def assert_timm_same(repo_id: str, model) -> None:
    with torch.no_grad():
        theirs = timm.create_model(f"hf-hub:{repo_id}", pretrained=True).eval()
        assert (theirs(X) - model(X)).abs().max() < 1e-5


@pytest.mark.parametrize("pool", ["token", "gap"])
def test_timm_loads_a_vit_b16_push_by_default(hub, pool):
    model = random_model(pool=pool)
    model.push_to_hub(f"alice/b16-{pool}", token=TOKEN)
    config = pushed(f"alice/b16-{pool}")
    assert config["architecture"] == "vit_base_patch16_224" and config["weight_names"] == "timm"
    assert_timm_same(f"alice/b16-{pool}", model)
    assert_vitzoo_exact(model, f"alice/b16-{pool}")
    card = pushed(f"alice/b16-{pool}", "README.md")
    assert "library_name: timm" in card and "pretrained=True" in card
    assert f'vitzoo.from_pretrained("hf-hub:alice/b16-{pool}")' in card


@pytest.mark.slow  # the R50 has 12M parameters, built three times
def test_timm_loads_an_r50_hybrid_push(hub):
    model = random_model("vit_b16_hybrid", stem_options={"numerics": "timm"}, depth=1,
                         patch_size=1)
    model.push_to_hub("alice/r50-b16", token=TOKEN)
    assert pushed("alice/r50-b16")["architecture"] == "vit_base_r50_s16_224"
    assert_timm_same("alice/r50-b16", model)
    assert_vitzoo_exact(model, "alice/r50-b16")


def test_transformers_loads_a_push_in_its_format_with_its_class_names(hub):
    model = random_model(act="gelu_tanh", norm_eps=1e-12)  # transformers' numerics
    model.labels = ["cat", "dog", "eel", "fox", "gnu"]
    model.push_to_hub("alice/b16-hf", token=TOKEN, format="transformers")
    theirs, info = transformers.ViTForImageClassification.from_pretrained(
        "alice/b16-hf", output_loading_info=True)
    assert not any(info.values()), info  # every tensor named as transformers names it
    assert theirs.config.id2label[3] == "fox"
    with torch.no_grad():
        assert (theirs.eval()(pixel_values=X).logits - model(X)).abs().max() < 1e-5
    assert_vitzoo_exact(model, "alice/b16-hf")
    assert vitzoo.from_pretrained("hf-hub:alice/b16-hf").labels == model.labels


def test_a_push_or_save_over_a_transformers_one_leaves_none_of_its_files(hub, tmp_path):
    model = random_model()  # transformers would read a preprocessor_config.json left behind
    model.push_to_hub("alice/relaid", token=TOKEN, format="transformers")
    api = HfApi(endpoint=hub.url, token=TOKEN)
    assert "preprocessor_config.json" in api.list_repo_files("alice/relaid")
    model.push_to_hub("alice/relaid", token=TOKEN)
    assert sorted(api.list_repo_files("alice/relaid")) == [".gitattributes", "README.md",
                                                          "config.json", "model.safetensors"]
    assert_vitzoo_exact(model, "alice/relaid")
    run = tmp_path / "run"
    model.save_pretrained(run, format="transformers")
    (run / "metrics.jsonl").write_text("{}\n")  # a run's directory: the rest stays
    model.save_pretrained(run)
    assert {p.name for p in run.iterdir()} == {"README.md", "config.json", "model.safetensors",
                                               "metrics.jsonl"}
    assert vitzoo.from_pretrained(run).config == model.config


def test_cli_push_of_a_saved_directory_loads_in_timm_and_keeps_its_card(hub, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    model = random_model()
    model.save_pretrained(tmp_path, card={"dataset": "cifar10", "metrics": {"accuracy": 0.5}})
    assert main(["push", str(tmp_path), "alice/cli"]) == 0
    assert_timm_same("alice/cli", model)
    card = pushed("alice/cli", "README.md")
    assert "cifar10" in card and 'timm.create_model("hf-hub:alice/cli", pretrained=True)' in card
    assert json.loads((tmp_path / "config.json").read_text())["format_version"] == 1  # unchanged


def test_a_model_neither_library_builds_is_pushed_in_vitzoos_layout_saying_why(hub):
    model = random_model(pos_embed="learned_2d")
    model.push_to_hub("alice/grid", token=TOKEN)
    assert not {"architecture", "model_type", "weight_names"} & set(pushed("alice/grid"))
    card = pushed("alice/grid", "README.md")
    assert "timm cannot load this model" in card and "transformers cannot load this model" in card
    assert "pos_embed='learned_2d'" in card and "timm.create_model" not in card
    assert_vitzoo_exact(model, "alice/grid")
    hybrid = random_model("vit_b16_hybrid", depth=1, patch_size=1, stem_options={"layers": (1,)})
    with pytest.raises(ConfigError, match="timm cannot load this model.*numerics"):
        hybrid.push_to_hub("alice/r50-official", token=TOKEN, format="timm")  # not timm's ResNet


def test_a_layout_its_library_cannot_build_is_refused_before_anything_is_pushed(hub, tmp_path,
                                                                               capsys,
                                                                               monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    model = random_model(pool="gap")
    with pytest.raises(ConfigError, match=r"nothing was pushed.*pool='gap'.*format='timm'"):
        model.push_to_hub("alice/gap", format="transformers")
    model.save_pretrained(tmp_path)
    assert main(["push", str(tmp_path), "alice/gap", "--format", "transformers"]) == 2
    err = capsys.readouterr().err
    assert "transformers cannot load this model" in err and "pool='gap'" in err
    assert not HfApi(endpoint=hub.url, token=TOKEN).repo_exists("alice/gap")


def test_the_timm_architectures_written_are_registered_in_timm():
    written = {architecture(config) for config in MODELS.values()}
    written.add(architecture(vitzoo.get_config("vit_b16", **VIT_B16)))
    assert written <= set(timm.list_models()), written - set(timm.list_models())
    assert architecture(MODELS["vit_l16"]) == "vit_large_patch16_224"


def test_a_saved_layout_whose_names_do_not_match_its_weights_is_refused(tmp_path):
    model = random_model()
    model.save_pretrained(tmp_path / "timm", format="timm")
    with torch.no_grad():
        assert torch.equal(vitzoo.from_pretrained(tmp_path / "timm")(X), model(X))
    model.save_pretrained(tmp_path / "mislabelled")  # vitzoo's names, said to be timm's
    config = tmp_path / "mislabelled" / "config.json"
    document = json.loads(config.read_text())
    for names, said in (("timm", "says the weights are in timm's names, but they are not"),
                        ("keras", "weight_names must be one of timm, transformers, vitzoo")):
        config.write_text(json.dumps({**document, "weight_names": names, "format_version": 2}))
        with pytest.raises(CheckpointError, match=said):
            vitzoo.from_pretrained(tmp_path / "mislabelled")
