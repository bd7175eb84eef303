"""Every component and every combination: shapes, gradient flow, parameter-count formulas, the
official initialisation."""

import itertools

import pytest
import torch

import vitzoo
from vitzoo.errors import ConfigError

# the eight cells of the paper's Table 8 (position embedding x injection mode)
MODES = ("input", "every_layer", "every_layer_shared")
TABLE_8 = [("none", "input"), *[(e, m) for e in ("learned_1d", "learned_2d") for m in MODES],
           ("relative", "input")]
UNDEFINED = [(e, m) for e in ("none", "relative") for m in MODES[1:]]
STEMS = {"patch": {}, "resnet": dict(stem="resnet", stem_options={"layers": (1,)}, patch_size=2)}


@pytest.mark.parametrize("pos_embed, mode", TABLE_8)
@pytest.mark.parametrize("pool", ["token", "gap"])
@pytest.mark.parametrize("stem", list(STEMS))
def test_every_table8_cell_builds_runs_and_learns(tiny, pos_embed, mode, pool, stem):
    model = vitzoo.create("vit_ti16", **{**tiny, **STEMS[stem]}, pos_embed=pos_embed,
                          pos_embed_mode=mode, pool=pool)
    with torch.no_grad():  # the zero-initialised head and gn3 scales would block gradients
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    logits = model(torch.randn(3, 3, 32, 32))
    assert logits.shape == (3, tiny["num_classes"])
    logits.square().sum().backward()
    assert [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()] == []


