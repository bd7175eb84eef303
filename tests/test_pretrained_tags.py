"""Pretrained tags: the released weights by name, from Hub repos laid out as the real ones.

Every tag gets a repo on the loopback Hub under its real name with the real repo's files (timm's
config.json with timm's pretrained_cfg, or google's transformers files) and the peer library's
model of the tag, shrunk to width 32 and one block (`SMALL`); vitzoo loads them under the tag's
name, shrunk alike, to the peer's logits and the preprocessing timm publishes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import timm
import torch
import transformers
from hub_testing import TOKEN, hermetic_hub_environment  # tests/hub_testing.py
from hubserver import HubServer
from huggingface_hub import HfApi, constants
from safetensors.torch import save_file
from test_weights_formats import randomize
from timm.models import get_pretrained_cfg

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import HubError, PluginError
from vitzoo.registry import pretrained_tags
from vitzoo.zoo import PretrainedTag, imagenet_1k

SMALL = dict(embed_dim=32, depth=1, num_heads=2, mlp_dim=64)
TAGS = sorted(pretrained_tags())
GOOGLE_SAFETENSORS = {"google/vit-base-patch32-384"}  # the others hold pytorch_model.bin only
GOOGLE_LABELS = [f"{name} (id2label)" for name in imagenet_1k()]  # told apart from torchvision's


def small_resnet(tag: PretrainedTag) -> tuple[int, ...] | None:  # one unit per stage
    config = vitzoo.get_config(tag.model)
    return (1,) * len(config.stem_options["layers"]) if config.stem == "resnet" else None


def shrink(tag: PretrainedTag) -> dict:
    layers = small_resnet(tag)
    return {**SMALL, **({"stem_options": {"layers": layers}} if layers else {})}


def peer(tag: PretrainedTag, seed: int = 0) -> torch.nn.Module:
    """The tag's model in timm or transformers, shrunk like SMALL."""
    if tag.format == "timm":
        from timm.models.vision_transformer_hybrid import HybridEmbed, _resnetv2

        layers = small_resnet(tag)
        extra = {"embed_layer": partial(HybridEmbed, backbone=_resnetv2(layers))} if layers else {}
        return randomize(timm.create_model(tag.hub_id.split("/")[1].split(".")[0],
                                           num_classes=tag.num_classes, embed_dim=32, depth=1,
                                           num_heads=2, mlp_ratio=2.0, **extra), seed)
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        image_size=tag.img_size, patch_size=vitzoo.get_config(tag.model).patch_size,
        num_labels=tag.num_classes, id2label=dict(enumerate(GOOGLE_LABELS)),
        label2id={name: i for i, name in enumerate(GOOGLE_LABELS)})
    return randomize(transformers.ViTForImageClassification(config), seed)


def peer_logits(tag: PretrainedTag, x: torch.Tensor, seed: int = 0) -> torch.Tensor:
    with torch.no_grad():
        out = peer(tag, seed)(x)
    return out.logits if tag.format == "transformers" else out


def repo_files(tag: PretrainedTag, reference: torch.nn.Module, folder: Path) -> None:
    """As timm (config.json with pretrained_cfg, both weight files, a card) or google publish."""
    if tag.format == "transformers":
        reference.save_pretrained(folder)
        (folder / "preprocessor_config.json").write_text(json.dumps(
            {"do_normalize": True, "do_resize": True, "image_mean": [0.5] * 3,
             "image_std": [0.5] * 3, "size": tag.img_size}))
        torch.save(reference.state_dict(), folder / "pytorch_model.bin")
        if tag.hub_id not in GOOGLE_SAFETENSORS:
            (folder / "model.safetensors").unlink()
        return
    arch, timm_tag = tag.hub_id.split("/")[1].split(".")
    cfg = get_pretrained_cfg(f"{arch}.{timm_tag}")
    pretrained_cfg = {"tag": timm_tag, "input_size": list(cfg.input_size),
                      "interpolation": cfg.interpolation, "crop_pct": cfg.crop_pct,
                      "crop_mode": cfg.crop_mode, "mean": list(cfg.mean), "std": list(cfg.std),
                      "num_classes": cfg.num_classes, "first_conv": cfg.first_conv,
                      "classifier": cfg.classifier}
    (folder / "config.json").write_text(json.dumps({
        "architecture": arch, "num_classes": cfg.num_classes, "num_features": 768,
        "global_pool": "token", "pretrained_cfg": pretrained_cfg}))
    state_dict = {k: v.contiguous().clone() for k, v in reference.state_dict().items()}
    save_file(state_dict, str(folder / "model.safetensors"))
    torch.save(state_dict, folder / "pytorch_model.bin")
    (folder / "README.md").write_text(f"---\nlibrary_name: timm\nlicense: {tag.license}\n---\n")


