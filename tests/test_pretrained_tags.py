"""Pretrained tags: the released weights by name, from Hub repos laid out exactly as the real ones.

Every registered tag gets a repo on the loopback Hub server (tests/hubserver) under its real
name, with the real repo's files: timm's `config.json` (architecture, num_classes, num_features,
global_pool, pretrained_cfg as timm publishes it), `model.safetensors` and `pytorch_model.bin`, and a
model card; google's transformers `config.json` (with id2label), the published 160-byte
`preprocessor_config.json`, `pytorch_model.bin` and, where the real repo has one, `model.safetensors`.
The weights are small and random: the peer library's model (timm or transformers) of the tag's
architecture, resolution, patch size and classes, shrunk to width 32, one block (and one ResNet unit
per stage for the hybrid). vitzoo loads them under the real tag names with the same shrink options
(`SMALL`) and must give the peer's logits.
"""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path

import pytest
import timm
import torch
import transformers
from hub_testing import TOKEN, hermetic_hub_environment  # tests/hub_testing.py
from huggingface_hub import HfApi, constants
from safetensors.torch import save_file
from test_weights_formats import plugin, randomize  # noqa: F401 (a fixture; the peers' parameters randomised)
from timm.models import get_pretrained_cfg

import vitzoo
from vitzoo.catalog import markdown_table, registered
from vitzoo.cli import main
from vitzoo.errors import HubError, PluginError
from vitzoo.labels import imagenet_1k
from vitzoo.tags import PretrainedTag
from hubserver import HubServer

SMALL = dict(embed_dim=32, depth=1, num_heads=2, mlp_dim=64)  # the shrink: width 32, one block, two heads
TAGS = sorted(registered())
# google's ports with a model.safetensors beside pytorch_model.bin (the others have the .bin only)
GOOGLE_SAFETENSORS = {"google/vit-base-patch32-384"}
GOOGLE_PREPROCESSOR = {"do_normalize": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
                       "image_std": [0.5, 0.5, 0.5]}  # + "size", as published


def google_labels() -> list[str]:
    # google's id2label names the same 1000 classes as torchvision, in other words: tell them apart
    return [f"{name} (id2label)" for name in imagenet_1k()]


def small_resnet(tag: PretrainedTag) -> tuple[int, ...] | None:
    """The hybrid's ResNet stages (R50 with 3 or 4, R26 with 4), one unit each; None for a plain ViT."""
    config = vitzoo.get_config(tag.model)
    return (1,) * len(config.stem_options["layers"]) if config.stem == "resnet" else None


def shrink(tag: PretrainedTag) -> dict:
    return {**SMALL, **({"stem_options": {"layers": small_resnet(tag)}} if small_resnet(tag) else {})}


# ------------------------------------------------------------------------------------------- the peers
def timm_peer(tag: PretrainedTag, seed: int = 0) -> torch.nn.Module:
    """timm's model of the tag, shrunk like SMALL."""
    from timm.models.vision_transformer_hybrid import HybridEmbed, _resnetv2

    arch = tag.hub_id.split("/")[1].split(".")[0]
    extra = {"embed_layer": partial(HybridEmbed, backbone=_resnetv2(small_resnet(tag)))} if small_resnet(tag) else {}
    return randomize(timm.create_model(arch, pretrained=False, num_classes=tag.num_classes, embed_dim=32, depth=1,
                                       num_heads=2, mlp_ratio=2.0, **extra), seed)


def transformers_peer(tag: PretrainedTag, seed: int = 0) -> torch.nn.Module:
    labels = google_labels()
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                    image_size=tag.img_size, patch_size=vitzoo.get_config(tag.model).patch_size,
                                    num_labels=tag.num_classes, id2label=dict(enumerate(labels)),
                                    label2id={name: i for i, name in enumerate(labels)})
    return randomize(transformers.ViTForImageClassification(config), seed)


def peer(tag: PretrainedTag, seed: int = 0) -> torch.nn.Module:
    return {"timm": timm_peer, "transformers": transformers_peer}[tag.format](tag, seed)