@pytest.mark.parametrize("pos_embed, mode", TABLE_8)
@pytest.mark.parametrize("pool", ["token", "gap"])
def test_the_parameter_count_follows_the_formula_of_each_injection_mode(pos_embed, mode, pool):
    d, m, depth, heads, p, size, classes = 64, 128, 3, 4, 4, 32, 7
    model = vitzoo.create("vit_ti16", embed_dim=d, mlp_dim=m, depth=depth, num_heads=heads,
                          patch_size=p, img_size=size, num_classes=classes, pos_embed=pos_embed,
                          pos_embed_mode=mode, pool=pool)
    prefix, (h, w) = int(pool == "token"), (size // p, size // p)
    per_instance = {"none": 0, "learned_1d": (h * w + prefix) * d,
                    "learned_2d": (h + w) * (d // 2) + prefix * d,
                    "relative": (2 * h * w - 1 + prefix) * d}[pos_embed]  # offsets x D, per block
    instances = depth if mode == "every_layer" or pos_embed == "relative" else 1
    block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * m + m) + (m * d + d)
    expected = ((p * p * 3 * d + d) + prefix * d + per_instance * instances + depth * block
                + 2 * d + d * classes + classes)
    assert vitzoo.count_params(model) == expected


@pytest.mark.parametrize("pos_embed, mode", UNDEFINED)
def test_combinations_the_paper_marks_undefined_are_a_clear_error(tiny, pos_embed, mode):
    with pytest.raises(ConfigError, match=r"undefined \(the paper's Table 8 marks it n/a\)"):
        vitzoo.create("vit_ti16", **tiny, pos_embed=pos_embed, pos_embed_mode=mode)


def test_every_layer_adds_a_new_embedding_per_layer_and_shared_adds_one(tiny):
    per_layer = vitzoo.create("vit_ti16", **tiny, pos_embed_mode="every_layer")
    shared = vitzoo.create("vit_ti16", **tiny, pos_embed_mode="every_layer_shared")
    assert len(per_layer.encoder.position_embeddings()) == tiny["depth"]
    assert len(shared.encoder.position_embeddings()) == 1
    calls = []  # the shared one really reaches every layer's input
    shared.encoder.pos_embed.register_forward_hook(lambda *args: calls.append(1))
    shared(torch.randn(1, 3, 32, 32))
    assert len(calls) == tiny["depth"]


def test_learned_2d_concatenates_row_and_column_embeddings(tiny):
    pe = vitzoo.create("vit_ti16", **tiny, pos_embed="learned_2d", pool="gap").encoder.pos_embed
    added = pe(torch.zeros(1, 16, 32), (4, 4))[0].reshape(4, 4, -1)
    for y, x in itertools.product(range(4), range(4)):
        assert torch.equal(added[y, x, :16], pe.row[y]) and torch.equal(added[y, x, 16:], pe.col[x])


def test_the_relative_bias_depends_on_the_offset_and_enters_the_logits(tiny):
    model = vitzoo.create("vit_ti16", **tiny, pos_embed="relative", pool="gap").eval()
    q = torch.randn(1, 2, 1, 16).expand(1, -1, 16, -1)  # one query everywhere
    bias = model.encoder.blocks[0].attn.relative(q.contiguous(), (4, 4))[0, 0]
    assert all(torch.allclose(bias[i, j], bias[3, 1]) for i, j in [(3, 1), (7, 5), (15, 13)])
    assert not torch.allclose(bias[3, 1], bias[1, 3])
    torch.nn.init.normal_(model.head.fc.weight)  # the zero-initialised head would hide changes
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = model(x)
        for block in model.encoder.blocks:
            block.attn.relative.table.mul_(50)
        assert not torch.allclose(model(x), before)
        for block in model.encoder.blocks:  # and only through the bias: at zero ...
            block.attn.relative.table.zero_()
        plain = vitzoo.create("vit_ti16", **tiny, pos_embed="none", pool="gap").eval()
        plain.load_state_dict({k: v for k, v in model.state_dict().items() if "relative" not in k})
        torch.testing.assert_close(model(x), plain(x))  # ... it is attention without position


def test_gap_has_no_class_token_and_averages_after_the_final_norm(tiny):
    model = vitzoo.create("vit_ti16", **tiny, pool="gap")
    assert model.cls_token is None
    tokens = model.forward_features(torch.randn(2, 3, 32, 32))
    assert tokens.shape == (2, 16, 32)
    assert torch.allclose(model.forward_head(tokens, pre_logits=True), tokens.mean(1))


def test_fc_norm_moves_the_final_layernorm_after_the_pooling(tiny):
    """timm's `fc_norm` (its default with global average pooling): the mean, then LN."""
    model = vitzoo.create("vit_ti16", **tiny, pool="gap", fc_norm=True)
    assert isinstance(model.encoder.norm, torch.nn.Identity)
    tokens = model.forward_features(torch.randn(2, 3, 32, 32))
    pooled = model.forward_head(tokens, pre_logits=True)
    assert torch.allclose(pooled, model.fc_norm(tokens.mean(1)))
    plain = vitzoo.create("vit_ti16", **tiny, pool="gap")
    assert vitzoo.count_params(model) == vitzoo.count_params(plain)


def test_the_mlp_head_is_dense_tanh_then_a_zero_classifier_and_needs_its_width(tiny):
    model = vitzoo.create("vit_ti16", **tiny, head="mlp", head_options={"representation_size": 24})
    assert not model.head.fc.weight.any() and not model.head.fc.bias.any()
    tokens = model.forward_features(torch.randn(2, 3, 32, 32))
    pre = model.forward_head(tokens, pre_logits=True)
    assert torch.allclose(pre, torch.tanh(model.head.pre_logits(tokens[:, 0])))
    with pytest.raises(ConfigError, match="needs head_options=.'representation_size'"):
        vitzoo.create("vit_ti16", **tiny, head="mlp")
    with pytest.raises(ConfigError, match="head='linear' has no options of its own"):
        vitzoo.create("vit_ti16", **tiny, head_options={"representation_size": 24})
    features = vitzoo.create("vit_ti16", **{**tiny, "num_classes": 0})
    assert features(torch.randn(2, 3, 32, 32)).shape == (2, 32)


def test_the_official_initialisation(tiny):
    model = vitzoo.create("vit_ti16", **{**tiny, "embed_dim": 256, "num_heads": 4, "mlp_dim": 512})
    assert not model.cls_token.any() and not model.head.fc.weight.any()
    assert abs(model.encoder.pos_embed.weight.std().item() - 0.02) < 0.004
    fc1 = model.encoder.blocks[0].mlp.fc1
    assert fc1.bias.abs().max() < 1e-5  # normal(1e-6)
    bound = (6 / (256 + 512)) ** 0.5  # Xavier-uniform
    assert bound >= fc1.weight.abs().max() > 0.9 * bound
    q_block = model.encoder.blocks[0].attn.qkv.weight[:256]  # q, k, v as D x D each
    assert q_block.abs().max() <= (6 / 512) ** 0.5


def test_dropout_and_stochastic_depth_act_in_training_only(tiny):
    model = vitzoo.create("vit_ti16", **tiny, dropout=0.3, drop_path=0.5, attn_dropout=0.2)
    torch.nn.init.normal_(model.head.fc.weight)
    x = torch.randn(2, 3, 32, 32)
    assert not torch.allclose(model.train()(x), model(x))
    assert torch.equal(model.eval()(x), model(x))
    assert [block.drop_path.p for block in model.encoder.blocks] == [0.0, 0.5]  # linear in depth


@pytest.mark.parametrize("act, approximate", [("gelu", "none"), ("gelu_tanh", "tanh")])
def test_the_activation_option_selects_exact_or_tanh_gelu(tiny, act, approximate):
    z = torch.linspace(-3, 3, 7)
    mlp = vitzoo.create("vit_ti16", **tiny, act=act).encoder.blocks[0].mlp
    assert torch.equal(mlp.act(z), torch.nn.functional.gelu(z, approximate=approximate))


@pytest.mark.parametrize("numerics, gn_eps", [("official", 1e-6), ("timm", 1e-5)])
def test_resnet_numerics_select_the_standardization_and_groupnorm_eps(numerics, gn_eps):
    model = vitzoo.create("vit_ti16", stem="resnet", patch_size=1, img_size=32,
                          stem_options={"layers": (1,), "numerics": numerics})
    conv = model.stem.backbone.conv_root
    w = conv.weight
    var, mean = torch.var_mean(w, dim=(1, 2, 3), keepdim=True, correction=0)
    expected = ((w - mean) / (var.sqrt() + 1e-5) if numerics == "official"
                else (w - mean) / (var + 1e-8).sqrt())
    assert torch.allclose(conv.standardized_weight(), expected, atol=1e-6)
    assert model.stem.backbone.gn_root.eps == gn_eps
