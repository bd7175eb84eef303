"""A vitzoo model answers what a timm user asks of a timm ViT, with timm's names and meaning:
intermediate features for dense tasks, the preprocessing timm's data helpers read, the classifier,
the parameter groups of layer-wise learning-rate decay, and timm's names of the same options."""

import pytest
import timm
import timm.data
import torch

import vitzoo
from vitzoo.errors import ConfigError


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A timm ViT with random weights, and vitzoo holding the same weights (read by its converter)."""
    torch.manual_seed(0)
    peer = timm.create_model("vit_tiny_patch16_224", img_size=64, depth=3, num_classes=7).eval()
    with torch.no_grad():
        for p in peer.parameters():
            p.normal_(0, 0.05)
    path = tmp_path_factory.mktemp("timm") / "peer.pth"
    torch.save(peer.state_dict(), path)
    return peer, vitzoo.create("vit_ti16", pretrained=path, img_size=64, depth=3).eval()


@pytest.mark.parametrize("options", [
    {},
    {"indices": 2},
    {"indices": [0, -1], "norm": True},
    {"indices": [1], "output_fmt": "NLC", "return_prefix_tokens": True},
    {"indices": 1, "stop_early": True},
    {"indices": [0, 2], "intermediates_only": True, "norm": True},
])
def test_forward_intermediates_are_timm_s(pair, options):
    peer, model = pair
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        theirs, ours = peer.forward_intermediates(x, **options), model.forward_intermediates(x, **options)
    if not options.get("intermediates_only"):
        torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=0)  # the final normed tokens
        theirs, ours = theirs[1], ours[1]
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        for mine, timms in zip(a, b) if isinstance(a, tuple) else [(a, b)]:
            assert mine.shape == timms.shape
            torch.testing.assert_close(mine, timms, atol=1e-5, rtol=0)


def test_forward_intermediates_refuses_what_timm_refuses(pair):
    _, model = pair
    with pytest.raises(ValueError, match="blocks 0 to 2"):
        model.forward_intermediates(torch.randn(1, 3, 64, 64), indices=[3])
    with pytest.raises(ValueError, match="output_fmt"):
        model.forward_intermediates(torch.randn(1, 3, 64, 64), output_fmt="NHWC")


def test_timm_s_data_helpers_read_a_tag_s_preprocessing():
    model = vitzoo.create("vit_s16.augreg_in21k_ft_in1k")  # the tag's architecture and preprocessing
    config = timm.data.resolve_data_config({}, model=model)
    assert config["input_size"] == (3, 224, 224) and config["crop_pct"] == 0.9
    assert config["mean"] == (0.5, 0.5, 0.5) and config["std"] == (0.5, 0.5, 0.5) and config["interpolation"] == "bicubic"
    image = torch.randint(0, 256, (3, 300, 280), dtype=torch.uint8)
    from torchvision.transforms.v2.functional import to_pil_image

    theirs = timm.data.create_transform(**config)(to_pil_image(image))
    ours = vitzoo.transforms_for(model)(to_pil_image(image))
    assert theirs.shape == ours.shape == (3, 224, 224)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)  # both resize the PIL image itself


def test_the_classifier_features_and_layer_decay_groups(pair):
    peer, model = pair
    assert model.num_features == model.embed_dim == peer.num_features and model.num_classes == 7
    assert model.get_classifier() is model.head.fc and model.get_classifier().out_features == 7
    model_copy = vitzoo.create("vit_ti16", img_size=64, depth=3, num_classes=7)
    model_copy.reset_classifier(3, global_pool="token")
    assert model_copy.get_classifier().out_features == 3
    with pytest.raises(ConfigError, match="pool='gap'"):
        model_copy.reset_classifier(3, global_pool="avg")
    from timm.optim._param_groups import param_groups_layer_decay

    groups = param_groups_layer_decay(model_copy, weight_decay=0.05, layer_decay=0.5)
    scales = sorted({g["lr_scale"] for g in groups})
    assert len(scales) == 3 + 2  # the embedding, each block, the final norm and head: one decay step each
    by_name = {n: g["lr_scale"] for g in groups for n, p in model_copy.named_parameters() if any(p is q for q in g["params"])}
    assert by_name["stem.proj.weight"] < by_name["encoder.blocks.0.attn.qkv.weight"] < by_name["encoder.blocks.2.mlp.fc1.weight"]
    assert by_name["head.fc.weight"] == 1.0


def test_timm_s_option_names_are_taken_or_answered():
    model = vitzoo.create("vit_ti16", drop_rate=0.1, drop_path_rate=0.2, global_pool="avg")
    assert (model.config.dropout, model.config.drop_path, model.config.pool) == (0.1, 0.2, "gap")
    assert vitzoo.create("vit_ti16", class_token=False).config.pool == "gap"
    with pytest.raises(ConfigError, match="mlp_dim, the MLP's width"):
        vitzoo.create("vit_ti16", mlp_ratio=4.0)
    with pytest.raises(ConfigError, match="global_pool='max'"):
        vitzoo.create("vit_ti16", global_pool="max")
