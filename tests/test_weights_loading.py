"""What weights do not say is asked for or said, never guessed in silence: the number of heads,
the numerics a bare state dict leaves out, a resampling nobody asked for."""

from __future__ import annotations

import json
import logging
import warnings

import pytest
import timm
import torch
import torchvision
from hub_testing import tiny  # tests/hub_testing.py
from safetensors.torch import save_file

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import CheckpointError
from vitzoo.zoo import imagenet_1k


def realistic(module: torch.nn.Module) -> torch.nn.Module:
    """Parameters at the scale of trained weights (std 0.3): with small ones the attention is
    nearly uniform and a wrong head count hardly shows in the logits."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in module.named_parameters():
            norm = p.ndim == 1 and name.endswith("weight") and "norm" in name.replace("ln", "norm")
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3 + float(norm))
    return module.eval()


def gap(model, reference) -> float:
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return float((model.eval()(x) - reference(x)).abs().max())


def test_a_head_count_the_weights_do_not_store_is_asked_for(tmp_path, capsys):
    """torchvision's 4-head ViT of D=64 stores no heads, and no paper model has its widths."""
    reference = realistic(torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128))
    torch.save(reference.state_dict(), tmp_path / "tv.pth")
    with pytest.raises(CheckpointError, match=r"do not store their number of attention heads.*"
                                              r"num_heads=N \(--num-heads N\)"):
        vitzoo.from_pretrained(tmp_path / "tv.pth")
    assert main(["convert", str(tmp_path / "tv.pth"), str(tmp_path / "no")]) == 2
    assert "--num-heads" in capsys.readouterr().err and not (tmp_path / "no").exists()
    assert gap(vitzoo.from_pretrained(tmp_path / "tv.pth", num_heads=1), reference) > 0.05
    assert main(["convert", str(tmp_path / "tv.pth"), str(tmp_path / "out"), "--num-heads",
                 "4"]) == 0
    assert gap(vitzoo.from_pretrained(tmp_path / "out"), reference) < 1e-3


def test_weights_of_a_paper_width_take_its_head_count_and_say_so(tmp_path):
    reference = realistic(torchvision.models.VisionTransformer(
        image_size=32, patch_size=16, num_layers=1, num_heads=3, hidden_dim=192, mlp_dim=768))
    torch.save(reference.state_dict(), tmp_path / "ti.pth")
    with pytest.warns(UserWarning, match=r"num_heads=3 is assumed, as ViT-Ti has \(D=192, MLP "
                                         r"size 768\).*--num-heads"):
        assert gap(vitzoo.from_pretrained(tmp_path / "ti.pth"), reference) < 1e-3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # given: nothing assumed, nothing said
        assert vitzoo.from_pretrained(tmp_path / "ti.pth", num_heads=3).config.num_heads == 3


def test_a_timm_repo_config_states_the_heads_by_its_architecture(tmp_path):
    reference = realistic(timm.create_model("vit_tiny_patch16_224", depth=1, img_size=32))
    save_file(reference.state_dict(), str(tmp_path / "model.safetensors"))
    for architecture, said in (("vit_tiny_patch16_224", False), ("vit_small_patch16_224", True)):
        (tmp_path / "config.json").write_text(json.dumps({"architecture": architecture}))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert vitzoo.from_pretrained(tmp_path).config.num_heads == 3
        assert any("is assumed" in str(w.message) for w in caught) == said


def test_a_bare_vitzoo_state_dict_says_what_it_assumes(tmp_path):
    """Names give the position embedding (a relative table its heads too); numerics are
    assumed, and said; a parameter-free embedding (sincos_2d) looks like none."""
    options = dict(embed_dim=64, depth=2, num_heads=4, mlp_dim=128, img_size=32, patch_size=8)
    relative = realistic(vitzoo.create("vit_ti16", **options, pos_embed="relative",
                                       act="gelu_tanh"))
    save_file(relative.state_dict(), str(tmp_path / "relative.safetensors"))
    with pytest.warns(UserWarning, match=r"bare vitzoo state dict.*do not say act, norm_eps; "
                                         r"assumed: act='gelu', norm_eps=1e-06"):
        vitzoo.from_pretrained(tmp_path / "relative.safetensors")
    with pytest.warns(UserWarning, match=r"do not say norm_eps; assumed: norm_eps=1e-06\."):
        model = vitzoo.from_pretrained(tmp_path / "relative.safetensors", act="gelu_tanh")
    assert (model.config.pos_embed, model.config.num_heads) == ("relative", 4)
    assert gap(model, relative) < 1e-3
    sincos = realistic(vitzoo.create("vit_ti16", **options, pos_embed="sincos_2d"))
    save_file(sincos.state_dict(), str(tmp_path / "sincos.safetensors"))
    with pytest.warns(UserWarning, match=r"pos_embed='none'.*img_size=\(224, 224\)"):
        vitzoo.from_pretrained(tmp_path / "sincos.safetensors", num_heads=4)
    model = vitzoo.from_pretrained(tmp_path / "sincos.safetensors", num_heads=4,
                                   pos_embed="sincos_2d", img_size=32)
    assert gap(model, sincos) < 1e-3


def test_float64_and_half_weights_load_as_the_models_floats(tmp_path):
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        save_file({k: v.to(dtype) for k, v in tiny().state_dict().items()},
                  str(tmp_path / "w.safetensors"))
        loaded = vitzoo.from_pretrained(tmp_path / "w.safetensors", num_heads=2)
        assert all(v.dtype == torch.float32 for v in loaded.state_dict().values())


@pytest.mark.parametrize("copy", ["model.safetensors", "saved"])
def test_a_local_copy_of_a_tag_keeps_its_class_names_and_says_a_resampling(tmp_path, copy,
                                                                          caplog):
    """create(TAG, pretrained=PATH), the offline route: the tag and its class names kept; weights
    at another resolution than the tag's resampled, said unless img_size asks for it."""
    save_file(timm.create_model("vit_tiny_patch16_224", depth=1).state_dict(),
              str(tmp_path / "model.safetensors"))
    vitzoo.create("vit_ti16", depth=1, num_classes=1000).save_pretrained(tmp_path / "saved")
    model = vitzoo.create("vit_ti16.augreg_in21k_ft_in1k", pretrained=tmp_path / copy, depth=1)
    assert model.pretrained_tag.name == "vit_ti16.augreg_in21k_ft_in1k"
    assert model.labels == imagenet_1k() and not caplog.records
    tag = "vit_ti16.augreg_in21k_ft_in1k_384"
    model = vitzoo.create(tag, pretrained=tmp_path / copy, depth=1)
    if copy == "saved":  # a saved model is itself: its own size
        assert model.config.img_size == (224, 224)
    else:
        assert model.config.img_size == (384, 384)
        assert "at (224, 224) px, the model at (384, 384) px: position embeddings resampled" \
            in caplog.text
    caplog.clear()
    vitzoo.create(tag, pretrained=tmp_path / copy, img_size=320, depth=1)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # asked for
