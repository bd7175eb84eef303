"""Inspection tools of section 4.5: attention distance, rollout, position-embedding similarity, PCA.
"""

import pytest
import torch

import vitzoo
from vitzoo.analysis import (
    attention_rollout,
    mean_attention_distance,
    patch_embedding_components,
    position_embedding_similarity,
)
def uniform_attention_model(tiny, **options):
    """q = k = 0 in every layer: each query attends equally to every token."""
    model = vitzoo.create("vit_ti16", **tiny, **options).eval()
    with torch.no_grad():
        for block in model.encoder.blocks:
            block.attn.qkv.weight[: 2 * tiny["embed_dim"]].zero_()
            block.attn.qkv.bias[: 2 * tiny["embed_dim"]].zero_()
    return model


def test_mean_attention_distance_of_uniform_attention_is_the_mean_pairwise_distance(tiny):
    model = uniform_attention_model(tiny)
    distance = mean_attention_distance(model, torch.randn(2, 3, 32, 32))
    assert distance.shape == (2, 2)  # layers x heads
    ys, xs = torch.meshgrid(torch.arange(4.0) * 8 + 4, torch.arange(4.0) * 8 + 4, indexing="ij")
    centres = torch.stack([ys.flatten(), xs.flatten()], 1)
    expected = torch.cdist(centres, centres).mean()
    assert torch.allclose(distance, expected.expand(2, 2), atol=1e-4)


def test_local_attention_has_a_small_distance(tiny):
    model = vitzoo.create("vit_ti16", **tiny, pos_embed="relative", pool="gap").eval()
    with torch.no_grad():
        for block in model.encoder.blocks:  # content logits off; a strong bias for offset 0
            block.attn.qkv.weight[: 2 * tiny["embed_dim"]].zero_()
            block.attn.relative.table.zero_()
    base = mean_attention_distance(model, torch.randn(1, 3, 32, 32))
    assert torch.all(base > 10)  # uniform over a 32 px image
    with torch.no_grad():
        for block in model.encoder.blocks:
            block.attn.qkv.bias[: tiny["embed_dim"]].fill_(1.0)  # q = 1 ...
            block.attn.relative.table[15].fill_(100.0)  # ... scores offset 0 very high
    assert torch.all(mean_attention_distance(model, torch.randn(1, 3, 32, 32)) < 1.0)


@pytest.mark.parametrize("pool", ["token", "gap"])
def test_rollout_of_uniform_attention_is_flat(tiny, pool):
    model = uniform_attention_model(tiny, pool=pool)
    maps = attention_rollout(model, torch.randn(3, 3, 32, 32))
    assert maps.shape == (3, 4, 4)
    assert torch.allclose(maps, torch.ones_like(maps), atol=1e-5)


@pytest.mark.parametrize("pos_embed", ["learned_1d", "learned_2d"])
def test_position_embedding_similarity_is_a_cosine_map(tiny, pos_embed):
    model = vitzoo.create("vit_ti16", **tiny, pos_embed=pos_embed)
    sim = position_embedding_similarity(model)
    assert sim.shape == (4, 4, 4, 4)
    assert torch.allclose(sim.reshape(16, 16).diagonal(), torch.ones(16), atol=1e-5)
    assert torch.allclose(sim.reshape(16, 16), sim.reshape(16, 16).t(), atol=1e-6)
    # same row: the row halves agree, so similarity is higher than across rows
    if pos_embed == "learned_2d":
        assert sim[0, 0, 0, 1:].mean() > sim[0, 0, 1:, 1:].mean()


def test_position_embedding_similarity_needs_additive_vectors(tiny):
    with pytest.raises(ValueError, match="no per-patch embedding"):
        position_embedding_similarity(vitzoo.create("vit_ti16", **tiny, pos_embed="relative"))
    with pytest.raises(ValueError, match="adds nothing"):
        position_embedding_similarity(vitzoo.create("vit_ti16", **tiny, pos_embed="none"))


def test_principal_components_of_patch_filters(tiny):
    model = vitzoo.create("vit_ti16", **tiny)
    components, explained = patch_embedding_components(model, k=6)
    assert components.shape == (6, 3, 8, 8)
    assert torch.all(explained[:-1] >= explained[1:]) and explained.sum() <= 1.0 + 1e-6
    assert torch.allclose(components.reshape(6, -1).norm(dim=1), torch.ones(6), atol=1e-5)
    with pytest.raises(ValueError, match="linear patch projection"):
        patch_embedding_components(vitzoo.create("vit_ti16", **{**tiny, "patch_size": 2},
                                                 stem="resnet", stem_options={"layers": ()}))