def peer_logits(tag: PretrainedTag, reference: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = reference(x)
    return out.logits if tag.format == "transformers" else out


# ------------------------------------------------------------------------------------------- the repos
def timm_files(tag: PretrainedTag, reference: torch.nn.Module, folder: Path) -> None:
    """As timm publishes: config.json with its pretrained_cfg, both weight files, a model card."""
    arch, timm_tag = tag.hub_id.split("/")[1].split(".")
    cfg = get_pretrained_cfg(f"{arch}.{timm_tag}")
    pretrained_cfg = {"tag": timm_tag, "custom_load": cfg.custom_load, "input_size": list(cfg.input_size),
                      "fixed_input_size": cfg.fixed_input_size, "interpolation": cfg.interpolation,
                      "crop_pct": cfg.crop_pct, "crop_mode": cfg.crop_mode, "mean": list(cfg.mean),
                      "std": list(cfg.std), "num_classes": cfg.num_classes, "pool_size": None,
                      "first_conv": cfg.first_conv, "classifier": cfg.classifier}
    document = {"architecture": arch, "num_classes": cfg.num_classes, "num_features": 768, "global_pool": "token",
                "pretrained_cfg": pretrained_cfg}
    (folder / "config.json").write_text(json.dumps(document, indent=2))
    state_dict = {k: v.contiguous().clone() for k, v in reference.state_dict().items()}
    save_file(state_dict, str(folder / "model.safetensors"))
    torch.save(state_dict, folder / "pytorch_model.bin")
    (folder / "README.md").write_text(f"---\ntags:\n- timm\nlibrary_name: timm\nlicense: {tag.license}\n---\n"
                                      f"# Model card for {tag.hub_id.split('/')[1]}\n")


def google_files(tag: PretrainedTag, reference: torch.nn.Module, folder: Path) -> None:
    """As google's ports: transformers' config.json, the 160-byte preprocessor_config.json, weights."""
    reference.save_pretrained(folder)  # config.json + model.safetensors
    (folder / "preprocessor_config.json").write_text(json.dumps({**GOOGLE_PREPROCESSOR, "size": tag.img_size}))
    weights = folder / "model.safetensors"
    from safetensors.torch import load_file

    torch.save(load_file(str(weights)), folder / "pytorch_model.bin")
    if tag.hub_id not in GOOGLE_SAFETENSORS:
        weights.unlink()


def upload_tag(api: HfApi, tag: PretrainedTag, folder: Path, seed: int = 0) -> str:
    """The tag's repo (created when missing) with the peer's weights drawn from `seed`; the commit id."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    {"timm": timm_files, "transformers": google_files}[tag.format](tag, peer(tag, seed), folder)
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
            upload_tag(api, registered()[name], root / "files" / name)
        yield server


@pytest.fixture
def server(hub, monkeypatch, tmp_path):
    hermetic_hub_environment(monkeypatch, tmp_path)  # an empty cache of this test's own
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    return hub


def image_input(tag: PretrainedTag, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, 3, tag.img_size, tag.img_size, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------- the data
def test_the_paper_weights_are_tagged_for_every_released_model():
    assert set(vitzoo.list_pretrained("vit_b16.orig*")) == {"vit_b16.orig_in21k", "vit_b16.orig_in21k_ft_in1k",
                                                             "vit_b16.orig_in21k_ft_in1k_224"}
    paper = {"vit_b16", "vit_b32", "vit_l16", "vit_l32", "vit_h14", "vit_b16_hybrid"}
    augreg = {"vit_ti16", "vit_s16", "vit_s32", "vit_b8", "vit_b16", "vit_b32", "vit_l16", "vit_s32_r26_hybrid",
              "vit_l32_hybrid"}
    assert {registered()[n].model for n in TAGS if ".orig_" in n} == paper
    assert {registered()[n].model for n in TAGS if ".augreg" in n} == augreg
    assert {registered()[n].model for n in TAGS if registered()[n].default} == paper | augreg  # one default each
    assert "vit_b16.augreg2_in21k_ft_in1k" in TAGS and registered()["vit_s16.augreg_in21k"].num_classes == 21843
    default = registered()["vit_b16.orig_in21k_ft_in1k"]
    assert default.default and default.img_size == 384 and default.accuracy == 83.97
    assert all(tag.accuracy is None or tag.accuracy_source for tag in registered().values())


@pytest.mark.parametrize("name", [n for n in TAGS if registered()[n].format == "timm"])
def test_timm_tags_agree_with_timms_pretrained_cfg(name):
    """The tag's facts are timm's for the repo it names (timm publishes that repo's config.json from them)."""
    tag = registered()[name]
    cfg = get_pretrained_cfg(tag.hub_id.split("/")[1])
    assert cfg.hf_hub_id == tag.hub_id
    assert (cfg.input_size, cfg.num_classes, cfg.crop_pct, cfg.interpolation, cfg.license) == \
        ((3, tag.img_size, tag.img_size), tag.num_classes, tag.crop_pct, tag.interpolation, tag.license)
    assert (tuple(cfg.mean), tuple(cfg.std)) == (tag.mean, tag.std)


def test_a_tag_name_without_pretrained_builds_its_architecture_without_weights():
    model = vitzoo.create("vit_b16_hybrid.orig_in21k_ft_in1k", device="meta")
    config = model.config
    assert (config.img_size, config.num_classes, config.crop_pct, config.stem_options["numerics"]) == ((384, 384), 1000, 1.0, "timm")
    assert model.pretrained_tag is None and model.labels is None
    assert vitzoo.create("vit_b16.orig_in21k", device="meta").config.num_classes == 0
    assert vitzoo.create("vit_b16.orig_in21k", device="meta", num_classes=10).config.num_classes == 10  # options win


def test_unknown_tags_and_models_without_weights_are_clear_errors():
    with pytest.raises(vitzoo.ConfigError, match=r"unknown pretrained tag 'vit_b16.orig_in1k'.*Tags of vit_b16: "
                                                 r"vit_b16.augreg2_in21k_ft_in1k, .*vit_b16.orig_in21k, "):
        vitzoo.create("vit_b16.orig_in1k", pretrained=True)
    with pytest.raises(vitzoo.ConfigError, match=r"'vit_b32_r26_hybrid' has no pretrained weights.*Models with "
                                                 r"weights: vit_b16"):
        vitzoo.create("vit_b32_r26_hybrid", pretrained=True)
    with pytest.raises(vitzoo.ConfigError, match="pass pretrained=True"):
        vitzoo.create("vit_b16.orig_in21k@main")


# ------------------------------------------------------------------------------------------- loading
@pytest.mark.parametrize("name", TAGS)
def test_every_tag_loads_from_its_repo_with_the_peers_logits(server, name):
    tag = registered()[name]
    model = vitzoo.create(name, pretrained=True, **shrink(tag))
    assert model.pretrained_tag is tag
    cached = list(Path(constants.HF_HUB_CACHE).glob(f"models--{tag.hub_id.replace('/', '--')}/snapshots/*/*"))
    assert cached, f"{tag.hub_id} was not downloaded"
    config = model.config
    assert (config.img_size, config.num_classes) == ((tag.img_size,) * 2, tag.num_classes)
    assert (config.mean, config.std, config.crop_pct, config.interpolation) == \
        (tag.mean, tag.std, tag.crop_pct, tag.interpolation)
    # the weights' own class names, else the tag's label set (none for ImageNet-21k's 21,843 classes)
    labels = google_labels() if tag.format == "transformers" else imagenet_1k() if tag.labels == "imagenet-1k" else None
    assert model.labels == labels
    x = image_input(tag)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), peer_logits(tag, peer(tag), x), atol=1e-4, rtol=0)


