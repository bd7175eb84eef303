"""Issue 33's faults in loading weights: nothing is guessed silently (the number of heads, what a bare
state dict leaves unsaid, a tag's classes and resolution), nothing absurd is built from a saved
config, and a head without class names is refused before anything is downloaded."""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
import warnings

import pytest
import torch
from safetensors.torch import save_file

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import CheckpointError

# a torchvision ViT of 4 heads, D=64 (not one of the paper's widths), at 32 px
TV = dict(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=7)


def realistic(module: torch.nn.Module, std: float = 0.3, seed: int = 0) -> torch.nn.Module:
    """Every parameter drawn at the scale of trained weights (std 0.3; norms' scales around 1): with small
    weights (std 0.02) the attention is nearly uniform and a wrong head count hardly shows in the logits."""
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


# ---------------------------------------------------------------------------- 3. the number of heads
def test_a_head_count_the_weights_do_not_store_is_asked_for_not_guessed(torchvision_4_heads, tmp_path, capsys):
    """torchvision's 4-head ViT had converted as 1 head without a word (D=64: the rule D/64 gave 1)."""
    reference, path = torchvision_4_heads
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with pytest.raises(CheckpointError, match=r"torchvision weights do not store their number of attention heads.*"
                                              r"num_heads=N \(vitzoo convert --num-heads N\).*1, 2, 4, 8"):
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

    reference = realistic(torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=1, num_heads=3,
                                                               hidden_dim=192, mlp_dim=768, num_classes=5))
    torch.save(reference.state_dict(), tmp_path / "ti.pth")
    with pytest.warns(UserWarning, match=r"num_heads=3 is assumed, as ViT-Ti has \(D=192, MLP size 768\).*--num-heads"):
        model = vitzoo.from_pretrained(tmp_path / "ti.pth")
    assert logits_gap(model, reference, torch.randn(2, 3, 32, 32)) < 1e-3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # given: nothing is assumed, nothing said
        assert vitzoo.from_pretrained(tmp_path / "ti.pth", num_heads=3).config.num_heads == 3


def test_a_timm_repo_config_states_its_head_count(tmp_path):
    """timm's config.json states the heads: its model_args, else the size its architecture names."""
    import timm

    reference = realistic(timm.create_model("vit_tiny_patch16_224", depth=1, num_heads=4, img_size=32, num_classes=3))
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(tmp_path / "model.safetensors"))
    document = {"architecture": "vit_tiny_patch16_224", "num_classes": 3, "model_args": {"num_heads": 4}}
    (tmp_path / "config.json").write_text(json.dumps(document))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = vitzoo.from_pretrained(tmp_path)
    assert model.config.num_heads == 4 and logits_gap(model, reference, torch.randn(2, 3, 32, 32)) < 1e-3
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224", "num_classes": 3}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the architecture's size states 3: nothing assumed
        assert vitzoo.from_pretrained(tmp_path).config.num_heads == 3
    # a size whose width is not the weights' states nothing: the count is assumed from the widths, and said
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "vit_small_patch16_224", "num_classes": 3}))
    with pytest.warns(UserWarning, match="num_heads=3 is assumed"):
        assert vitzoo.from_pretrained(tmp_path).config.num_heads == 3


def test_a_bare_vitzoo_state_dict_says_what_it_assumes_and_a_relative_table_gives_the_heads(tmp_path):
    """A model.safetensors without config.json: the names give the position embedding (a relative table
    of shape (offsets, heads, head_dim) gives the heads too); numerics are assumed, and said."""
    tiny = dict(embed_dim=64, depth=2, num_heads=4, mlp_dim=128, img_size=32, patch_size=8, num_classes=3)
    relative = realistic(vitzoo.create("vit_ti16", **tiny, pos_embed="relative", act="gelu_tanh"))
    save_file(relative.state_dict(), str(tmp_path / "relative.safetensors"))
    with pytest.warns(UserWarning, match=r"bare vitzoo state dict.*do not say act, norm_eps; assumed: act='gelu', "
                                         r"norm_eps=1e-06"):
        vitzoo.from_pretrained(tmp_path / "relative.safetensors")
    with pytest.warns(UserWarning, match=r"do not say norm_eps; assumed: norm_eps=1e-06\. A wrong one"):
        model = vitzoo.from_pretrained(tmp_path / "relative.safetensors", act="gelu_tanh")
    assert (model.config.pos_embed, model.config.num_heads) == ("relative", 4)
    assert logits_gap(model, relative, torch.randn(2, 3, 32, 32)) < 1e-3

    sincos = realistic(vitzoo.create("vit_ti16", **tiny, pos_embed="sincos_2d"))
    save_file(sincos.state_dict(), str(tmp_path / "sincos.safetensors"))
    with pytest.warns(UserWarning, match=r"pos_embed='none'.*img_size=\(224, 224\)"):  # none, or a parameter-free one
        vitzoo.from_pretrained(tmp_path / "sincos.safetensors", num_heads=4)
    model = vitzoo.from_pretrained(tmp_path / "sincos.safetensors", num_heads=4, pos_embed="sincos_2d", img_size=32)
    assert logits_gap(model, sincos, torch.randn(2, 3, 32, 32)) < 1e-3


