"""Official .npz checkpoints: same logits as the official JAX model, strict loading, resampling;
an .npz that is not a checkpoint (empty, not a zip archive, pickled objects, cut short) says so.

The reference is `official_reference.py`, an independent Flax model with the official parameter
names; its checkpoints are perturbed at random, so zero-initialised parts (head, class token, gn3)
carry real values.
"""

import logging

import numpy as np
import pytest
import torch
from official_reference import make_checkpoint, official_logits

import vitzoo
from vitzoo.errors import CheckpointError

VIT = dict(hidden_size=32, num_layers=2, mlp_dim=64, num_heads=4, num_classes=7)
OPTIONS = dict(embed_dim=32, depth=2, mlp_dim=64, num_heads=4, num_classes=7)


def logits_close(model, params, fields, img_size, atol=1e-4):
    images = np.random.default_rng(1).standard_normal((2, 3, img_size, img_size)).astype(np.float32)
    expected = official_logits(params, images, **fields)
    with torch.no_grad():
        actual = model.eval()(torch.from_numpy(images)).double().numpy()
    assert np.abs(actual - expected).max() < atol, np.abs(actual - expected).max()


@pytest.mark.slow
@pytest.mark.parametrize(
    "fields, options",
    [
        ({"patch_size": 8, "classifier": "token"}, {"patch_size": 8}),
        ({"patch_size": 8, "classifier": "gap"}, {"patch_size": 8}),
        ({"patch_size": 8, "classifier": "token", "representation_size": 24}, {"patch_size": 8}),
        ({"patch_size": 1, "resnet_layers": (1, 1), "classifier": "token"},
         {"patch_size": 1, "stem": "resnet", "stem_options": {"layers": (1, 1)}}),
        ({"patch_size": 2, "resnet_layers": (), "classifier": "gap"},
         {"patch_size": 2, "stem": "resnet", "stem_options": {"layers": ()}}),
    ],
    ids=["token", "gap", "pre_logits", "r-hybrid", "root-only-hybrid"],
)
def test_logits_equal_the_official_model(tmp_path, fields, options):
    fields = {**VIT, **fields}
    path = tmp_path / "ckpt.npz"
    params = make_checkpoint(path, img_size=32, seed=3, **fields)
    model = vitzoo.create("vit_ti16", pretrained=path, img_size=32, **{**OPTIONS, **options})
    assert model.config.act == "gelu_tanh" and model.config.norm_eps == 1e-6
    assert model.config.pool == fields["classifier"]
    assert model.config.head_options.get("representation_size") == fields.get("representation_size")
    logits_close(model, params, fields, 32)


def test_groupnorm_parameters_stored_as_1x1x1xC_load_too(tmp_path):
    fields = {**VIT, "patch_size": 1, "resnet_layers": (1,)}
    params = make_checkpoint(tmp_path / "old.npz", img_size=32, groupnorm_4d=True, **fields)
    assert params["gn_root/scale"].shape == (1, 1, 1, 64)
    model = vitzoo.create("vit_ti16", pretrained=tmp_path / "old.npz", img_size=32, stem="resnet",
                          stem_options={"layers": (1,)}, patch_size=1, **OPTIONS)
    logits_close(model, params, fields, 32)


def test_odd_resolution_exercises_tf_same_padding(tmp_path):
    fields = {**VIT, "patch_size": 1, "resnet_layers": (1, 1)}
    params = make_checkpoint(tmp_path / "h.npz", img_size=48, seed=5, **fields)
    model = vitzoo.create("vit_ti16", pretrained=tmp_path / "h.npz", img_size=48, stem="resnet",
                          stem_options={"layers": (1, 1)}, patch_size=1, **OPTIONS)
    logits_close(model, params, fields, 48)