def test_pretrained_true_loads_the_default_tag_and_a_revision_the_repo_had(server, tmp_path):
    tag = registered()["vit_b16.orig_in21k_ft_in1k"]
    api = HfApi(endpoint=server.url, token=TOKEN)
    current = api.model_info(tag.hub_id).sha
    newer = upload_tag(api, tag, tmp_path / "newer", seed=1)
    x = image_input(tag)
    try:
        model = vitzoo.create("vit_b16", pretrained=True, **SMALL)
        assert model.pretrained_tag is tag
        with torch.no_grad():
            torch.testing.assert_close(model(x), peer_logits(tag, peer(tag, seed=1), x), atol=1e-4, rtol=0)
            old = vitzoo.create(f"vit_b16.orig_in21k_ft_in1k@{current}", pretrained=True, **SMALL)
            torch.testing.assert_close(old(x), peer_logits(tag, peer(tag, seed=0), x), atol=1e-4, rtol=0)
        with pytest.raises(HubError, match=r"vit_b16.orig_in21k_ft_in1k: .*has no revision 'v9'"):
            vitzoo.create("vit_b16.orig_in21k_ft_in1k@v9", pretrained=True, **SMALL)
    finally:  # the module's other tests expect the first weights at main
        upload_tag(api, tag, tmp_path / "again", seed=0)
    assert newer != current


