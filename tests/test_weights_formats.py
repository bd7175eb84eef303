"""Foreign weights (timm, torchvision, transformers), from a file, a directory or memory, give the
reference library's logits; a plugin adds a format. The references are built with random init (no
download) and every parameter randomised, so that zero-initialised heads cannot hide a mapping."""

from __future__ import annotations

import json

import pytest
import timm
import torch
import torchvision
import transformers
from safetensors.torch import save_file

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import CheckpointError
from vitzoo.weights import ConvertedWeights, WeightFormat
from vitzoo.weights.layout import square_side


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():  # norms' scales around 1, the rest around 0
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(noise * 0.1 + float(name.endswith("weight")) if p.ndim == 1 else noise * 0.02)
    return module.eval()


def saved(state_dict: dict, path):
    save_file({k: v.contiguous().clone() for k, v in state_dict.items()}, str(path))
    return path


def same_logits(ours, theirs, size: int = 32, take=lambda out: out) -> None:
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(x), take(theirs(x)), atol=1e-4, rtol=0)


def test_timm_vit_b16_from_safetensors(tmp_path):
    reference = randomize(timm.create_model("vit_base_patch16_224", depth=1, img_size=32))
    with pytest.warns(UserWarning, match="num_heads=12 is assumed, as ViT-B has"):
        model = vitzoo.from_pretrained(saved(reference.state_dict(), tmp_path / "b16.safetensors"))
    c = model.config
    assert (c.embed_dim, c.num_heads, c.mlp_dim, c.patch_size, c.act, c.norm_eps, c.img_size) == \
        (768, 12, 3072, 16, "gelu", 1e-6, (32, 32))
    same_logits(model, reference)


def test_timm_average_pooling_without_class_token_from_pth(tmp_path):
    reference = randomize(timm.create_model("vit_small_patch16_224", global_pool="avg",
                                            class_token=False, depth=1, img_size=32))
    torch.save(reference.state_dict(), tmp_path / "s16.pth")
    model = vitzoo.from_pretrained(tmp_path / "s16.pth", num_heads=6)
    assert model.config.pool == "gap" and model.config.fc_norm and model.cls_token is None
    same_logits(model, reference)


def test_timm_hybrid_brings_timms_resnet_numerics(tmp_path):
    reference = randomize(timm.create_model("vit_base_r50_s16_224", depth=1, img_size=64,
                                            num_classes=10))
    model = vitzoo.from_pretrained(saved(reference.state_dict(), tmp_path / "r50.safetensors"),
                                   num_heads=12)
    assert model.config.stem_options == {"layers": [3, 4, 9], "width": 1, "numerics": "timm"}
    assert model.config.patch_size == 1 and model.stem.backbone.gn_root.eps == 1e-5
    same_logits(model, reference, 64)


def test_torchvision_vit_b16_and_its_pre_logits_head(tmp_path):
    reference = randomize(torchvision.models.VisionTransformer(
        image_size=32, patch_size=16, num_layers=1, num_heads=12, hidden_dim=768, mlp_dim=3072))
    torch.save(reference.state_dict(), tmp_path / "b16.pth")
    model = vitzoo.from_pretrained(tmp_path / "b16.pth", num_heads=12)
    assert model.config.mean == pytest.approx((0.485, 0.456, 0.406))  # ImageNet's
    same_logits(model, reference)
    reference = randomize(torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
        num_classes=7, representation_size=48))
    model = vitzoo.from_pretrained(saved(reference.state_dict(), tmp_path / "tv.safetensors"),
                                   num_heads=4)
    assert model.config.head == "mlp" and model.config.head_options == {"representation_size": 48}
    same_logits(model, reference)


def hf_config(**changes):
    return transformers.ViTConfig(**{**dict(hidden_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, intermediate_size=128,
                                            image_size=32, patch_size=8, num_labels=6), **changes})


def test_transformers_directory_and_its_bare_state_dict_in_the_hubs_names(tmp_path):
    reference = randomize(transformers.ViTForImageClassification(hf_config()))
    reference.save_pretrained(tmp_path / "hf")
    model = vitzoo.from_pretrained(tmp_path / "hf")  # heads, eps, size from config.json
    c = model.config
    assert (c.num_heads, c.norm_eps, c.num_classes, c.img_size) == (4, 1e-12, 6, (32, 32))
    same_logits(model, reference, take=lambda out: out.logits)
    names = {"vit.layers.": "vit.encoder.layer.", "attention.o_proj": "attention.output.dense",
             "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense",
             **{f"attention.{c}_proj": f"attention.attention.{n}"
                for c, n in zip("qkv", ("query", "key", "value"))}}
    classic = {}
    for key, value in reference.state_dict().items():  # the Hub's checkpoints predate v5
        for new, old in names.items():
            key = key.replace(new, old)
        classic[key] = value
    model = vitzoo.from_pretrained(saved(classic, tmp_path / "hf.safetensors"), num_heads=4)
    assert model.config.norm_eps == 1e-12  # transformers' default, without config.json
    same_logits(model, reference, take=lambda out: out.logits)