def upload_tag(api: HfApi, tag: PretrainedTag, folder: Path, seed: int = 0) -> str:
    """The tag's repo with the peer's weights drawn from `seed`; returns the commit id."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    repo_files(tag, peer(tag, seed), folder)
    api.create_repo(tag.hub_id, exist_ok=True)
    return api.upload_folder(repo_id=tag.hub_id, folder_path=folder).oid


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """One Hub server for the module, every registered tag's repo on it."""
    root = tmp_path_factory.mktemp("tags")
    with pytest.MonkeyPatch.context() as mp, HubServer(root / "hub", token=TOKEN) as server:
        mp.setenv("HF_HUB_DISABLE_XET", "1")
        mp.setattr(constants, "HF_HUB_DISABLE_XET", True)
        api = HfApi(endpoint=server.url, token=TOKEN)
        for name in TAGS:
            upload_tag(api, pretrained_tags()[name], root / "files" / name)
        yield server


@pytest.fixture
def server(hub, monkeypatch, tmp_path):
    hermetic_hub_environment(monkeypatch, tmp_path)  # an empty cache of this test's own
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    return hub


def image(tag: PretrainedTag) -> torch.Tensor:
    return torch.randn(1, 3, tag.img_size, tag.img_size,
                       generator=torch.Generator().manual_seed(0))


def test_a_tag_without_pretrained_builds_its_architecture_without_weights():
    model = vitzoo.create("vit_b16_hybrid.orig_in21k_ft_in1k", device="meta")
    c = model.config
    assert (c.img_size, c.num_classes, c.crop_pct, c.stem_options["numerics"]) == (
        (384, 384), 1000, 1.0, "timm")
    assert model.pretrained_tag is None and model.labels is None
    assert vitzoo.create("vit_b16.orig_in21k", device="meta", num_classes=10).config.num_classes \
        == 10  # options win


def test_unknown_tags_and_models_without_weights_are_clear_errors():
    with pytest.raises(vitzoo.ConfigError, match=r"unknown pretrained tag 'vit_b16.orig_in1k'.*"
                                                 r"Tags of vit_b16: vit_b16.augreg2_in21k_ft_in1k"):
        vitzoo.create("vit_b16.orig_in1k", pretrained=True)
    with pytest.raises(vitzoo.ConfigError, match=r"'vit_b32_r26_hybrid' has no default pretrained "
                                                 r"tag: name one of its tags \(it has none\)"):
        vitzoo.create("vit_b32_r26_hybrid", pretrained=True)
    with pytest.raises(vitzoo.ConfigError, match="pass pretrained=True"):
        vitzoo.create("vit_b16.orig_in21k@main")


@pytest.mark.parametrize("name", TAGS)
def test_every_tag_loads_from_its_repo_with_the_peers_logits(server, name):
    tag = pretrained_tags()[name]
    model = vitzoo.create(name, pretrained=True, **shrink(tag))
    assert model.pretrained_tag is tag
    c = model.config
    assert (c.img_size, c.num_classes, c.mean, c.std, c.crop_pct, c.interpolation) == (
        (tag.img_size,) * 2, tag.num_classes, tag.mean, tag.std, tag.crop_pct, tag.interpolation)
    # the weights' own class names, else the tag's (none for ImageNet-21k's 21,843 classes)
    assert model.labels == (GOOGLE_LABELS if tag.format == "transformers" else tag.categories())
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(image(tag)), peer_logits(tag, image(tag)),
                                   atol=1e-4, rtol=0)


def test_pretrained_true_loads_the_default_tag_and_a_revision_the_repo_had(server, tmp_path):
    tag = pretrained_tags()["vit_b16.orig_in21k_ft_in1k"]
    api = HfApi(endpoint=server.url, token=TOKEN)
    first = api.model_info(tag.hub_id).sha
    upload_tag(api, tag, tmp_path / "newer", seed=1)
    try:
        with torch.no_grad():
            model = vitzoo.create("vit_b16", pretrained=True, **SMALL)
            assert model.pretrained_tag is tag
            torch.testing.assert_close(model(image(tag)), peer_logits(tag, image(tag), 1))
            old = vitzoo.create(f"{tag.name}@{first}", pretrained=True, **SMALL)
            torch.testing.assert_close(old(image(tag)), peer_logits(tag, image(tag)))
        with pytest.raises(HubError, match=rf"{tag.name}: .*has no revision 'v9'"):
            vitzoo.create(f"{tag.name}@v9", pretrained=True, **SMALL)
    finally:  # the module's other tests expect the first weights at main
        upload_tag(api, tag, tmp_path / "again")