def test_offline_loads_from_the_filled_cache_and_fails_clearly_without_it(server, monkeypatch, tmp_path):
    tag = registered()["vit_b32.orig_in21k_ft_in1k"]
    online = vitzoo.create(tag.name, pretrained=True, **SMALL)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = vitzoo.create(tag.name, pretrained=True, **SMALL)
    x = image_input(tag)
    with torch.no_grad():
        assert torch.equal(online(x), offline(x))
    with pytest.raises(HubError) as err:
        vitzoo.create("vit_l16", pretrained=True, **SMALL)  # never downloaded
    message = str(err.value)
    assert "google/vit-large-patch16-384" in message and "HF_HUB_OFFLINE=1" in message
    assert "vitzoo pull google/vit-large-patch16-384" in message and "pretrained=PATH" in message


def test_without_a_network_the_error_names_the_repo_and_how_to_work_offline(server, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    with pytest.raises(HubError) as err:
        vitzoo.create("vit_b16.orig_in21k", pretrained=True, **SMALL)
    message = str(err.value)
    assert "timm/vit_base_patch16_224.orig_in21k" in message and "cannot reach the Hub" in message
    assert "HF_HUB_OFFLINE=1" in message and "pretrained=PATH" in message


def test_a_repo_holding_another_format_than_its_tag_says_is_refused(server, tmp_path):
    tag = registered()["vit_l32.orig_in21k_ft_in1k"]  # timm's
    api = HfApi(endpoint=server.url, token=TOKEN)
    google_files(tag, transformers_peer(tag), tmp_path / "hf")  # a google port where timm's was
    api.create_repo("alice/moved", exist_ok=True)
    api.upload_folder(repo_id="alice/moved", folder_path=tmp_path / "hf")
    moved = PretrainedTag(**{**tag.__dict__, "hub_id": "alice/moved"})
    from vitzoo.pretrained import resolve_tag

    with pytest.raises(vitzoo.CheckpointError, match="holds transformers weights, not the timm weights"):
        resolve_tag(moved, vitzoo.get_config("vit_l32", **moved.config_options(), **SMALL), {}).build()


# ------------------------------------------------------------------------------------------- preprocessing
def test_transforms_for_resize_crop_and_normalise_as_the_weights_expect():
    config = vitzoo.create("vit_b16.orig_in21k_ft_in1k_224", device="meta").config  # crop 0.9, bicubic
    transform = vitzoo.transforms_for(config)
    resize = next(t for t in transform.transforms if type(t).__name__ == "Resize")
    assert resize.size == [248] and resize.interpolation.value == "bicubic"  # floor(224 / 0.9)
    white = torch.full((3, 300, 400), 255, dtype=torch.uint8)
    out = transform(white)
    assert out.shape == (3, 224, 224) and out.dtype == torch.float32
    torch.testing.assert_close(out, torch.ones(3, 224, 224))  # (1 - 0.5) / 0.5
    imagenet = vitzoo.get_config("vit_b16", mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), img_size=(64, 96))
    out = vitzoo.transforms_for(imagenet)(torch.zeros(3, 50, 70, dtype=torch.uint8))
    assert out.shape == (3, 64, 96)
    torch.testing.assert_close(out[:, 0, 0], -torch.tensor([0.485, 0.456, 0.406]) / torch.tensor([0.229, 0.224, 0.225]))


# ------------------------------------------------------------------------------------------- plugins and predict
class TinyZooPlugin:
    """A plugin's own model and tags: a tiny ViT with a labelled head, and its features-only sibling."""

    @vitzoo.hookimpl
    def vitzoo_models(self):
        return {"tiny_vit": vitzoo.ViTConfig(embed_dim=32, depth=1, num_heads=2, mlp_dim=64, patch_size=16)}

    @vitzoo.hookimpl
    def vitzoo_pretrained_tags(self):
        tags = (PretrainedTag("tiny_vit", "in1k", "alice/tiny_vit.in1k", "timm", img_size=64, num_classes=1000,
                              crop_pct=0.875, labels="imagenet-1k", default=True),
                PretrainedTag("tiny_vit", "in21k", "alice/tiny_vit.in21k", "timm", img_size=64, num_classes=0))
        return {tag.name: tag for tag in tags}


