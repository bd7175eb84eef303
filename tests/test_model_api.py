"""The model's API beyond forward, any resolution, and clear errors for bad input."""

import pytest
import torch

import vitzoo
from vitzoo.errors import ConfigError, PluginError


def perturbed(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("options", [
    {}, {"pos_embed": "relative"}, {"pos_embed": "learned_2d", "pos_embed_mode": "every_layer"},
    {"pos_embed": "none"}, {"pool": "gap"},
    {"head": "mlp", "head_options": {"representation_size": 16}},
], ids=["learned_1d", "relative", "every_layer", "none", "gap", "mlp_head"])
def test_forward_is_features_then_head_and_computes_the_last_block_for_the_pooled_tokens(tiny,
                                                                                        options):
    """A class-token pool reads one token: `forward` computes the last block's MLP and attention
    output for it alone (its keys and values from every token), with the logits and gradients of
    the whole computation; a pool over all tokens gets them all."""
    model = perturbed(vitzoo.create("vit_ti16", **tiny, **options))
    x = torch.randn(3, 3, 32, 32)
    every = 16 + model.num_prefix_tokens  # a 4 x 4 grid, and the class token if any
    seen = []
    model.encoder.blocks[-1].mlp.register_forward_hook(lambda m, args, out: seen.append(out.shape))
    model(x)
    assert seen == [(3, 1 if model.config.pool == "token" else every, 32)]
    tokens = model.forward_features(x)
    assert tokens.shape == (3, every, 32)
    torch.testing.assert_close(model(x), model.forward_head(tokens), atol=1e-5, rtol=1e-5)
    width = 16 if options.get("head") else 32
    assert model.forward_head(tokens, pre_logits=True).shape == (3, width)

    def gradients(loss):
        model.zero_grad(set_to_none=True)
        loss().square().sum().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    model.train()  # no dropout in the tiny model: both passes compute one function
    whole = gradients(lambda: model.forward_head(model.forward_features(x)))
    for name, grad in gradients(lambda: model(x)).items():
        torch.testing.assert_close(grad, whole[name], atol=1e-5, rtol=1e-4, msg=name)


def test_count_flops_counts_every_token_or_what_forward_computes(tiny):
    """The paper's compute counts every token through every layer; `forward` spares the patch
    tokens' query, attention output and MLP in the last block when the class token is pooled."""
    config = vitzoo.get_config("vit_ti16", **tiny)
    tokens, dim, mlp = 17, 32, 64
    spared = 2 * (tokens - 1) * (dim * dim + dim * dim + 2 * dim * mlp + 2 * tokens * dim)
    assert vitzoo.count_flops(config) - vitzoo.count_flops(config, computed=True) == spared
    gap = config.replace(pool="gap")
    assert vitzoo.count_flops(gap, computed=True) == vitzoo.count_flops(gap)


def test_an_attention_bias_must_give_one_row_per_query_it_is_given(tiny):
    """In the last block the pooled class token's only: a bias of every token's rows would
    broadcast silently in the written-out attention."""
    model = vitzoo.create("vit_ti16", **tiny, pos_embed="relative")
    relative = model.encoder.blocks[-1].attn.relative
    relative.forward = lambda q, grid: torch.zeros(1, q.shape[1], 17, 17)  # a row per token
    with pytest.raises(PluginError, match=r"RelativePositionBias gave an attention bias of shape "
                                          r"\(1, 2, 17, 17\), not one row per query"):
        model(torch.randn(1, 3, 32, 32))


def test_reset_classifier_gives_a_zero_head_and_updates_the_config(tiny):
    model = perturbed(vitzoo.create("vit_ti16", **tiny, head="mlp",
                                    head_options={"representation_size": 16}))
    model.reset_classifier(3)
    assert model.config.num_classes == 3 and model.head.fc.weight.shape == (3, 16)
    assert torch.count_nonzero(model.head.fc.weight) == 0
    model.reset_classifier(7, head="linear")  # fine-tuning: pre-logits dropped too
    assert model.config.head == "linear" and model.config.head_options == {}
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 7)


def test_no_weight_decay_names_the_class_token_and_the_position_embeddings(tiny):
    names = vitzoo.create("vit_ti16", **tiny).no_weight_decay()
    assert names == {"cls_token", "encoder.pos_embed.weight"}
    names = vitzoo.create("vit_ti16", **tiny, pos_embed="learned_2d", pool="gap",
                          pos_embed_mode="every_layer").no_weight_decay()
    assert names == {f"encoder.pos_embed.{i}.{p}" for i in range(2) for p in ("row", "col")}
    names = vitzoo.create("vit_ti16", **tiny, pos_embed="relative").no_weight_decay()
    assert names == {"cls_token"} | {f"encoder.blocks.{i}.attn.relative.table" for i in range(2)}


