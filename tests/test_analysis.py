"""The inspection tools of section 4.5: attention distance, rollout, position-embedding
similarity, the principal components of the patch filters."""

import pytest
import torch

import vitzoo
from vitzoo.analysis import (attention_rollout, mean_attention_distance,
                             patch_embedding_components, position_embedding_similarity)


def uniform_attention(model):
    """q = k = 0 in every layer: each query attends equally to every token."""
    with torch.no_grad():
        for block in model.encoder.blocks:
            block.attn.qkv.weight[:64].zero_()
            block.attn.qkv.bias[:64].zero_()
    return model.eval()


def test_mean_attention_distance_of_uniform_attention_is_the_mean_pairwise_distance(tiny):
    distance = mean_attention_distance(uniform_attention(vitzoo.create("vit_ti16", **tiny)),
                                       torch.randn(2, 3, 32, 32))
    ys, xs = torch.meshgrid(torch.arange(4.0) * 8 + 4, torch.arange(4.0) * 8 + 4, indexing="ij")
    centres = torch.stack([ys.flatten(), xs.flatten()], 1)
    expected = torch.cdist(centres, centres).mean()
    assert torch.allclose(distance, expected.expand(2, 2), atol=1e-4)  # layers x heads


def test_local_attention_has_a_small_distance(tiny):
    model = uniform_attention(vitzoo.create("vit_ti16", **tiny, pos_embed="relative", pool="gap"))
    with torch.no_grad():
        for block in model.encoder.blocks:
            block.attn.relative.table.zero_()
    assert torch.all(mean_attention_distance(model, torch.randn(1, 3, 32, 32)) > 10)
    with torch.no_grad():
        for block in model.encoder.blocks:
            block.attn.qkv.bias[:32].fill_(1.0)  # q = 1 ...
            block.attn.relative.table[15].fill_(100.0)  # ... scores offset 0 very high
    assert torch.all(mean_attention_distance(model, torch.randn(1, 3, 32, 32)) < 1.0)


@pytest.mark.parametrize("pool", ["token", "gap"])
def test_the_rollout_of_uniform_attention_is_flat(tiny, pool):
    maps = attention_rollout(uniform_attention(vitzoo.create("vit_ti16", **tiny, pool=pool)),
                             torch.randn(3, 3, 32, 32))
    assert maps.shape == (3, 4, 4) and torch.allclose(maps, torch.ones_like(maps), atol=1e-5)


@pytest.mark.parametrize("pos_embed", ["learned_1d", "learned_2d"])
def test_position_embedding_similarity_is_a_cosine_map(tiny, pos_embed):
    sim = position_embedding_similarity(vitzoo.create("vit_ti16", **tiny, pos_embed=pos_embed))
    flat = sim.reshape(16, 16)
    assert sim.shape == (4, 4, 4, 4) and torch.allclose(flat.diagonal(), torch.ones(16), atol=1e-5)
    assert torch.allclose(flat, flat.t(), atol=1e-6)
    if pos_embed == "learned_2d":  # one row shares its row half: more alike than across rows
        assert sim[0, 0, 0, 1:].mean() > sim[0, 0, 1:, 1:].mean()
    with pytest.raises(ValueError, match="no per-patch embedding"):
        position_embedding_similarity(vitzoo.create("vit_ti16", **tiny, pos_embed="relative"))
    with pytest.raises(ValueError, match="adds nothing"):
        position_embedding_similarity(vitzoo.create("vit_ti16", **tiny, pos_embed="none"))


def test_the_principal_components_of_the_patch_filters(tiny):
    components, explained = patch_embedding_components(vitzoo.create("vit_ti16", **tiny), k=6)
    assert components.shape == (6, 3, 8, 8)
    assert torch.all(explained[:-1] >= explained[1:]) and explained.sum() <= 1.0 + 1e-6
    assert torch.allclose(components.reshape(6, -1).norm(dim=1), torch.ones(6), atol=1e-5)
    hybrid = vitzoo.create("vit_ti16", **{**tiny, "patch_size": 2}, stem="resnet",
                           stem_options={"layers": ()})
    with pytest.raises(ValueError, match="linear patch projection"):
        patch_embedding_components(hybrid)