class ClashingPlugin:
    @vitzoo.hookimpl
    def vitzoo_pretrained_tags(self):
        from vitzoo.zoo import PRETRAINED

        return {tag.name: tag for tag in PRETRAINED if tag.name == "vit_b16.orig_in21k"}


def upload_tiny(server, tmp_path) -> torch.nn.Module:
    """alice/tiny_vit.in1k and .in21k in timm's layout; returns the in1k weights' timm model."""
    api = HfApi(endpoint=server.url, token=TOKEN)
    models = {}
    for name, classes in (("in1k", 1000), ("in21k", 0)):
        reference = randomize(timm.create_model("vit_base_patch16_224", pretrained=False, img_size=64, embed_dim=32,
                                                depth=1, num_heads=2, mlp_ratio=2.0, num_classes=classes))
        folder = tmp_path / name
        folder.mkdir()
        save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps({"architecture": "vit_base_patch16_224", "num_classes": classes,
                                                        "pretrained_cfg": {"input_size": [3, 64, 64]}}))
        api.create_repo(f"alice/tiny_vit.{name}", exist_ok=True)
        api.upload_folder(repo_id=f"alice/tiny_vit.{name}", folder_path=folder)
        models[name] = reference
    return models["in1k"]


def test_a_plugin_adds_tags_listed_and_loaded_like_the_builtins(server, plugin, tmp_path, capsys):
    plugin(TinyZooPlugin())
    assert vitzoo.list_pretrained("tiny_vit*") == ["tiny_vit.in1k", "tiny_vit.in21k"]
    assert main(["list", "--pretrained", "tiny*"]) == 0
    assert re.search(r"tiny_vit.in1k\s+\* hf-hub:alice/tiny_vit.in1k \(timm, 64 px, 1000 classes\)", capsys.readouterr().out)
    reference = upload_tiny(server, tmp_path)
    model = vitzoo.create("tiny_vit", pretrained=True)
    assert model.pretrained_tag.name == "tiny_vit.in1k" and model.config.crop_pct == 0.875
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), atol=1e-4, rtol=0)


def test_a_tag_registered_twice_is_an_error_naming_both_plugins(plugin):
    plugin(ClashingPlugin())
    with pytest.raises(PluginError, match=r"'vit_b16.orig_in21k' is registered twice: by plugin 'vitzoo.builtins' "
                                          r"and by plugin 'ClashingPlugin'"):
        vitzoo.list_pretrained()


def write_png(path: Path) -> Path:
    from PIL import Image

    image = torch.zeros(80, 100, 3, dtype=torch.uint8)
    image[..., 0] = torch.arange(100, dtype=torch.uint8)  # not flat: the prediction depends on the pixels
    Image.fromarray(image.numpy()).save(path)
    return path


