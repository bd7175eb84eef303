"""What weights do not say is asked for or said, never guessed in silence: the number of heads, the
numerics a bare state dict leaves out, a local copy's head and resolution under a tag. Weights in
memory (a state dict or a module) load as a file of their format does."""

from __future__ import annotations

import json
import logging
import re
import warnings

import pytest
import torch
from hub_testing import tiny  # tests/hub_testing.py
from safetensors.torch import save_file

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import CheckpointError


TV = dict(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64,
          mlp_dim=128, num_classes=7)


def realistic(module: torch.nn.Module, std: float = 0.3, seed: int = 0) -> torch.nn.Module:
    """Every parameter drawn at the scale of trained weights (std 0.3; norms' scales around 1): with
    small weights (std 0.02) the attention is nearly uniform and a wrong head count hardly shows in
    the logits."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            scale = 1.0 if p.ndim == 1 and name.endswith("weight") and "norm" in name.replace("ln", "norm") else 0.0
            p.copy_(torch.randn(p.shape, generator=generator) * std + scale)
    return module.eval()


@pytest.fixture(scope="module")
def torchvision_4_heads(tmp_path_factory):
    import torchvision

    reference = realistic(torchvision.models.VisionTransformer(**TV))
    path = tmp_path_factory.mktemp("tv") / "tv4.pth"
    torch.save(reference.state_dict(), path)
    return reference, path


def logits_gap(model, reference, x) -> float:
    with torch.no_grad():
        return float((model.eval()(x) - reference(x)).abs().max())


def test_a_head_count_the_weights_do_not_store_is_asked_for_not_guessed(
        torchvision_4_heads, tmp_path, capsys):
    """torchvision's 4-head ViT of D=64 does not store its heads (D/64 would give 1): asked for."""
    reference, path = torchvision_4_heads
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with pytest.raises(CheckpointError,
                       match=r"torchvision weights do not store their number of attention heads.*"
                                              r"num_heads=N \(vitzoo convert --num-heads N\).*1, "
                                              r"2, 4, 8"):
        vitzoo.from_pretrained(path)
    assert main(["convert", str(path), str(tmp_path / "refused")]) == 2
    assert "--num-heads" in capsys.readouterr().err and not (tmp_path / "refused").exists()
    # the count matters at this scale: 1 head is visibly another function
    assert logits_gap(vitzoo.from_pretrained(path, num_heads=1), reference, x) > 0.05
    assert main(["convert", str(path), str(tmp_path / "out"), "--num-heads", "4"]) == 0
    converted = vitzoo.from_pretrained(tmp_path / "out")
    assert converted.config.num_heads == 4
    assert logits_gap(converted, reference, x) < 1e-3


def test_weights_of_a_paper_width_take_its_head_count_and_say_so(tmp_path):
    import torchvision

    reference = realistic(torchvision.models.VisionTransformer(image_size=32, patch_size=16,
                                                               num_layers=1, num_heads=3,
                                                               hidden_dim=192,
                                                               mlp_dim=768, num_classes=5))
    torch.save(reference.state_dict(), tmp_path / "ti.pth")
    with pytest.warns(UserWarning,
                      match=r"num_heads=3 is assumed, as ViT-Ti has \(D=192, MLP size "
                            r"768\).*--num-heads"):
        model = vitzoo.from_pretrained(tmp_path / "ti.pth")
    assert logits_gap(model, reference, torch.randn(2, 3, 32, 32)) < 1e-3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # given: nothing is assumed, nothing said
        assert vitzoo.from_pretrained(tmp_path / "ti.pth", num_heads=3).config.num_heads == 3