def test_offline_loads_the_filled_cache_and_says_how_without_it(server, monkeypatch):
    tag = pretrained_tags()["vit_b32.orig_in21k_ft_in1k"]
    online = vitzoo.create(tag.name, pretrained=True, **SMALL)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with torch.no_grad():
        assert torch.equal(online(image(tag)),
                           vitzoo.create(tag.name, pretrained=True, **SMALL)(image(tag)))
    with pytest.raises(HubError) as err:
        vitzoo.create("vit_l16", pretrained=True, **SMALL)  # never downloaded
    for said in ("HF_HUB_OFFLINE=1", "vitzoo pull google/vit-large-patch16-384", "pretrained=PATH"):
        assert said in str(err.value)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    with pytest.raises(HubError, match="(?s)cannot reach the Hub.*HF_HUB_OFFLINE=1.*"
                                       "pretrained=PATH"):
        vitzoo.create("vit_b16.orig_in21k", pretrained=True, **SMALL)


def tags(*registered: PretrainedTag, model: vitzoo.ViTConfig | None = None):
    class Plugin:
        @vitzoo.hookimpl
        def vitzoo_pretrained_tags(self):
            return {tag.name: tag for tag in registered}

        if model is not None:
            @vitzoo.hookimpl
            def vitzoo_models(self):
                return {"tiny_vit": model}

    return Plugin()


TINY_VIT = vitzoo.ViTConfig(embed_dim=32, depth=1, num_heads=2, mlp_dim=64)
TINY_TAGS = (PretrainedTag("tiny_vit", "in1k", "alice/tiny_vit.in1k", "timm", 64, 1000,
                           crop_pct=0.875, labels="imagenet-1k", default=True),
             PretrainedTag("tiny_vit", "in21k", "alice/tiny_vit.in21k", "timm", 64, 0))


def upload_tiny(server, tmp_path) -> torch.nn.Module:
    """alice/tiny_vit.in1k and .in21k in timm's layout; returns the in1k weights' timm model."""
    api, models = HfApi(endpoint=server.url, token=TOKEN), {}
    for name, classes in (("in1k", 1000), ("in21k", 0)):
        models[name] = randomize(timm.create_model(
            "vit_base_patch16_224", img_size=64, embed_dim=32, depth=1, num_heads=2,
            mlp_ratio=2.0, num_classes=classes))
        (tmp_path / name).mkdir()
        save_file(models[name].state_dict(), str(tmp_path / name / "model.safetensors"))
        (tmp_path / name / "config.json").write_text(json.dumps(
            {"architecture": "vit_base_patch16_224", "pretrained_cfg": {"input_size": [3, 64,
                                                                                       64]}}))
        api.create_repo(f"alice/tiny_vit.{name}", exist_ok=True)
        api.upload_folder(repo_id=f"alice/tiny_vit.{name}", folder_path=tmp_path / name)
    return models["in1k"]


def test_a_plugin_adds_tags_listed_and_loaded_like_the_builtins(server, plugin, tmp_path, capsys):
    plugin(tags(*TINY_TAGS, model=TINY_VIT))
    assert vitzoo.list_pretrained("tiny_vit*") == ["tiny_vit.in1k", "tiny_vit.in21k"]
    assert main(["list", "--pretrained", "tiny*"]) == 0
    assert re.search(r"tiny_vit.in1k\s+\* hf-hub:alice/tiny_vit.in1k \(timm, 64 px, 1000 "
                     r"classes\)  top-1 -", capsys.readouterr().out)
    reference = upload_tiny(server, tmp_path)
    model = vitzoo.create("tiny_vit", pretrained=True)
    assert model.pretrained_tag.name == "tiny_vit.in1k" and model.config.crop_pct == 0.875
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), atol=1e-4, rtol=0)
    plugin(tags(pretrained_tags()["vit_b16.orig_in21k"]))
    with pytest.raises(PluginError, match=r"'vit_b16.orig_in21k' is registered twice: by plugin "
                                          r"'vitzoo.builtins' and by plugin 'test-plugin-1'"):
        vitzoo.list_pretrained()