def test_predict_prints_the_top_labels_of_an_image_file(server, plugin, tmp_path, capsys):
    plugin(TinyZooPlugin())
    reference = upload_tiny(server, tmp_path)
    png = write_png(tmp_path / "cat.png")
    assert main(["predict", str(png), "--model", "tiny_vit.in1k", "--top", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == "tiny_vit.in1k"
    (prediction,) = result["predictions"]
    # the expected classes: timm's model on the image preprocessed as the tag says
    from PIL import Image

    x = vitzoo.transforms_for(vitzoo.create("tiny_vit.in1k", device="meta"))(Image.open(png).convert("RGB"))
    with torch.no_grad():
        probabilities = reference(x[None]).softmax(-1)[0]
    top = probabilities.topk(3)
    assert [item["index"] for item in prediction["top"]] == top.indices.tolist()
    assert [item["label"] for item in prediction["top"]] == [imagenet_1k()[i] for i in top.indices.tolist()]
    assert [item["probability"] for item in prediction["top"]] == pytest.approx(top.values.tolist(), abs=1e-5)
    assert main(["predict", str(png), "--model", "tiny_vit"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{png}:" and len(lines) == 6 and imagenet_1k()[top.indices[0]] in lines[1]


def test_predict_refuses_an_unreadable_image_and_a_head_without_labels(server, plugin, tmp_path, capsys):
    plugin(TinyZooPlugin())
    upload_tiny(server, tmp_path)
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    assert main(["predict", str(text), "--model", "tiny_vit.in1k"]) == 2
    assert f"cannot read image '{text}'" in capsys.readouterr().err
    png = write_png(tmp_path / "cat.png")
    assert main(["predict", str(png), "--model", "tiny_vit.in21k"]) == 2
    err = capsys.readouterr().err
    assert "tiny_vit.in21k has no classifier" in err and "tiny_vit.in1k" in err


# ------------------------------------------------------------------------------------------- the docs' table
def test_the_documented_table_is_the_registry_s():
    page = (Path(__file__).parents[1] / "docs" / "pretrained.md").read_text()
    start, end = "<!-- pretrained-table: vitzoo list --pretrained --markdown -->\n", "<!-- /pretrained-table -->"
    assert start in page and end in page, "docs/pretrained.md lost the markers around its table"
    table = page.split(start, 1)[1].split(end, 1)[0]
    assert table == markdown_table(), "regenerate the table in docs/pretrained.md: vitzoo list --pretrained --markdown"


# ------------------------------------------------------------------------------------------- fine-tuning
FINE_TUNED = "vit_s16.augreg_in21k_ft_in1k"


def image_folder(root: Path, classes: int = 3, per_class: int = 6) -> Path:
    """An ImageFolder of a user's own: train/ and val/, `classes` classes of small PNGs."""
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    for split, count in (("train", per_class), ("val", 2)):
        for c in range(classes):
            folder = root / split / f"class_{c}"
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = (torch.rand(40, 48, 3, generator=generator) * 80 + 60 * c).to(torch.uint8).numpy()
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


@pytest.mark.slow
@pytest.mark.parametrize("source", [FINE_TUNED, f"hf-hub:{registered()[FINE_TUNED].hub_id}"])
def test_fine_tuning_released_weights_on_an_image_folder_is_one_command(server, tmp_path, source):
    import subprocess
    import sys

    data = image_folder(tmp_path / "pets")
    shrunk = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]  # the test Hub's weights are shrunk so
    result = subprocess.run([sys.executable, "-m", "vitzoo", "train", "--pretrained", source, "--data", str(data),
                             "--recipe", "paper-finetune", "--steps", "2", "--batch-size", "6", "--device", "cpu",
                             "--out", str(tmp_path / "run"), "--quiet", "--no-tensorboard", *shrunk],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["model_config"]["num_classes"] == 3  # a new head, the folder's
    tuned = vitzoo.from_pretrained(tmp_path / "run")
    released = vitzoo.create(FINE_TUNED, pretrained=True, **SMALL)
    # the weights' own preprocessing stays (mean, std, crop), and the encoder starts from them: two SGD
    # steps move it by little
    assert (tuned.config.mean, tuned.config.crop_pct) == (released.config.mean, released.config.crop_pct) == ((0.5,) * 3, 0.9)
    moved = (tuned.state_dict()["stem.proj.weight"] - released.state_dict()["stem.proj.weight"]).abs().max()
    assert 0 < moved < 0.05


def test_a_hub_repo_is_a_name_as_in_timm_and_keeps_its_preprocessing(server):
    tag = registered()[FINE_TUNED]
    x = image_input(tag)
    by_repo = vitzoo.create(f"hf-hub:{tag.hub_id}", pretrained=True, **SMALL)
    by_tag = vitzoo.create(FINE_TUNED, pretrained=True, **SMALL)
    with torch.no_grad():
        torch.testing.assert_close(by_repo.eval()(x), by_tag.eval()(x), atol=0, rtol=0)
    # weights from the repo under a model name: the repo's crop (0.9), not the model's default (1.0)
    named = vitzoo.create("vit_s16", pretrained=f"hf-hub:{tag.hub_id}", **SMALL)
    assert named.config.crop_pct == by_repo.config.crop_pct == 0.9 and vitzoo.get_config("vit_s16").crop_pct == 1.0
    architecture = vitzoo.create(f"hf-hub:{tag.hub_id}", **SMALL)  # no weights: the repo's architecture
    assert architecture.config == by_repo.config