def test_a_timm_repo_config_states_its_head_count(tmp_path):
    """timm's config.json states the heads: its model_args, else the size its architecture names."""
    import timm

    reference = realistic(timm.create_model("vit_tiny_patch16_224", depth=1, num_heads=4,
                                            img_size=32, num_classes=3))
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()},
              str(tmp_path / "model.safetensors"))
    document = {"architecture": "vit_tiny_patch16_224", "num_classes": 3,
                "model_args": {"num_heads": 4}}
    (tmp_path / "config.json").write_text(json.dumps(document))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = vitzoo.from_pretrained(tmp_path)
    assert model.config.num_heads == 4 and logits_gap(model, reference,
                                                      torch.randn(2, 3, 32, 32)) < 1e-3
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224", "num_classes": 3}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the architecture's size states 3: nothing assumed
        assert vitzoo.from_pretrained(tmp_path).config.num_heads == 3
    # a size whose width is not the weights' states nothing: the count is assumed from the widths, and said
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "vit_small_patch16_224", "num_classes": 3}))
    with pytest.warns(UserWarning, match="num_heads=3 is assumed"):
        assert vitzoo.from_pretrained(tmp_path).config.num_heads == 3


def test_a_bare_vitzoo_state_dict_says_what_it_assumes_and_a_relative_table_gives_the_heads(
        tmp_path):
    """A model.safetensors without config.json: the names give the position embedding (a relative
    table of shape (offsets, heads, head_dim) gives the heads too); numerics are assumed, and said.
    """
    tiny = dict(embed_dim=64, depth=2, num_heads=4, mlp_dim=128, img_size=32,
                patch_size=8, num_classes=3)
    relative = realistic(vitzoo.create("vit_ti16", **tiny, pos_embed="relative", act="gelu_tanh"))
    save_file(relative.state_dict(), str(tmp_path / "relative.safetensors"))
    with pytest.warns(UserWarning,
                      match=r"bare vitzoo state dict.*do not say act, norm_eps; assumed: "
                            r"act='gelu', "
                                         r"norm_eps=1e-06"):
        vitzoo.from_pretrained(tmp_path / "relative.safetensors")
    with pytest.warns(UserWarning,
                      match=r"do not say norm_eps; assumed: norm_eps=1e-06\. A wrong one"):
        model = vitzoo.from_pretrained(tmp_path / "relative.safetensors", act="gelu_tanh")
    assert (model.config.pos_embed, model.config.num_heads) == ("relative", 4)
    assert logits_gap(model, relative, torch.randn(2, 3, 32, 32)) < 1e-3

    sincos = realistic(vitzoo.create("vit_ti16", **tiny, pos_embed="sincos_2d"))
    save_file(sincos.state_dict(), str(tmp_path / "sincos.safetensors"))
    with pytest.warns(UserWarning,
                      # none, or a parameter-free one
                      match=r"pos_embed='none'.*img_size=\(224, 224\)"):
        vitzoo.from_pretrained(tmp_path / "sincos.safetensors", num_heads=4)
    model = vitzoo.from_pretrained(tmp_path / "sincos.safetensors", num_heads=4,
                                   pos_embed="sincos_2d", img_size=32)
    assert logits_gap(model, sincos, torch.randn(2, 3, 32, 32)) < 1e-3


def test_float64_and_half_weights_still_load(tmp_path):
    """Floating-point weights of another precision (float64, float16, bfloat16) are floats: they
    load, cast to the model's dtype."""
    model = tiny()
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        save_file({k: v.to(dtype) for k, v in model.state_dict().items()},
                  str(tmp_path / "w.safetensors"))
        loaded = vitzoo.from_pretrained(tmp_path / "w.safetensors", num_heads=2)
        assert all(v.dtype == torch.float32 for v in loaded.state_dict().values())


@pytest.fixture(scope="module")
def timm_vit():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10,
                             depth=2, img_size=32).eval()


