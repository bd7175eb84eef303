"""A vitzoo model answers what a timm user asks of a timm ViT, with timm's names and meaning:
intermediate features, the preprocessing timm's data helpers read, the classifier, the groups of
layer-wise learning-rate decay, and timm's names of the same options."""

import pytest
import timm
import timm.data
import torch
from timm.optim._param_groups import param_groups_layer_decay
from torchvision.transforms.v2.functional import to_pil_image

import vitzoo
from vitzoo.errors import ConfigError


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A timm ViT with random weights, and vitzoo holding them (read by its converter)."""
    torch.manual_seed(0)
    peer = timm.create_model("vit_tiny_patch16_224", img_size=64, depth=3, num_classes=7).eval()
    with torch.no_grad():
        for p in peer.parameters():
            p.normal_(0, 0.05)
    torch.save(peer.state_dict(), path := tmp_path_factory.mktemp("timm") / "peer.pth")
    return peer, vitzoo.create("vit_ti16", pretrained=path, img_size=64, depth=3).eval()


@pytest.mark.parametrize("options", [
    {}, {"indices": 2}, {"indices": [0, -1], "norm": True},
    {"indices": [1], "output_fmt": "NLC", "return_prefix_tokens": True},
    {"indices": 1, "stop_early": True}, {"indices": [0, 2], "intermediates_only": True},
])
def test_forward_intermediates_are_timm_s(pair, options):
    peer, model = pair
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        theirs, ours = peer.forward_intermediates(x, **options), model.forward_intermediates(
            x, **options)
    if not options.get("intermediates_only"):
        torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=0)  # the final tokens
        theirs, ours = theirs[1], ours[1]
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        for mine, timms in zip(a, b) if isinstance(a, tuple) else [(a, b)]:
            torch.testing.assert_close(mine, timms, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="blocks 0 to 2"):
        model.forward_intermediates(x, indices=[3])
    with pytest.raises(ValueError, match="output_fmt"):
        model.forward_intermediates(x, output_fmt="NHWC")


def test_timm_s_data_helpers_read_a_tag_s_preprocessing():
    model = vitzoo.create("vit_s16.augreg_in21k_ft_in1k")  # the tag's architecture, preprocessing
    config = timm.data.resolve_data_config({}, model=model)
    assert config["input_size"] == (3, 224, 224) and config["crop_pct"] == 0.9
    assert config["mean"] == config["std"] == (0.5, 0.5, 0.5)
    assert config["interpolation"] == "bicubic"
    image = to_pil_image(torch.randint(0, 256, (3, 300, 280), dtype=torch.uint8))
    theirs = timm.data.create_transform(**config)(image)
    torch.testing.assert_close(vitzoo.transforms_for(model)(image), theirs, atol=1e-6, rtol=0)


def test_the_classifier_features_and_layer_decay_groups(pair):
    peer, model = pair
    assert model.num_features == model.embed_dim == peer.num_features and model.num_classes == 7
    assert model.get_classifier() is model.head.fc
    model = vitzoo.create("vit_ti16", img_size=64, depth=3, num_classes=7)
    model.reset_classifier(3, global_pool="token")
    assert model.get_classifier().out_features == 3
    with pytest.raises(ConfigError, match="pool='gap'"):
        model.reset_classifier(3, global_pool="avg")
    groups = param_groups_layer_decay(model, weight_decay=0.05, layer_decay=0.5)
    assert len({g["lr_scale"] for g in groups}) == 3 + 2  # embedding, each block, norm and head
    scale = {n: g["lr_scale"] for g in groups for n, p in model.named_parameters()
             if any(p is q for q in g["params"])}
    assert (scale["stem.proj.weight"] < scale["encoder.blocks.0.attn.qkv.weight"]
            < scale["encoder.blocks.2.mlp.fc1.weight"] < scale["head.fc.weight"] == 1.0)


def test_timm_s_option_names_are_taken_or_answered():
    model = vitzoo.create("vit_ti16", drop_rate=0.1, drop_path_rate=0.2, global_pool="avg")
    assert (model.config.dropout, model.config.drop_path, model.config.pool) == (0.1, 0.2, "gap")
    assert vitzoo.create("vit_ti16", class_token=False).config.pool == "gap"
    with pytest.raises(ConfigError, match="mlp_dim, the MLP's width"):
        vitzoo.create("vit_ti16", mlp_ratio=4.0)
    with pytest.raises(ConfigError, match="global_pool='max'"):
        vitzoo.create("vit_ti16", global_pool="max")