@pytest.mark.parametrize("pos_embed", ["learned_1d", "relative"])
def test_attention_maps_are_probabilities_of_the_tokens_forward_computes(tiny, pos_embed):
    model = perturbed(vitzoo.create("vit_ti16", **tiny, pos_embed=pos_embed))
    x = torch.randn(2, 3, 32, 32)
    maps = model.get_attention_maps(x)
    assert len(maps) == 2 and maps[0].shape == (2, 2, 17, 17)
    assert torch.allclose(maps[1].sum(-1), torch.ones(2, 2, 17))
    with torch.no_grad():  # the written-out path computes the tokens SDPA computes
        written_out = model.encoder(*model.embed(x), attn_maps=[])
    assert torch.allclose(written_out, model.forward_features(x), atol=1e-5)


def test_gradient_checkpointing_gives_the_same_gradients(tiny):
    model = perturbed(vitzoo.create("vit_ti16", **tiny)).train()
    x = torch.randn(2, 3, 32, 32)
    model(x).sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x).sum().backward()
    assert all(torch.allclose(a, p.grad, atol=1e-6) for a, p in zip(plain, model.parameters()))


@pytest.mark.parametrize("pos_embed, pool", [("learned_1d", "token"), ("learned_2d", "gap"),
                                             ("relative", "token"), ("none", "gap")])
def test_set_img_size_resamples_the_position_embeddings_in_place(tiny, pos_embed, pool):
    model = vitzoo.create("vit_ti16", **tiny, pos_embed=pos_embed, pool=pool).eval()
    model.set_img_size((48, 64))
    assert model.config.img_size == (48, 64) and model.grid == (6, 8)
    assert model(torch.randn(1, 3, 48, 64)).shape == (1, 5)
    with pytest.raises(ValueError, match=r"input size \(32, 32\) differs from the configured "
                                         r"img_size \(48, 64\)"):
        model(torch.randn(1, 3, 32, 32))
    with pytest.raises(ConfigError, match="not divisible"):
        model.set_img_size((30, 64))


def test_resampling_is_bilinear_with_aligned_corners_and_keeps_the_class_token(tiny):
    model = vitzoo.create("vit_ti16", **tiny)
    old = model.encoder.pos_embed.weight.detach().clone()
    model.set_img_size(32)
    assert torch.equal(model.encoder.pos_embed.weight, old)  # the same grid: the same embedding
    model.set_img_size(64)  # grid 4x4 -> 8x8
    new = model.encoder.pos_embed.weight.detach()
    assert torch.equal(new[:, 0], old[:, 0])
    old_grid, new_grid = old[0, 1:].reshape(4, 4, -1), new[0, 1:].reshape(8, 8, -1)
    for (oy, ox), (ny, nx) in [((0, 0), (0, 0)), ((0, 3), (0, 7)), ((3, 0), (7, 0)),
                               ((3, 3), (7, 7))]:
        assert torch.allclose(old_grid[oy, ox], new_grid[ny, nx], atol=1e-6)


def test_dynamic_img_size_takes_any_divisible_input_without_changing_parameters(tiny):
    model = vitzoo.create("vit_ti16", **tiny, dynamic_img_size=True, pos_embed="learned_2d").eval()
    params = {k: v.clone() for k, v in model.state_dict().items()}
    assert model(torch.randn(1, 3, 48, 24)).shape == (1, 5)
    assert all(torch.equal(params[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ConfigError, match="not divisible"):
        model(torch.randn(1, 3, 30, 32))


def test_non_square_images_and_the_hybrid_at_any_resolution(tiny):
    model = vitzoo.create("vit_ti16", **{**tiny, "img_size": (32, 64)})
    assert model.grid == (4, 8) and model(torch.randn(2, 3, 32, 64)).shape == (2, 5)
    hybrid = vitzoo.create("vit_ti16", stem="resnet", stem_options={"layers": (1, 1)},
                           patch_size=1, img_size=(32, 48), num_classes=2)
    assert hybrid.grid == (4, 6) and hybrid(torch.randn(1, 3, 32, 48)).shape == (1, 2)


@pytest.mark.parametrize("x, fragment", [
    (torch.randn(3, 32, 32), "add a batch dimension"),
    (torch.zeros(1, 3, 32, 32, dtype=torch.uint8), "expected floating-point images"),
    (torch.randn(1, 3, 64, 64), "differs from the configured img_size"),
])
def test_bad_input_is_a_clear_error_at_the_boundary(tiny, x, fragment):
    with pytest.raises(ValueError, match=fragment):
        vitzoo.create("vit_ti16", **tiny)(x)
