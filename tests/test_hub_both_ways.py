"""vitzoo's pushes load in timm and transformers: a push is written in timm's layout where timm builds
the model (`timm.create_model("hf-hub:...", pretrained=True)`), in transformers' with
format="transformers" (`ViTForImageClassification.from_pretrained`), in vitzoo's own for a model
neither builds, with the card saying so; vitzoo loads every layout exactly. Each on the test Hub."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub import HfApi, constants, hf_hub_download
from hub_testing import TOKEN

import vitzoo
from vitzoo.checkpoints import layouts
from vitzoo.cli import main
from vitzoo.errors import ConfigError
from vitzoo.zoo import MODELS

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

# ViT-B/16's family, shrunk: 16 x 16 patches of a 32 x 32 image, 2 narrow layers
VIT_B16 = dict(embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=32, patch_size=16, num_classes=5)
# R50+ViT-B/16's: the R50's three stages (3, 4, 9) at full width, patches of 1 on its stride-16 map
R50_VIT_B16 = dict(embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=32, num_classes=5)


@pytest.fixture
def libraries_see_the_hub(hub_server, monkeypatch):
    """timm and transformers download through huggingface_hub's module-level endpoint, read from
    HF_ENDPOINT when it was imported: pointed at the loopback Hub too."""
    monkeypatch.setattr(constants, "ENDPOINT", hub_server.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub_server.url + "/{repo_id}/resolve/{revision}/{filename}")
    return hub_server


def random_model(name: str, **options):
    """A model of `name`'s family with random weights (not the init's zeros), in eval mode."""
    model = vitzoo.create(name, **options)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model.eval()


def pushed_config(repo_id: str) -> dict:
    return json.loads(open(hf_hub_download(repo_id, "config.json"), encoding="utf-8").read())


def assert_vitzoo_exact(model, repo_id: str, x: torch.Tensor) -> None:
    pulled = vitzoo.from_pretrained(f"hf-hub:{repo_id}").eval()
    assert pulled.config == model.config
    assert all(torch.equal(a, b) for a, b in zip(pulled.state_dict().values(), model.state_dict().values()))
    assert torch.equal(pulled(x), model(x))


@pytest.mark.parametrize("pool", ["token", "gap"])
def test_timm_loads_a_vit_b16_push_by_default(libraries_see_the_hub, pool):
    model = random_model("vit_b16", pool=pool, **VIT_B16)
    model.push_to_hub(f"alice/b16-{pool}", token=TOKEN)
    config = pushed_config(f"alice/b16-{pool}")
    assert config["architecture"] == "vit_base_patch16_224" and config["weight_names"] == "timm"
    x = torch.randn(2, 3, 32, 32)
    theirs = timm.create_model(f"hf-hub:alice/b16-{pool}", pretrained=True).eval()
    with torch.no_grad():
        assert (theirs(x) - model(x)).abs().max() < 1e-5
        assert_vitzoo_exact(model, f"alice/b16-{pool}", x)
    card = open(hf_hub_download(f"alice/b16-{pool}", "README.md"), encoding="utf-8").read()
    assert "library_name: timm" in card and f'timm.create_model("hf-hub:alice/b16-{pool}", pretrained=True)' in card
    assert f'vitzoo.from_pretrained("hf-hub:alice/b16-{pool}")' in card


@pytest.mark.slow  # the R50 has 12M parameters: built three times (vitzoo, timm, vitzoo again), 12-50 s on 2 busy cores
def test_timm_loads_an_r50_hybrid_push(libraries_see_the_hub):
    model = random_model("vit_b16_hybrid", stem_options={"numerics": "timm"}, **R50_VIT_B16)
    model.push_to_hub("alice/r50-b16", token=TOKEN)
    assert pushed_config("alice/r50-b16")["architecture"] == "vit_base_r50_s16_224"
    x = torch.randn(2, 3, 32, 32)
    theirs = timm.create_model("hf-hub:alice/r50-b16", pretrained=True).eval()
    with torch.no_grad():
        assert (theirs(x) - model(x)).abs().max() < 1e-5
        assert_vitzoo_exact(model, "alice/r50-b16", x)


def test_transformers_loads_a_push_in_its_format(libraries_see_the_hub):
    # transformers' own numerics (tanh GELU, eps 1e-12) and class names, which its config states
    model = random_model("vit_b16", act="gelu_tanh", norm_eps=1e-12, **VIT_B16)
    model.labels = ["cat", "dog", "eel", "fox", "gnu"]
    model.push_to_hub("alice/b16-hf", token=TOKEN, format="transformers")
    theirs, info = transformers.ViTForImageClassification.from_pretrained("alice/b16-hf", output_loading_info=True)
    assert not any(info.values()), info  # every tensor named as transformers names it
    assert theirs.config.id2label[3] == "fox"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (theirs.eval()(pixel_values=x).logits - model(x)).abs().max() < 1e-5
        assert_vitzoo_exact(model, "alice/b16-hf", x)
    assert vitzoo.from_pretrained("hf-hub:alice/b16-hf").labels == model.labels


def test_a_push_over_a_transformers_push_leaves_none_of_its_files(libraries_see_the_hub):
    # transformers would read an earlier push's preprocessor_config.json (its resize, its normalisation)
    model = random_model("vit_b16", **VIT_B16)
    model.push_to_hub("alice/relaid", token=TOKEN, format="transformers")
    api = HfApi(endpoint=libraries_see_the_hub.url, token=TOKEN)
    assert "preprocessor_config.json" in api.list_repo_files("alice/relaid")
    model.push_to_hub("alice/relaid", token=TOKEN)  # timm's layout, over it
    assert sorted(api.list_repo_files("alice/relaid")) == [".gitattributes", "README.md", "config.json",
                                                          "model.safetensors"]
    assert pushed_config("alice/relaid")["weight_names"] == "timm"
    assert_vitzoo_exact(model, "alice/relaid", torch.randn(1, 3, 32, 32))


@pytest.mark.parametrize("holds_more", [False, True], ids=["a saved model", "a training run"])
def test_a_save_over_a_transformers_save_leaves_none_of_its_files(tmp_path, holds_more):
    model = random_model("vit_b16", **VIT_B16)
    folder = tmp_path / "saved"
    model.save_pretrained(folder, format="transformers")
    if holds_more:  # a run's directory: its other files stay, the files of the save are replaced one by one
        (folder / "metrics.jsonl").write_text("{}\n")
    model.save_pretrained(folder)
    kept = {"README.md", "config.json", "model.safetensors"} | ({"metrics.jsonl"} if holds_more else set())
    assert {p.name for p in folder.iterdir()} == kept
    assert vitzoo.from_pretrained(folder).config == model.config


def test_cli_push_of_a_saved_directory_loads_in_timm_and_keeps_its_card(libraries_see_the_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    model = random_model("vit_b16", **VIT_B16)
    model.save_pretrained(tmp_path / "saved", card={"dataset": "cifar10", "metrics": {"accuracy": 0.5}})
    assert main(["push", str(tmp_path / "saved"), "alice/cli"]) == 0
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert (timm.create_model("hf-hub:alice/cli", pretrained=True).eval()(x) - model(x)).abs().max() < 1e-5
    card = open(hf_hub_download("alice/cli", "README.md"), encoding="utf-8").read()
    assert "cifar10" in card and 'timm.create_model("hf-hub:alice/cli", pretrained=True)' in card
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["format_version"] == 1  # the directory unchanged


def test_a_model_neither_library_builds_is_pushed_in_vitzoos_layout_and_the_card_says_why(libraries_see_the_hub):
    model = random_model("vit_b16", pos_embed="learned_2d", **VIT_B16)
    model.push_to_hub("alice/grid", token=TOKEN)
    config = pushed_config("alice/grid")
    assert "architecture" not in config and "model_type" not in config and "weight_names" not in config
    card = open(hf_hub_download("alice/grid", "README.md"), encoding="utf-8").read()
    assert "timm cannot load this model" in card and "transformers cannot load this model" in card
    assert "pos_embed='learned_2d'" in card and "timm.create_model" not in card
    with torch.no_grad():
        assert_vitzoo_exact(model, "alice/grid", torch.randn(1, 3, 32, 32))


def test_the_official_hybrid_numerics_are_not_timms(libraries_see_the_hub):
    # timm's ResNetV2 standardises its weights otherwise: the logits would differ, so vitzoo's layout is pushed
    # (a one-unit ResNet: the numerics are what is refused, whatever the stages)
    model = random_model("vit_b16_hybrid", **{**R50_VIT_B16, "stem_options": {"layers": (1,)}})
    model.push_to_hub("alice/r50-official", token=TOKEN)
    assert "architecture" not in pushed_config("alice/r50-official")
    card = open(hf_hub_download("alice/r50-official", "README.md"), encoding="utf-8").read()
    assert "stem_options={'numerics': 'timm'}" in card
    with pytest.raises(ConfigError, match="timm cannot load this model.*numerics"):
        model.push_to_hub("alice/r50-official", token=TOKEN, format="timm")


def test_format_transformers_on_a_gap_model_is_refused_before_anything_is_pushed(hub_server, tmp_path, capsys,
                                                                                monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    model = random_model("vit_b16", pool="gap", **VIT_B16)
    with pytest.raises(ConfigError, match=r"nothing was pushed.*pool='gap'.*class token.*format='timm'"):
        model.push_to_hub("alice/gap", format="transformers")
    model.save_pretrained(tmp_path / "gap")
    assert main(["push", str(tmp_path / "gap"), "alice/gap", "--format", "transformers"]) == 2
    err = capsys.readouterr().err
    assert "transformers cannot load this model" in err and "pool='gap'" in err and "format='timm'" in err
    assert not HfApi(endpoint=hub_server.url, token=TOKEN).repo_exists("alice/gap")


def test_the_timm_architectures_written_are_registered_in_timm():
    registered = set(timm.list_models())
    written = layouts.TIMM_PATCH_ARCHITECTURES | layouts.TIMM_HYBRID_ARCHITECTURES
    assert written <= registered, written - registered
    assert layouts.timm_architecture(MODELS["vit_l16"]) == "vit_large_patch16_224"
    assert layouts.timm_architecture(MODELS["vit_b16_hybrid"].replace(img_size=384)) == "vit_base_r50_s16_384"


def test_a_saved_layout_whose_names_do_not_match_its_weights_is_refused_naming_it(tmp_path):
    from vitzoo.errors import CheckpointError

    model = random_model("vit_b16", **VIT_B16)
    model.save_pretrained(tmp_path / "timm", format="timm")
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(vitzoo.from_pretrained(tmp_path / "timm")(x), model(x))
    model.save_pretrained(tmp_path / "mislabelled")  # vitzoo's names under a config.json that says timm's
    config = tmp_path / "mislabelled" / "config.json"
    document = json.loads(config.read_text())
    for names, fragment in (("timm", "says the weights are in timm's names, but they are not"),
                            ("keras", "weight_names must be one of timm, transformers, vitzoo")):
        config.write_text(json.dumps({**document, "weight_names": names, "format_version": 2}))
        with pytest.raises(CheckpointError, match=fragment):
            vitzoo.from_pretrained(tmp_path / "mislabelled")
    config.write_text(json.dumps({**document, "format_version": 3}))
    with pytest.raises(CheckpointError, match="newer than this vitzoo reads"):
        vitzoo.from_pretrained(tmp_path / "mislabelled")