def test_another_resolution_resamples_position_embeddings_like_the_official_code(tmp_path):
    fields = {**VIT, "patch_size": 8}
    params = make_checkpoint(tmp_path / "c.npz", img_size=32, **fields)  # grid 4x4
    model = vitzoo.create("vit_ti16", pretrained=tmp_path / "c.npz", img_size=64, patch_size=8,
                          **OPTIONS)  # grid 8x8
    pos = params["Transformer/posembed_input/pos_embedding"][0]
    resampled = model.encoder.pos_embed.weight[0].detach().numpy()
    assert np.array_equal(resampled[0], pos[0])  # class-token embedding kept
    # official interpolate_posembed: scipy-style linear zoom of the grid (order 1) == align_corners
    grid = pos[1:].reshape(4, 4, -1)
    coords = np.linspace(0, 3, 8)
    lo, frac = np.minimum(np.floor(coords).astype(int), 2), None
    frac = coords - lo
    rows = grid[lo] * (1 - frac)[:, None, None] + grid[lo + 1] * frac[:, None, None]
    zoomed = rows[:, lo] * (1 - frac)[None, :, None] + rows[:, lo + 1] * frac[None, :, None]
    assert np.allclose(resampled[1:].reshape(8, 8, -1), zoomed, atol=1e-6)
    logits = model(torch.randn(1, 3, 64, 64))
    assert logits.shape == (1, 7)


def test_another_num_classes_replaces_the_head_saying_so(tmp_path, caplog):
    fields = {**VIT, "patch_size": 8, "representation_size": 24}
    make_checkpoint(tmp_path / "c.npz", img_size=32, **fields)
    with caplog.at_level(logging.WARNING, logger="vitzoo"):
        model = vitzoo.create("vit_ti16", pretrained=tmp_path / "c.npz", img_size=32, patch_size=8,
                              **{**OPTIONS, "num_classes": 3})
    assert "head replaced by a zero-initialised linear layer" in caplog.text
    assert model.config.head == "linear" and model.config.head_options == {}
    assert torch.count_nonzero(model.head.fc.weight) == 0 and model.head.fc.weight.shape == (3, 32)


def test_without_num_classes_the_checkpoint_decides_it(tmp_path):
    make_checkpoint(tmp_path / "c.npz", img_size=32, **{**VIT, "patch_size": 8, "num_classes": 11})
    model = vitzoo.create("vit_ti16", pretrained=tmp_path / "c.npz", img_size=32, patch_size=8,
                          embed_dim=32, depth=2, mlp_dim=64, num_heads=4)
    assert model.config.num_classes == 11


def test_strict_loading_lists_every_difference(tmp_path):
    make_checkpoint(tmp_path / "c.npz", img_size=32, **{**VIT, "patch_size": 8})
    with pytest.raises(CheckpointError) as err:
        vitzoo.create("vit_ti16", pretrained=tmp_path / "c.npz", img_size=32, patch_size=8,
                      **{**OPTIONS, "depth": 3, "mlp_dim": 48})
    message = str(err.value)
    assert "missing (12): encoder.blocks.2." in message  # one whole block
    assert "mis-shaped" in message
    assert "encoder.blocks.0.mlp.fc1.weight: checkpoint (64, 32) vs model (48, 32)" in message


def test_unknown_keys_are_reported_as_unexpected(tmp_path):
    params = make_checkpoint(tmp_path / "c.npz", img_size=32, **{**VIT, "patch_size": 8})
    np.savez(tmp_path / "extra.npz", **params,
             **{"Transformer/extra/kernel": np.zeros(3, np.float32)})
    with pytest.raises(CheckpointError, match=r"unexpected \(1\): Transformer/extra/kernel"):
        vitzoo.create("vit_ti16", pretrained=tmp_path / "extra.npz", img_size=32,
                      patch_size=8, **OPTIONS)


def test_strict_false_loads_what_fits(tmp_path):
    make_checkpoint(tmp_path / "c.npz", img_size=32, **{**VIT, "patch_size": 8})
    model = vitzoo.create("vit_ti16", pretrained=tmp_path / "c.npz", strict=False, img_size=32,
                          patch_size=8, **{**OPTIONS, "depth": 3})
    assert model.config.depth == 3