def test_a_timm_state_dict_or_module_loads_in_memory(timm_vit):
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = timm_vit(x)
        for source in (timm_vit.state_dict(), timm_vit):
            model = vitzoo.from_pretrained(source, img_size=32).eval()
            assert (model(x) - expected).abs().max() < 1e-5
        tiny = vitzoo.create("vit_ti16", depth=1, num_classes=3, img_size=32).eval()
        again = vitzoo.from_pretrained(tiny).eval()  # a vitzoo model: its own config decides
        assert again.config == tiny.config and torch.equal(again(x), tiny(x))
        into_named = vitzoo.create("vit_ti16", pretrained=timm_vit.state_dict(), depth=2,
                                   num_classes=10, img_size=32).eval()
        assert (into_named(x) - expected).abs().max() < 1e-5


SMALL = dict(depth=1)  # the tag's ViT-Ti, one block: what is checked is the head and the resolution


def warnings_logged(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


@pytest.fixture(scope="module")
def ti_copies(tmp_path_factory):
    """Local copies of ViT-Ti weights (one block, a 1000-class head, 224 px, no class names of their
    own): the tag's Hub files (timm's names) and a save_pretrained directory."""
    import timm

    root = tmp_path_factory.mktemp("copies")
    weights = timm.create_model("vit_tiny_patch16_224", depth=1, num_classes=1000).state_dict()
    save_file({k: v.contiguous() for k, v in weights.items()}, str(root / "model.safetensors"))
    vitzoo.create("vit_ti16", **SMALL, num_classes=1000,
                  img_size=224).save_pretrained(root / "saved")
    return root


@pytest.mark.parametrize("copy", ["model.safetensors", "saved"])
def test_a_tag_with_a_local_copy_keeps_its_class_names(ti_copies, copy, caplog):
    """create(TAG, pretrained=PATH), the offline route the Hub error recommends, keeps the tag's
    class names and the tag itself."""
    from vitzoo.labels import LABEL_SETS

    model = vitzoo.create("vit_ti16.augreg_in21k_ft_in1k", pretrained=ti_copies / copy, **SMALL)
    assert model.pretrained_tag.name == "vit_ti16.augreg_in21k_ft_in1k"
    assert model.labels == LABEL_SETS["imagenet-1k"]()
    assert warnings_logged(caplog) == ""  # the copy is the tag's: nothing to say


@pytest.mark.parametrize("copy", ["model.safetensors", "saved"])
def test_a_local_copy_of_another_head_or_resolution_is_said_at_the_default_level(
        ti_copies, copy, caplog):
    """A 1000-class file under the 21,843-class tag, and 224-px weights under a 384 tag (resampled,
    or kept at 224 px by a saved model), are each said in a warning."""
    model = vitzoo.create("vit_ti16.augreg_in21k", pretrained=ti_copies / copy, **SMALL)
    assert model.config.num_classes == 1000 and model.labels is None
    assert re.search(r"have a head of 1000 classes, not the 21843 of "
                     r"vit_ti16\.augreg_in21k.*num_classes=21843",
                     warnings_logged(caplog))
    caplog.clear()
    model = vitzoo.create("vit_ti16.augreg_in21k_ft_in1k_384", pretrained=ti_copies / copy, **SMALL)
    assert model.labels is not None  # 1000 classes: the tag's names
    said = warnings_logged(caplog)
    if copy == "saved":
        assert model.config.img_size == (224, 224)
        assert re.search(r"is at 224x224 px, not the 384 px of "
                         r"vit_ti16\.augreg_in21k_ft_in1k_384.*img_size=384", said)
    else:
        assert model.config.img_size == (384, 384)
        assert re.search(r"trained at 224x224 px and the model is configured for 384x384 px: "
                         r"position embeddings "
                         r"resampled from grid \(14, 14\) to \(24, 24\); pass img_size=224", said)
    caplog.clear()
    vitzoo.create("vit_ti16.augreg_in21k_ft_in1k_384", pretrained=ti_copies / copy,
                  img_size=320, **SMALL)
    assert warnings_logged(caplog) == ""  # a resolution asked for is no surprise