# ---------------------------------------------------------------------------- 4. an absurd saved config
@pytest.fixture
def saved(tmp_path):
    model = vitzoo.create("vit_ti16", embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=32, patch_size=8,
                          num_classes=3)
    model.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def edit_config(directory, **changes):
    path = directory / "config.json"
    document = json.loads(path.read_text())
    document["model"].update(changes)
    path.write_text(json.dumps(document))


@pytest.mark.parametrize("changes", [dict(depth=1_000_000), dict(embed_dim=10**9), dict(mlp_dim=10**12),
                                     dict(depth=100_000)])
def test_a_saved_config_is_compared_with_its_weights_before_a_model_is_built(saved, changes, capsys):
    """A million blocks had been built while memory grew; widths of 1e9 failed in torch's allocator.
    Refused in well under a second, naming config.json, by from_pretrained, eval and push alike."""
    edit_config(saved, **changes)
    option = next(iter(changes))
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=rf"config\.json (describes a model of at least .* more than this "
                                              rf"machine's|does not describe the weights .*{option}=)"):
        vitzoo.from_pretrained(saved)
    assert time.perf_counter() - start < 5
    assert main(["eval", str(saved), "--data", "synthetic"]) == 2
    assert main(["push", str(saved), "alice/tiny"]) == 2
    errors = capsys.readouterr().err
    assert errors.count("config.json") >= 2 and "Traceback" not in errors


def test_a_width_beyond_memory_is_refused_from_the_config_alone(saved):
    """The bound is counted from the options (no allocation): a model far beyond memory is refused before
    its weights are read at all."""
    from vitzoo.checkpoints.native import check_size, parameter_floor, read_config

    config = read_config(saved / "config.json")
    assert parameter_floor(config) <= vitzoo.count_params(vitzoo.from_pretrained(saved))
    with pytest.raises(CheckpointError, match=r"config\.json describes a model of at least 8e\+18 parameters"):
        check_size(config.replace(embed_dim=10**9), f"{saved / 'config.json'} describes", "fix it")


def test_a_foreign_config_json_s_absurd_image_size_is_refused_before_allocating(tmp_path):
    """transformers' config.json gives the image size: 1e6 px had failed in torch's allocator (2 TB of
    position embeddings) instead of naming what is wrong."""
    import transformers

    hf = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                image_size=32, patch_size=8, num_labels=3)
    transformers.ViTForImageClassification(hf).save_pretrained(tmp_path)
    document = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**document, "image_size": 10**6}))
    with pytest.raises(CheckpointError, match=r"img_size=\(1000000, 1000000\)\), more than this machine's .* "
                                              r"check the options given and the files' metadata \(config\.json\)"):
        vitzoo.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------- 6. a tag with a local copy
SMALL = dict(depth=1)  # the tag's ViT-Ti, one block: what is checked is the head and the resolution