def test_a_transformers_vit_model_pooler_is_the_pre_logits_layer(tmp_path):
    reference = randomize(transformers.ViTModel(hf_config()))
    reference.save_pretrained(tmp_path)
    model = vitzoo.from_pretrained(tmp_path)
    assert model.config.num_classes == 0 and model.config.head == "mlp"
    same_logits(model, reference, take=lambda out: out.pooler_output)


def test_weights_in_memory_load_as_their_file_would(tmp_path):
    reference = randomize(timm.create_model("vit_tiny_patch16_224", num_classes=10, depth=2,
                                            img_size=32))
    for source in (reference.state_dict(), reference):
        same_logits(vitzoo.from_pretrained(source, num_heads=3), reference)
    named = vitzoo.create("vit_ti16", pretrained=reference.state_dict(), depth=2, img_size=32,
                          num_classes=10)
    assert (named.config.act, named.config.norm_eps) == ("gelu", 1e-6)  # the weights' numerics
    same_logits(named, reference)
    ours = vitzoo.create("vit_ti16", depth=1, num_classes=3, img_size=32)
    again = vitzoo.from_pretrained(ours)  # a vitzoo model: its own config decides
    assert again.config == ours.config
    same_logits(again, ours)


def test_a_timm_repo_directory_brings_its_preprocessing_and_heads(tmp_path):
    reference = randomize(timm.create_model("vit_tiny_patch16_224", depth=1, num_heads=4,
                                            img_size=32, num_classes=4))
    saved(reference.state_dict(), tmp_path / "model.safetensors")
    cfg = {"input_size": [3, 32, 32], "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    (tmp_path / "config.json").write_text(json.dumps({
        "architecture": "vit_tiny_patch16_224", "pretrained_cfg": cfg, "model_args": {
            "num_heads": 4}}))
    model = vitzoo.from_pretrained(tmp_path)
    assert model.config.mean == pytest.approx(cfg["mean"]) and model.config.num_heads == 4
    same_logits(model, reference)


def test_convert_writes_a_vitzoo_directory(tmp_path, capsys):
    reference = randomize(timm.create_model("vit_tiny_patch16_224", depth=2, img_size=32,
                                            num_classes=4))
    path = saved(reference.state_dict(), tmp_path / "tiny.safetensors")
    assert main(["convert", str(path), str(tmp_path / "out")]) == 0
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"config.json", "model.safetensors",
                                                             "README.md"}
    same_logits(vitzoo.from_pretrained(tmp_path / "out"), reference)
    assert main(["convert", str(path), str(tmp_path / "bad"), "--model", "vit_b16"]) == 2
    assert "do not fit" in capsys.readouterr().err


class BackboneFormat(WeightFormat):
    """A plugin's format: vitzoo's names under a framework's `backbone.` prefix, trained on
    images normalised to [-1, 1], which the weights cannot say."""

    name = "backbone"

    def recognises(self, keys, metadata):
        return bool(keys) and all(k.startswith("backbone.") for k in keys)

    def convert(self, state_dict, metadata):
        weights = {k.removeprefix("backbone."): v for k, v in state_dict.items()}
        side = square_side(weights["encoder.pos_embed.weight"].shape[1] - 1)
        return ConvertedWeights(self.name, weights, grid=(side, side))

    def hints(self, metadata):
        return {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}


def formats(**table):
    class Plugin:
        @vitzoo.hookimpl
        def vitzoo_weight_formats(self):
            return table

    return Plugin()


def test_a_plugin_format_is_recognised_by_its_names_and_refused_without_it(tmp_path, plugin,
                                                                           tiny):
    model = vitzoo.create("vit_ti16", **tiny).eval()
    path = saved({f"backbone.{k}": v for k, v in model.state_dict().items()},
                 tmp_path / "w.safetensors")
    with pytest.raises(CheckpointError, match="not recognised"):
        vitzoo.from_pretrained(path)
    plugin(formats(backbone=BackboneFormat()))
    loaded = vitzoo.from_pretrained(path, num_heads=tiny["num_heads"])
    assert loaded.config.mean == (0.5, 0.5, 0.5)
    same_logits(loaded, model)


def test_two_formats_that_claim_the_same_weights_are_an_error(tmp_path, plugin, tiny):
    path = saved(vitzoo.create("vit_ti16", **tiny).state_dict(), tmp_path / "w.safetensors")
    greedy = BackboneFormat()
    greedy.recognises = lambda keys, metadata: "stem.proj.weight" in keys
    plugin(formats(backbone=greedy))
    with pytest.raises(CheckpointError, match="look like (vitzoo and like backbone|backbone "
                                              "and like vitzoo)"):
        vitzoo.from_pretrained(path)
