"""timm's feature-extraction surface: `create(..., features_only=True, out_indices=...)` gives the
chosen blocks' maps and `feature_info` as timm's ViT does; `prune_intermediate_layers` as timm's;
torchvision's FX feature extractor traces a model."""

import pytest
import timm
import torch
from torchvision.models.feature_extraction import create_feature_extractor

import vitzoo
from vitzoo.errors import ConfigError

SHAPE = dict(img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=2)
TINY, TIMM = dict(SHAPE, mlp_dim=64), dict(SHAPE, mlp_ratio=2.0)


@pytest.fixture(scope="module")
def timm_weights(tmp_path_factory):
    """A timm ViT of TINY's shape with random weights, saved for vitzoo's converter to read."""
    torch.manual_seed(0)
    peer = timm.create_model("vit_tiny_patch16_224", **TIMM, num_classes=5)
    with torch.no_grad():
        for p in peer.parameters():
            p.normal_(0, 0.05)
    torch.save(peer.state_dict(), path := tmp_path_factory.mktemp("timm") / "peer.pth")
    return path


@pytest.mark.parametrize("out_indices", [None, 2, (0, -2)])
def test_features_only_gives_timm_s_maps_and_feature_info(timm_weights, out_indices):
    chosen = {} if out_indices is None else {"out_indices": out_indices}
    theirs = timm.create_model("vit_tiny_patch16_224", **TIMM, features_only=True, **chosen).eval()
    theirs.model.load_state_dict(torch.load(timm_weights), strict=False)  # pruned: no head
    ours = vitzoo.create("vit_ti16", pretrained=timm_weights, features_only=True, **TINY,
                         num_classes=5, **chosen).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        got, expected = ours(x), theirs(x)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.shape[1:] == (32, 4, 4)  # NCHW, as timm's
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    info, their_info = ours.feature_info, theirs.feature_info
    assert info.out_indices == their_info.out_indices
    assert info.channels() == their_info.channels() and info.reduction() == their_info.reduction()
    assert info.module_name() == ["encoder." + name for name in their_info.module_name()]
    # timm lists the blocks it was built with; vitzoo those the pruned model still has
    assert info.channels(0) == 32 and len(info) == len(ours.model.encoder.blocks)
    assert len(ours.model.encoder.blocks) == len(theirs.model.blocks) == max(info.out_indices) + 1
    assert ours.model.config.depth == len(ours.model.encoder.blocks)
    assert ours.model.config.num_classes == 0 and ours.pretrained_cfg["input_size"] == (3, 32, 32)


def test_out_indices_without_features_only_or_out_of_range_is_refused():
    with pytest.raises(ConfigError, match="features_only=True"):
        vitzoo.create("vit_ti16", out_indices=2, **TINY)
    with pytest.raises(ValueError, match="blocks 0 to 3"):
        vitzoo.create("vit_ti16", features_only=True, out_indices=[4], **TINY)


def test_prune_intermediate_layers_as_timm_s_and_no_save_where_no_config_describes(tmp_path):
    model = vitzoo.create("vit_ti16", pos_embed_mode="every_layer", **TINY)
    assert model.prune_intermediate_layers([0, -3]) == [0, 1]
    assert len(model.encoder.blocks) == len(model.encoder.pos_embed) == 2
    assert model.num_classes == 0 and model(torch.randn(1, 3, 32, 32)).shape == (1, 32)
    model.save_pretrained(tmp_path / "kept")  # its config describes it: depth 2, no classes
    assert vitzoo.from_pretrained(tmp_path / "kept").config.depth == 2
    model.prune_intermediate_layers(1, prune_norm=True)
    with pytest.raises(ValueError, match="removed a LayerNorm .* save the model before pruning"):
        model.save_pretrained(tmp_path / "pruned")
    assert not (tmp_path / "pruned").exists()


@pytest.mark.parametrize("options", [
    {}, {"pos_embed": "relative"}, {"pos_embed": "learned_2d", "pool": "gap"},
    {"stem": "resnet", "stem_options": {"layers": (1,)}, "patch_size": 1}])
def test_torchvision_s_fx_feature_extractor_traces_a_model(options):
    model = vitzoo.create("vit_ti16", **{**TINY, "depth": 2, **options}).eval()
    extractor = create_feature_extractor(model, {"encoder.blocks.1": "last", "head.fc": "logits"})
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = extractor(x)
        torch.testing.assert_close(out["logits"], model(x), atol=1e-5, rtol=0)
        # the traced last block gives every token (forward's own computes the pooled ones)
        patches = model.forward_intermediates(x, [1], output_fmt="NLC", intermediates_only=True)
    torch.testing.assert_close(out["last"][:, model.num_prefix_tokens:], patches[0], atol=1e-5,
                               rtol=0)