def warnings_logged(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


@pytest.fixture(scope="module")
def ti_copies(tmp_path_factory):
    """Local copies of ViT-Ti weights (one block, a 1000-class head, 224 px, no class names of their own):
    the tag's Hub files (timm's names) and a save_pretrained directory."""
    import timm

    root = tmp_path_factory.mktemp("copies")
    weights = timm.create_model("vit_tiny_patch16_224", depth=1, num_classes=1000).state_dict()
    save_file({k: v.contiguous() for k, v in weights.items()}, str(root / "model.safetensors"))
    vitzoo.create("vit_ti16", **SMALL, num_classes=1000, img_size=224).save_pretrained(root / "saved")
    return root


@pytest.mark.parametrize("copy", ["model.safetensors", "saved"])
def test_a_tag_with_a_local_copy_keeps_its_class_names(ti_copies, copy, caplog):
    """create(TAG, pretrained=PATH), the offline route the Hub error recommends, had dropped the tag's
    class names and the tag itself."""
    from vitzoo.labels import LABEL_SETS

    model = vitzoo.create("vit_ti16.augreg_in21k_ft_in1k", pretrained=ti_copies / copy, **SMALL)
    assert model.pretrained_tag.name == "vit_ti16.augreg_in21k_ft_in1k"
    assert model.labels == LABEL_SETS["imagenet-1k"]()
    assert warnings_logged(caplog) == ""  # the copy is the tag's: nothing to say


@pytest.mark.parametrize("copy", ["model.safetensors", "saved"])
def test_a_local_copy_of_another_head_or_resolution_is_said_at_the_default_level(ti_copies, copy, caplog):
    """A 1000-class file under the 21,843-class tag had loaded as 1000 classes without a word, and 224-px
    weights under a 384 tag were resampled with a logging.info line (a saved model kept its 224 px in
    silence): each is a warning now."""
    model = vitzoo.create("vit_ti16.augreg_in21k", pretrained=ti_copies / copy, **SMALL)
    assert model.config.num_classes == 1000 and model.labels is None
    assert re.search(r"have a head of 1000 classes, not the 21843 of vit_ti16\.augreg_in21k.*num_classes=21843",
                     warnings_logged(caplog))
    caplog.clear()
    model = vitzoo.create("vit_ti16.augreg_in21k_ft_in1k_384", pretrained=ti_copies / copy, **SMALL)
    assert model.labels is not None  # 1000 classes: the tag's names
    said = warnings_logged(caplog)
    if copy == "saved":
        assert model.config.img_size == (224, 224)
        assert re.search(r"is at 224x224 px, not the 384 px of vit_ti16\.augreg_in21k_ft_in1k_384.*img_size=384", said)
    else:
        assert model.config.img_size == (384, 384)
        assert re.search(r"trained at 224x224 px and the model is configured for 384x384 px: position embeddings "
                         r"resampled from grid \(14, 14\) to \(24, 24\); pass img_size=224", said)
    caplog.clear()
    vitzoo.create("vit_ti16.augreg_in21k_ft_in1k_384", pretrained=ti_copies / copy, img_size=320, **SMALL)
    assert warnings_logged(caplog) == ""  # a resolution asked for is no surprise


# ---------------------------------------------------------------------------- 7. predict refuses from the tag
def test_predict_refuses_a_head_without_class_names_before_downloading(hub_server, tmp_path, monkeypatch, capsys):
    """`vitzoo predict --model vit_ti16.augreg_in21k` had downloaded the repo (38 MB; ~350 MB for B/16)
    before refusing its 21,843 unnamed classes: refused from the tag, as orig_in21k's missing head is."""
    from PIL import Image
    from huggingface_hub import HfApi

    from hub_testing import TOKEN
    from vitzoo.catalog import registered
    from vitzoo.checkpoints import hub

    tag = registered()["vit_ti16.augreg_in21k"]
    api = HfApi(endpoint=hub_server.url, token=TOKEN)
    api.create_repo(tag.hub_id)
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224"}))
    api.upload_folder(folder_path=tmp_path / "repo", repo_id=tag.hub_id)
    downloads = []
    real = hub.download
    monkeypatch.setattr(hub, "download", lambda *a, **k: downloads.append(a) or real(*a, **k))
    Image.new("RGB", (32, 32)).save(tmp_path / "cat.png")
    assert main(["predict", str(tmp_path / "cat.png"), "--model", "vit_ti16.augreg_in21k"]) == 2
    assert downloads == [] and not list((tmp_path / "hf_home" / "hub").glob("models--timm--*"))  # the cache too
    err = capsys.readouterr().err
    assert "vit_ti16.augreg_in21k has a head of 21843 classes without names" in err
    assert "vit_ti16.augreg_in21k_ft_in1k" in err  # a tag that names its classes
