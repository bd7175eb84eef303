"""Official .npz checkpoints give the official model's logits, load strictly, resample as the
official code does; an .npz that is no checkpoint says what it is. The reference is
`official_reference.py`, an independent Flax model, its checkpoints perturbed at random."""

import logging

import numpy as np
import pytest
import torch
from official_reference import make_checkpoint, official_logits

import vitzoo
from vitzoo.errors import CheckpointError

VIT = dict(hidden_size=32, num_layers=2, mlp_dim=64, num_heads=4, num_classes=7, patch_size=8)
OPTIONS = dict(embed_dim=32, depth=2, mlp_dim=64, num_heads=4, num_classes=7, patch_size=8)


def logits_close(model, params, fields, img_size):
    images = np.random.default_rng(1).standard_normal((2, 3, img_size, img_size), np.float32)
    with torch.no_grad():
        actual = model.eval()(torch.from_numpy(images)).double().numpy()
    assert np.abs(actual - official_logits(params, images, **fields)).max() < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("fields, options, img_size", [
    ({"classifier": "token"}, {}, 32),
    ({"classifier": "gap"}, {}, 32),
    ({"classifier": "token", "representation_size": 24}, {}, 32),
    ({"patch_size": 1, "resnet_layers": (1, 1), "classifier": "token"},
     {"patch_size": 1, "stem": "resnet", "stem_options": {"layers": (1, 1)}}, 48),  # TF 'SAME'
    ({"patch_size": 2, "resnet_layers": (), "classifier": "gap"},
     {"patch_size": 2, "stem": "resnet", "stem_options": {"layers": ()}}, 32),
], ids=["token", "gap", "pre_logits", "r-hybrid-48px", "root-only-hybrid"])
def test_logits_equal_the_official_model(tmp_path, fields, options, img_size):
    fields = {**VIT, **fields}
    params = make_checkpoint(tmp_path / "c.npz", img_size=img_size, seed=3, **fields)
    model = vitzoo.create("vit_ti16", pretrained=tmp_path / "c.npz", img_size=img_size,
                          **{**OPTIONS, **options})
    c = model.config
    assert (c.act, c.norm_eps, c.pool) == ("gelu_tanh", 1e-6, fields["classifier"])
    assert c.head_options.get("representation_size") == fields.get("representation_size")
    logits_close(model, params, fields, img_size)


def test_groupnorm_parameters_stored_as_1x1x1xc_load_too(tmp_path):
    fields = {**VIT, "patch_size": 1, "resnet_layers": (1,)}
    params = make_checkpoint(tmp_path / "c.npz", img_size=32, groupnorm_4d=True, **fields)
    assert params["gn_root/scale"].shape == (1, 1, 1, 64)
    model = vitzoo.create("vit_ti16", pretrained=tmp_path / "c.npz", img_size=32, stem="resnet",
                          stem_options={"layers": (1,)}, **{**OPTIONS, "patch_size": 1})
    logits_close(model, params, fields, 32)


def test_the_heads_are_read_from_the_attention_kernels(tmp_path):
    fields = {**VIT, "num_heads": 2}  # a kernel is (D, heads, D/heads): 2 heads of 16
    params = make_checkpoint(tmp_path / "c.npz", img_size=32, **fields)
    model = vitzoo.from_pretrained(tmp_path / "c.npz")
    assert model.config.num_heads == 2
    logits_close(model, params, fields, 32)


def test_another_resolution_resamples_like_the_official_code(tmp_path):
    params = make_checkpoint(tmp_path / "c.npz", img_size=32, **VIT)  # grid 4x4
    model = vitzoo.create("vit_ti16", pretrained=tmp_path / "c.npz", img_size=64, **OPTIONS)
    pos = params["Transformer/posembed_input/pos_embedding"][0]
    resampled = model.encoder.pos_embed.weight[0].detach().numpy()
    assert np.array_equal(resampled[0], pos[0])  # the class token's kept
    # the official interpolate_posembed: a linear zoom of the grid (order 1), align_corners
    grid, coords = pos[1:].reshape(4, 4, -1), np.linspace(0, 3, 8)
    lo = np.minimum(np.floor(coords).astype(int), 2)
    frac = coords - lo
    rows = grid[lo] * (1 - frac)[:, None, None] + grid[lo + 1] * frac[:, None, None]
    zoomed = rows[:, lo] * (1 - frac)[None, :, None] + rows[:, lo + 1] * frac[None, :, None]
    assert np.allclose(resampled[1:].reshape(8, 8, -1), zoomed, atol=1e-6)