def test_a_conflicting_structural_option_is_refused(tmp_path):
    make_checkpoint(tmp_path / "c.npz", img_size=32,
                    **{**VIT, "patch_size": 8, "classifier": "gap"})
    with pytest.raises(vitzoo.ConfigError,
                       match="the checkpoint has pool='gap' but pool='token' was requested"):
        vitzoo.create("vit_ti16", pretrained=tmp_path / "c.npz", img_size=32, patch_size=8,
                      pool="token", **OPTIONS)


def test_an_npz_that_is_not_a_vit_checkpoint(tmp_path):
    np.savez(tmp_path / "x.npz", weights=np.zeros(3))
    with pytest.raises(CheckpointError, match="not an official ViT checkpoint"):
        vitzoo.create("vit_ti16", pretrained=tmp_path / "x.npz")
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        vitzoo.create("vit_ti16", pretrained=tmp_path / "missing.npz")


def test_an_incomplete_checkpoint_names_the_tensor_it_lacks(tmp_path):
    params = make_checkpoint(tmp_path / "c.npz", img_size=32, **{**VIT, "patch_size": 8})
    del params["Transformer/encoderblock_1/MlpBlock_3/Dense_0/bias"]
    np.savez(tmp_path / "incomplete.npz", **params)
    with pytest.raises(CheckpointError,
                       match=r"lacks the tensor "
                             r"'Transformer/encoderblock_1/MlpBlock_3/Dense_0/bias'"):
        vitzoo.create("vit_ti16", pretrained=tmp_path / "incomplete.npz", img_size=32,
                      patch_size=8, **OPTIONS)


def test_the_number_of_heads_is_read_from_the_attention_kernels(tmp_path):
    """An official q/k/v kernel is (D, heads, D/heads): without a model name, the heads come from it
    (here 2 heads of 16, not the D/64 default), and the logits are the official model's."""
    fields = {**VIT, "num_heads": 2, "patch_size": 8}
    params = make_checkpoint(tmp_path / "c.npz", img_size=32, **fields)
    model = vitzoo.from_pretrained(tmp_path / "c.npz")
    assert model.config.num_heads == 2
    logits_close(model, params, fields, 32)


def test_an_empty_npz_is_not_a_checkpoint(tmp_path):
    """An empty .npz file is a CheckpointError saying it is not a checkpoint (not a bare EOFError).
    """
    (tmp_path / "empty.npz").write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty.npz is not a checkpoint: the file is empty"):
        vitzoo.from_pretrained(tmp_path / "empty.npz")


@pytest.mark.parametrize("content", [b"random bytes here" * 10, b"\x93NUMPY not really" * 4])
def test_a_random_npz_is_not_a_checkpoint_and_pickles_are_never_advised(tmp_path, content):
    """An .npz that is not a zip archive is not a checkpoint; numpy's advice to allow pickles (an
    unsafe fix) is never passed on."""
    (tmp_path / "random.npz").write_bytes(content)
    with pytest.raises(CheckpointError,
                       match="is not a checkpoint: the file is not a zip archive") as err:
        vitzoo.from_pretrained(tmp_path / "random.npz")
    assert "pickle" not in str(err.value)


def test_an_npz_of_python_objects_is_not_a_checkpoint(tmp_path):
    """An .npz holding object arrays (pickled Python objects) is not a checkpoint; they are never
    loaded."""
    np.savez(tmp_path / "objects.npz", a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(CheckpointError,
                       match="not a checkpoint: it holds pickled Python objects, which vitzoo "
                             "never loads"):
        vitzoo.from_pretrained(tmp_path / "objects.npz")


def test_a_truncated_npz_is_damaged(tmp_path):
    """A zip archive cut short is reported as damaged or truncated."""
    np.savez(tmp_path / "full.npz", a=np.zeros(1000))
    data = (tmp_path / "full.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cut.npz is damaged or truncated"):
        vitzoo.from_pretrained(tmp_path / "cut.npz")