def test_predict_prints_the_top_labels_of_an_image_or_refuses_one(server, plugin, tmp_path,
                                                                  capsys):
    from PIL import Image

    plugin(tags(*TINY_TAGS, model=TINY_VIT))
    reference = upload_tiny(server, tmp_path)
    pixels = torch.zeros(80, 100, 3, dtype=torch.uint8)
    pixels[..., 0] = torch.arange(100, dtype=torch.uint8)  # the prediction depends on the pixels
    Image.fromarray(pixels.numpy()).save(tmp_path / "cat.png")
    assert main(["predict", str(tmp_path / "cat.png"), "--model", "tiny_vit.in1k", "--top", "3",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    x = vitzoo.transforms_for("tiny_vit.in1k")(Image.open(tmp_path / "cat.png").convert("RGB"))
    with torch.no_grad():
        top = reference(x[None]).softmax(-1)[0].topk(3)
    (prediction,) = result["predictions"]
    assert result["model"] == "tiny_vit.in1k"
    assert [item["label"] for item in prediction["top"]] == [imagenet_1k()[i] for i in top.indices]
    assert [item["probability"] for item in prediction["top"]] == pytest.approx(
        top.values.tolist(), abs=1e-5)
    assert main(["predict", str(tmp_path / "cat.png"), "--model", "tiny_vit"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{tmp_path / 'cat.png'}:" and len(lines) == 6
    (tmp_path / "notes.png").write_text("not an image")
    assert main(["predict", str(tmp_path / "notes.png"), "--model", "tiny_vit.in1k"]) == 2
    assert f"cannot read image '{tmp_path / 'notes.png'}'" in capsys.readouterr().err
    assert main(["predict", str(tmp_path / "cat.png"), "--model", "tiny_vit.in21k"]) == 2
    assert "tiny_vit.in21k has no classifier" in capsys.readouterr().err


def test_the_documented_table_is_the_registry_s(capsys):
    page = (Path(__file__).parents[1] / "docs" / "pretrained.md").read_text()
    start = "<!-- pretrained-table: vitzoo list --pretrained --markdown -->\n"
    assert main(["list", "--pretrained", "--markdown"]) == 0
    assert page.split(start, 1)[1].split("<!-- /pretrained-table -->", 1)[0] == \
        capsys.readouterr().out, "regenerate it: vitzoo list --pretrained --markdown"


FINE_TUNED = "vit_s16.augreg_in21k_ft_in1k"


@pytest.mark.slow
def test_fine_tuning_released_weights_on_an_image_folder_is_one_command(server, tmp_path):
    from PIL import Image

    for split, count in (("train", 6), ("val", 2)):
        for c in range(3):
            (tmp_path / "pets" / split / str(c)).mkdir(parents=True)
            for i in range(count):
                pixels = torch.rand(40, 48, 3, generator=torch.Generator().manual_seed(i)) * 80
                Image.fromarray((pixels + 60 * c).byte().numpy()).save(
                    tmp_path / "pets" / split / str(c) / f"{i}.png")
    shrunk = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]
    result = subprocess.run([sys.executable, "-m", "vitzoo", "train", "--pretrained", FINE_TUNED,
                             "--data", str(tmp_path / "pets"), "--recipe", "paper-finetune",
                             "--steps", "2", "--batch-size", "6", "--device", "cpu", "--out",
                             str(tmp_path / "run"), "--quiet", "--no-tensorboard", *shrunk],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    tuned = vitzoo.from_pretrained(tmp_path / "run")
    released = vitzoo.create(FINE_TUNED, pretrained=True, **SMALL)
    assert tuned.config.num_classes == 3  # a new head, the folder's
    assert (tuned.config.mean, tuned.config.crop_pct) == (released.config.mean, 0.9)  # theirs
    moved = tuned.state_dict()["stem.proj.weight"] - released.state_dict()["stem.proj.weight"]
    assert 0 < moved.abs().max() < 0.05  # two steps from the released weights


def test_a_hub_repo_is_a_name_as_in_timm_and_keeps_its_preprocessing(server):
    tag = pretrained_tags()[FINE_TUNED]
    by_repo = vitzoo.create(f"hf-hub:{tag.hub_id}", pretrained=True, **SMALL)
    with torch.no_grad():
        assert torch.equal(by_repo.eval()(image(tag)),
                           vitzoo.create(FINE_TUNED, pretrained=True, **SMALL).eval()(image(tag)))
    named = vitzoo.create("vit_s16", pretrained=f"hf-hub:{tag.hub_id}", **SMALL)
    assert named.config.crop_pct == 0.9 != vitzoo.get_config("vit_s16").crop_pct  # the repo's
    assert vitzoo.create(f"hf-hub:{tag.hub_id}", **SMALL).config == by_repo.config  # no weights