def test_the_checkpoint_decides_the_head_unless_another_is_asked_for(tmp_path, caplog):
    make_checkpoint(tmp_path / "c.npz", img_size=32, **{**VIT, "representation_size": 24,
                                                         "num_classes": 11})
    options = {k: v for k, v in OPTIONS.items() if k != "num_classes"}
    kept = vitzoo.create("vit_ti16", pretrained=tmp_path / "c.npz", img_size=32, **options)
    assert (kept.config.num_classes, kept.config.head) == (11, "mlp")
    with caplog.at_level(logging.WARNING, logger="vitzoo"):
        model = vitzoo.create("vit_ti16", pretrained=tmp_path / "c.npz", img_size=32,
                              num_classes=3, **options)
    assert "head replaced by a zero-initialised linear layer" in caplog.text
    assert model.config.head == "linear" and model.config.head_options == {}
    assert torch.count_nonzero(model.head.fc.weight) == 0 and model.head.fc.weight.shape == (3, 32)


def test_loading_is_strict_and_lists_every_difference(tmp_path):
    params = make_checkpoint(tmp_path / "c.npz", img_size=32, **VIT)
    with pytest.raises(CheckpointError) as err:
        vitzoo.create("vit_ti16", pretrained=tmp_path / "c.npz", img_size=32,
                      **{**OPTIONS, "depth": 3, "mlp_dim": 48})
    assert 'Missing key(s) in state_dict: "encoder.blocks.2.' in str(err.value)  # a whole block
    assert "size mismatch for encoder.blocks.0.mlp.fc1.weight" in str(err.value)
    np.savez(tmp_path / "extra.npz", **params, **{"Transformer/extra/kernel": np.zeros(3)})
    with pytest.raises(CheckpointError, match='Unexpected key.*"Transformer/extra/kernel"'):
        vitzoo.create("vit_ti16", pretrained=tmp_path / "extra.npz", img_size=32, **OPTIONS)


def test_an_option_the_checkpoint_decides_otherwise_is_refused(tmp_path):
    make_checkpoint(tmp_path / "c.npz", img_size=32, **{**VIT, "classifier": "gap"})
    with pytest.raises(vitzoo.ConfigError,
                       match="the checkpoint has pool='gap' but pool='token' was requested"):
        vitzoo.create("vit_ti16", pretrained=tmp_path / "c.npz", img_size=32, pool="token",
                      **OPTIONS)


def test_an_incomplete_checkpoint_names_the_tensor_it_lacks(tmp_path):
    params = make_checkpoint(tmp_path / "c.npz", img_size=32, **VIT)
    lacked = "Transformer/encoderblock_1/MlpBlock_3/Dense_0/bias"
    del params[lacked]
    np.savez(tmp_path / "cut.npz", **params)
    with pytest.raises(CheckpointError, match=f"lacks the tensor '{lacked}'"):
        vitzoo.create("vit_ti16", pretrained=tmp_path / "cut.npz", img_size=32, **OPTIONS)


def test_an_npz_that_is_no_checkpoint_is_refused_and_never_advises_pickles(tmp_path):
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))
    np.savez(tmp_path / "objects.npz", a=np.array([{"x": 1}], dtype=object))
    np.savez(tmp_path / "full.npz", a=np.zeros(1000))
    (tmp_path / "cut.npz").write_bytes((tmp_path / "full.npz").read_bytes()[:2000])
    (tmp_path / "random.npz").write_bytes(b"\x93NUMPY not really" * 4)
    for name, said in [("other", "not recognised"), ("objects", "holds Python objects"),
                       ("cut", "cut.npz is no .npz archive, or a damaged one"),
                       ("random", "random.npz is no .npz archive")]:
        with pytest.raises(CheckpointError, match=said) as err:
            vitzoo.from_pretrained(tmp_path / f"{name}.npz")
        assert "allow_pickle" not in str(err.value)
